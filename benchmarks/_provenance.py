"""What the benchmark scripts say about the code they measured (imported by them; running
this file does nothing)."""

from __future__ import annotations

import subprocess
from pathlib import Path


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
