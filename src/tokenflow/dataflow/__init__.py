"""Dataflows (layer 3 of docs/ARCHITECTURE.md): scopes, streams, timestamp tokens, operators.

Source: the timestamp-tokens paper §3–§5 (Lattuada, McSherry et al., *Timestamp tokens: a better
coordination primitive for data-processing systems*, 2022).
"""

from tokenflow.dataflow.capability import Capability, CapabilityError, CapabilityRef, CapabilitySet
from tokenflow.dataflow.channels import Broadcast, Exchange, Pipeline
from tokenflow.dataflow.input import InputHandle
from tokenflow.dataflow.notificator import FrontierNotificator
from tokenflow.dataflow.operators.builder import (
    OperatorBuilder,
    OperatorInput,
    OperatorOutput,
    ProgressSafetyError,
)
from tokenflow.dataflow.operators.probe import ProbeHandle
from tokenflow.dataflow.scope import Scope
from tokenflow.dataflow.stream import Stream

__all__ = [
    "Broadcast",
    "Capability",
    "CapabilityError",
    "CapabilityRef",
    "CapabilitySet",
    "Exchange",
    "FrontierNotificator",
    "InputHandle",
    "OperatorBuilder",
    "OperatorInput",
    "OperatorOutput",
    "Pipeline",
    "ProbeHandle",
    "ProgressSafetyError",
    "Scope",
    "Stream",
]
