"""Fig. 8's cause, on the progress tracker alone: the cost of one frontier change at the head of
a chain of idle operators, by chain length, when the chain's operators do not ``notify`` (the
tracker maintains no frontier for them: Fig. 8's no-ops) and when they all do (every port's
frontier maintained, as every port's was before the tracker kept frontiers only where they are
watched).

The scope: an input (its token at the head), ``n`` one-input one-output operators with the
identity summary, and a sink that notifies.  The input's token is downgraded ``EPOCHS`` times
(each a frontier change that reaches the sink); µs per change, wall clock, the least of
``ROUNDS`` rounds.

Writes ``benchmarks/results/evaluation_tracker.{md,png,json}``; ``--quick``: fewer changes, to a
temporary directory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.evaluation.harness import (  # noqa: E402
    header,
    load_end,
    log,
    machine,
    run_script,
    table,
)
from tokenflow.order import Increment  # noqa: E402
from tokenflow.progress import Antichain, Builder, Source, Target  # noqa: E402

LENGTHS = [8, 16, 32, 64, 128, 256]
EPOCHS = 2_000
ROUNDS = 3


def per_change(length: int, notify: bool, epochs: int) -> float:
    """µs per frontier change at the head of a chain of ``length`` operators."""
    builder = Builder()
    builder.add_node(0, 0, 1, [], name="input", notify=False)
    for node in range(1, length + 1):
        builder.add_node(node, 1, 1, [[Antichain([Increment(0)])]], name=f"noop{node}",
                         notify=notify)
        builder.add_edge(Source(node - 1, 0), Target(node, 0))
    builder.add_node(length + 1, 1, 0, [[]], name="sink")
    builder.add_edge(Source(length, 0), Target(length + 1, 0))
    tracker, _ = builder.build()
    head = Source(0, 0)
    tracker.update_source(head, 0, 1)
    tracker.propagate_all()
    tracker.pushed().drain()
    start = time.perf_counter()
    for t in range(epochs):
        tracker.update_source(head, t + 1, 1)
        tracker.update_source(head, t, -1)
        tracker.propagate_all()
        tracker.pushed().drain()
    return (time.perf_counter() - start) / epochs * 1e6


def measure(quick: bool) -> dict[str, Any]:
    started = machine()
    epochs = 200 if quick else EPOCHS
    rows = []
    for n in LENGTHS:
        for notify in (False, True):
            us = min(per_change(n, notify, epochs) for _ in range(ROUNDS))
            rows.append({"length": n, "notify": notify, "us": us})
            log(f"{n:>4} operators, notify={notify!s:<5} {us:8.1f} µs per frontier change")
    return {"machine": started, "load_end": load_end(), "quick": quick, "rows": rows,
            "epochs": epochs}


def find(rows: list[dict[str, Any]], n: int, notify: bool) -> float:
    return float(next(r["us"] for r in rows if r["length"] == n and r["notify"] == notify))


def report(data: dict[str, Any]) -> str:
    rows = data["rows"]
    body = [[str(n), f"{find(rows, n, False):.1f}", f"{find(rows, n, True):.1f}"]
            for n in LENGTHS]
    return "\n".join([
        "# Evaluation, Fig. 8's cause: a frontier change on the progress tracker alone", "",
        header(data), "",
        "A token at the head of a chain of *n* idle operators ending in an operator that "
        f"notifies, downgraded {data['epochs']:,} times; µs per frontier change, wall clock, the "
        f"least of {ROUNDS} rounds (see `benchmarks/evaluation/tracker.py`).  *not notifying*: "
        "the chain's operators do not `notify`, as Fig. 8's no-ops, so the tracker maintains no "
        "frontier for them; *notifying*: every operator notifies, so every port's frontier is "
        "maintained (the work the tracker did for every chain before it kept frontiers only "
        "where they are watched).", "",
        table(["idle operators", "not notifying µs", "notifying µs"], body), "",
        "![µs per frontier change vs chain length](evaluation_tracker.png)", ""])


def plot(data: dict[str, Any], path: Path) -> None:
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for notify, label in ((False, "operators do not notify"), (True, "operators notify")):
        ax.plot(LENGTHS, [find(rows, n, notify) for n in LENGTHS], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("idle operators in the chain")
    ax.set_ylabel("µs per frontier change")
    ax.set_title("Progress tracker alone")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    run_script("evaluation_tracker", __doc__, measure, report, plot)
