"""Partial orders, timestamps and path summaries (layer 1 of docs/ARCHITECTURE.md).

Timestamps are plain Python ``int`` (a total order) or :class:`Product` (the product partial
order, used for iteration scopes).  Python's ``<``/``<=`` on timestamps is a *total* order that
extends the partial order (lexicographic for ``Product``, as timely's ``Ord``); the partial order
itself is :func:`less_equal` / :func:`less_than`.
"""

from tokenflow.order.partial_order import PartialOrder, less_equal, less_than, minimum
from tokenflow.order.product import Product
from tokenflow.order.summary import (
    MAX_TIME,
    Increment,
    PathSummary,
    ProductSummary,
    identity_summary,
    is_identity,
)

__all__ = [
    "MAX_TIME",
    "Increment",
    "PartialOrder",
    "PathSummary",
    "Product",
    "ProductSummary",
    "identity_summary",
    "is_identity",
    "less_equal",
    "less_than",
    "minimum",
]
