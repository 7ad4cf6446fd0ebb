"""Elasticity: keyed state that moves between workers at logical times while the job runs.

* ``megaphone_fold``: a per-key fold whose bins migrate (Megaphone's F and S operators).
* ``plan``: the steps from one routing table to another (all-at-once, fluid, batched).

See docs/ARCHITECTURE.md ("Elasticity").
"""

from tokenflow.dataflow.operators.stateful import REMOVE
from tokenflow.rescale.megaphone import (
    STRATEGIES,
    Controller,
    MegaphoneHandle,
    Move,
    StepStats,
    megaphone_fold,
    plan,
)

__all__ = ["REMOVE", "STRATEGIES", "Controller", "MegaphoneHandle", "Move", "StepStats",
           "megaphone_fold", "plan"]
