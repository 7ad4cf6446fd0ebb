"""Dataflows (layer 3 of DESIGN.md): scopes, streams, timestamp tokens, operators.

Source: timestamp-tokens-paper.md §3–§5.
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
