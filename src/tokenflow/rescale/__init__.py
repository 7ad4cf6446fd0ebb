"""Elasticity: keyed state that moves between workers at logical times while the job runs.

* ``megaphone_fold``: a per-key fold whose bins migrate (Megaphone's F and S operators).
* ``migrating_operator`` / ``keyed_operator``: Megaphone's router in front of any operator
  whose state is a ``BinnedState`` keyed by its inputs' exchange columns (the NEXMark
  queries q4, q5 and q8 with ``elastic``).
* ``plan``: the steps from one routing table to another (all-at-once, fluid, batched).
* ``tokenflow.rescale.remote``: the driver's schedule and ``tokenflow scale`` requests;
  ``tokenflow.rescale.report``: what each table change moved.

See docs/ARCHITECTURE.md ("Elasticity").
"""

from tokenflow.dataflow.operators.stateful import REMOVE
from tokenflow.rescale.megaphone import (
    STRATEGIES,
    Controller,
    DataEndedError,
    MegaphoneHandle,
    MigrationHandle,
    Move,
    StepStats,
    megaphone_fold,
    plan,
)
from tokenflow.rescale.migrate import Elastic, LeastToken, keyed_operator, migrates, migrating_operator

__all__ = ["REMOVE", "STRATEGIES", "Controller", "DataEndedError", "Elastic", "LeastToken", "MegaphoneHandle",
           "MigrationHandle", "Move", "StepStats", "keyed_operator", "megaphone_fold", "migrates",
           "migrating_operator", "plan"]
