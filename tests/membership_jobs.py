"""The running word count the membership tests scale (shared by ``tests/rescale``): a
Megaphone fold over words fed by the workers the job started with, one epoch per ``pace``
seconds, and its oracle (``running_counts`` over what every worker reports it fed)."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

from running_counts import running_counts

from tokenflow.dataflow.capability import CapabilityError
from tokenflow.rescale import megaphone_fold

FEEDERS = 2
"""Workers the job starts with; they feed every epoch."""


def words(worker: int, epoch: int) -> list[str]:
    """Worker ``worker``'s 30 Zipf-like words of epoch ``epoch`` (fixed seed)."""
    rng = random.Random(worker * 1000 + epoch)
    return [f"w{int(rng.paretovariate(1.2)) % 50}" for _ in range(30)]


def counting(scope: Any) -> tuple[Any, Any]:
    """``(input, handle)``: a ``megaphone_fold`` of running counts per word over a new input
    of words (``handle.stream`` carries ``(word, running count)`` records)."""
    inp, stream = scope.new_input()
    handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                            lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]))
    return inp, handle


def word_count(pace: float, epochs: int = 60, joiner_epochs: int = 0) -> Any:
    """The worker function.  Workers started with the job feed epochs ``0..epochs-1``, one
    per ``pace`` s; a joined worker (``worker.joining``), with ``joiner_epochs``, waits for its
    input's lent token (``add_worker(inputs=True)``) and feeds that many epochs from the lent
    one, else tries to send (recording the error) and closes its input.

    Returns per worker: ``out`` (running counts by time), ``fed`` (epochs it fed), ``moved``
    (bins per migration step), ``keys`` (keys it holds at the end), ``joined``, ``left``,
    ``error`` (a joined worker's send without a token) and, on worker 0, ``changes``: the
    ``(roster, owners)`` of every routing-table change."""

    def run(worker: Any) -> dict[str, Any]:
        def build(scope: Any) -> Any:
            inp, handle = counting(scope)
            return inp, handle, handle.stream.capture()

        inp, handle, capture = worker.dataflow(build)
        joined = worker.joining
        error = None
        feed: range = range(epochs)
        if joined and joiner_epochs:
            worker.step_while(lambda: not inp.ready)
            start = inp.time
            feed = range(0) if inp.closed else range(start, min(start + joiner_epochs, epochs))
        elif joined:
            try:
                inp.send("x")
            except CapabilityError as exc:
                error = str(exc)
            feed = range(0)
        for e in feed:
            for w in words(worker.index, e):
                inp.send(w)
            inp.advance_to(e + 1)
            deadline = time.monotonic() + pace
            while time.monotonic() < deadline:
                worker.step_or_park(0.005)
        inp.close()
        worker.step_until_done()
        changes = [(list(table.roster), table.owners.tolist()) for _, table
                   in handle.controller.changes] if worker.index == 0 else []
        return {"out": capture.by_time(), "fed": list(feed), "moved": [s.bins for s in handle.moved],
                "keys": len(handle.state.data), "joined": joined, "left": worker.left,
                "error": error, "changes": changes}

    return run


def merged(results: list[Any]) -> dict[int, Counter[Any]]:
    """Every worker's running counts together, by time."""
    out: dict[int, Counter[Any]] = {}
    for r in results:
        if r is not None:
            for t, records in r["out"].items():
                out.setdefault(t, Counter()).update(records)
    return out


def oracle(results: list[Any], epochs: int = 60) -> dict[int, Counter[Any]]:
    """Running counts over what every worker reports it fed, epoch by epoch."""
    fed = [(index, set(r["fed"])) for index, r in enumerate(results) if r is not None]
    return running_counts([w for worker, got in fed if e in got for w in words(worker, e)]
                          for e in range(epochs))
