"""What the benchmark scripts say about the code they measured (imported by them; running
this file does nothing)."""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def provenance() -> str:
    """Where ``tokenflow`` was imported from, its git commit and the files of ``src/`` with
    uncommitted changes (other work in the same tree can change what is measured); named
    relative to the repository, never by a machine path."""
    import tokenflow

    src = Path(tokenflow.__file__).resolve().parents[1]
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=src, capture_output=True, text=True,
                                  check=True).stdout

        commit = git("rev-parse", "--short", "HEAD").strip()
        dirty = [line[3:] for line in git("status", "--porcelain", "--", ".").splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        return "tokenflow imported from an installed copy (not a git checkout)."
    changed = ", ".join(f"`{d}`" for d in dirty) if dirty else "none"
    return (f"tokenflow imported from this repository's `src/` at commit {commit}; uncommitted "
            f"changes under it: {changed}.")


@contextmanager
def exported(rev: str) -> Iterator[Path]:
    """``src/`` of commit ``rev``, exported with ``git archive`` into a temporary directory (for
    a before/after comparison in one sitting: run a child with ``PYTHONPATH`` set to it)."""
    with tempfile.TemporaryDirectory(prefix="tokenflow-src-") as tmp:
        data = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, check=True,
                              capture_output=True).stdout
        path = Path(tmp) / "archive.tar"
        path.write_bytes(data)
        with tarfile.open(path) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp) / "src"
