"""examples/window_average.py (paper §5) against a plain-Python windowed average."""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import networkx as nx
import pytest

pytestmark = pytest.mark.timeout(30)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "window_average.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("window_average_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_averages(window: int) -> dict[int, float]:
    """Edge i (networkx edge order) at time i; average weight per window, keyed by window end."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, (_, _, attrs) in enumerate(nx.les_miserables_graph().edges(data=True)):
        groups[(i // window + 1) * window].append(attrs["weight"])
    return {end: sum(ws) / len(ws) for end, ws in groups.items()}


@pytest.mark.parametrize(("workers", "window"), [(1, 10), (2, 10), (2, 7)])
def test_window_average_matches_plain_python(workers: int, window: int) -> None:
    result = load_example().main(workers=workers, window=window)
    expected = expected_averages(window)
    assert len(expected) == -(-254 // window)  # 254 edges, the last window partial
    assert list(result) == sorted(expected)
    assert result == pytest.approx(expected)


def test_window_average_rejects_bad_window() -> None:
    module = load_example()
    with pytest.raises(ValueError, match="window must be > 0"):
        module.window_average(None, 0)
