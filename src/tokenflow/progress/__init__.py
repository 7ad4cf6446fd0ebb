"""Progress tracking (layer 2 of docs/ARCHITECTURE.md): pointstamp counts, frontiers, reachability.

Source: notes on timely-dataflow's progress tracking (``progress/``); Naiad (SOSP 2013).
"""

from tokenflow.progress.antichain import Antichain, MutableAntichain
from tokenflow.progress.change_batch import ChangeBatch
from tokenflow.progress.location import Location, Source, Target
from tokenflow.progress.reachability import Builder, CycleError, Tracker

__all__ = [
    "Antichain",
    "Builder",
    "ChangeBatch",
    "CycleError",
    "Location",
    "MutableAntichain",
    "Source",
    "Target",
    "Tracker",
]
