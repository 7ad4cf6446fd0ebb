"""Crash points: where fault-injection trials SIGKILL a process at an exact moment.

Source: the recovery issue's kill trials ("a SIGKILL during a checkpoint write, during a sink
commit"); the idea of named fault points compiled into the product (FoundationDB's
simulation "buggify" points, Jepsen-style nemeses).

A trial sets the environment variable ``TOKENFLOW_CRASH`` to ``point=path[,point=path...]``
before the job starts (worker processes inherit it).  The first process of the job that
reaches ``crash_point(point)`` while ``path`` exists removes ``path`` (so exactly one process
crashes, once, across restarts) and kills itself with SIGKILL: no ``finally`` block, no
flush, no atexit handler runs, as in a real crash.  Without the variable a crash point costs
one dictionary lookup.

Points: ``snapshot.part`` (a worker's part: after its blob file, before its index),
``snapshot.commit`` (the driver, before a checkpoint's manifest), ``parquet.commit`` (the
sink's committer, after moving an epoch's files in, before the rename that commits it),
``megaphone.move`` (a migrating operator's old owner, after taking a moving bin's state out
of its own, before sending it: the state is in flight, held by no worker), ``checkpoint.align``
(a worker in an aligned checkpoint whose sources hold at the checkpoint's epoch, its barrier
up, before its capture: ``tokenflow.control``), ``checkpoint.resumed`` (a worker right after
its aligned capture, its sources resumed and its part not yet written, other workers possibly
still aligning).
"""

from __future__ import annotations

import os
import signal

ENV = "TOKENFLOW_CRASH"
POINTS = ("snapshot.part", "snapshot.commit", "parquet.commit", "megaphone.move", "checkpoint.align",
          "checkpoint.resumed")

_armed: dict[str, str] | None = None


def _parse(text: str) -> dict[str, str]:
    """``"a=/x,b=/y"`` -> ``{"a": "/x", "b": "/y"}``.

    Raises:
        ValueError: an entry without ``=`` or an unknown point.
    """
    out = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        point, sep, path = entry.partition("=")
        if not sep or point not in POINTS or not path:
            raise ValueError(f"{ENV}: bad entry {entry!r}; expected point=path with a point "
                             f"of {', '.join(POINTS)}")
        out[point] = path
    return out


def crash_point(point: str) -> None:
    """SIGKILL this process if ``point`` is armed and its trigger file exists (removing it)."""
    global _armed
    if _armed is None:
        _armed = _parse(os.environ.get(ENV, ""))
    path = _armed.get(point)
    if path is None:
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["ENV", "POINTS", "crash_point"]
