"""``SharedProgress``: the progress information an operator shares with its scope.

Source: notes on timely-dataflow's ``progress/`` ("SharedProgress", "Frontier Propagation").
"""

from __future__ import annotations

from typing import Any

from tokenflow.progress.change_batch import ChangeBatch


class SharedProgress:
    """Per-port ``ChangeBatch``es exchanged between a child operator and its scope.

    * ``frontiers[i]`` — written by the scope: changes to input ``i``'s frontier.
    * ``consumeds[i]`` — written by the child: records consumed at input ``i`` per time.
    * ``internals[o]`` — written by the child: capability changes at output ``o``.
    * ``produceds[o]`` — written by the child: records produced at output ``o`` per time.
    """

    __slots__ = ("frontiers", "consumeds", "internals", "produceds")

    def __init__(self, inputs: int, outputs: int) -> None:
        self.frontiers: list[ChangeBatch[Any]] = [ChangeBatch() for _ in range(inputs)]
        self.consumeds: list[ChangeBatch[Any]] = [ChangeBatch() for _ in range(inputs)]
        self.internals: list[ChangeBatch[Any]] = [ChangeBatch() for _ in range(outputs)]
        self.produceds: list[ChangeBatch[Any]] = [ChangeBatch() for _ in range(outputs)]
