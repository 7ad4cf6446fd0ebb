"""tokenflow: timely dataflow for Python, with workers on Apache Spark.

Layers (docs/ARCHITECTURE.md): ``order`` → ``progress`` → ``dataflow`` → ``comm`` → ``worker``/``execute``.
The common entry points are re-exported here::

    from tokenflow import execute

    def job(worker):
        input, probe = worker.dataflow(lambda scope: ...)
        ...

    execute(job, workers=2)
"""

from tokenflow.dataflow import (
    Broadcast,
    Capability,
    CapabilityError,
    CapabilityRef,
    CapabilitySet,
    Exchange,
    FrontierNotificator,
    InputHandle,
    OperatorBuilder,
    Pipeline,
    ProbeHandle,
    ProgressSafetyError,
    Scope,
    Stream,
)
from tokenflow.execute import WorkerError, execute
from tokenflow.order import Product
from tokenflow.progress import Antichain, ChangeBatch, MutableAntichain
from tokenflow.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "Antichain",
    "Broadcast",
    "Capability",
    "CapabilityError",
    "CapabilityRef",
    "CapabilitySet",
    "ChangeBatch",
    "Exchange",
    "FrontierNotificator",
    "InputHandle",
    "MutableAntichain",
    "OperatorBuilder",
    "Pipeline",
    "ProbeHandle",
    "Product",
    "ProgressSafetyError",
    "Scope",
    "Stream",
    "Worker",
    "WorkerError",
    "execute",
]
