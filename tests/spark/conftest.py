"""Spark tests: the ``spark`` fixture and marker are in tests/conftest.py; this puts
``examples/`` on ``sys.path`` (the differential tests import the examples)."""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
if EXAMPLES not in sys.path:  # the examples directory is not a package
    sys.path.insert(0, EXAMPLES)
