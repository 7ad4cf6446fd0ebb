"""``Scope``: where a dataflow's operators are declared (the root scope or an iteration scope).

Source: notes on timely-dataflow's ``progress/`` ("Subgraph"); timely's ``dataflow/scopes``.  A
scope wraps the ``SubgraphBuilder`` that will become a ``Subgraph`` and knows its worker, its
timestamp shape (``min_time``) and the identity path summary of that shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tokenflow.order.product import Product
from tokenflow.order.summary import Increment, ProductSummary
from tokenflow.progress.location import Location
from tokenflow.progress.operate import Operate
from tokenflow.progress.subgraph import SubgraphBuilder

if TYPE_CHECKING:
    from tokenflow.dataflow.input import InputHandle
    from tokenflow.dataflow.stream import Stream

R = TypeVar("R")


class Scope:
    """A dataflow scope under construction.

    Attributes:
        worker: the worker building it (``index``, ``peers``, channel allocation).
        path: the scope's path of child indices from the worker.
        min_time: the least timestamp of the scope (``0`` or ``Product(…, 0)``).
        identity: the identity path summary for the scope's timestamps.
    """

    def __init__(
        self,
        worker: Any,
        builder: SubgraphBuilder,
        min_time: Any = 0,
        identity: Any = None,
        parent: Scope | None = None,
        index: int = 0,
    ) -> None:
        self.worker = worker
        self.builder = builder
        self.min_time = min_time
        self.identity = identity if identity is not None else Increment(0)
        self.parent = parent
        self.index = index

    @property
    def path(self) -> tuple[int, ...]:
        return self.builder.path

    @property
    def name(self) -> str:
        return self.builder.name

    @property
    def peers(self) -> int:
        return int(self.worker.peers)

    @property
    def worker_index(self) -> int:
        return int(self.worker.index)

    def allocate_child_id(self) -> int:
        return self.builder.allocate_child_id()

    def add_operator(self, operator: Operate, index: int) -> None:
        self.builder.add_child(operator, index)

    def new_identifier(self) -> int:
        return int(self.worker.new_identifier())

    def connect(self, source: Location, target: Location, weight: int = 1,
                per_worker: bool = False) -> None:
        self.builder.connect(source, target, weight, per_worker)

    # -- conveniences ----------------------------------------------------------------------

    def new_input(self, name: str = "Input") -> tuple[InputHandle, Stream]:
        """A dataflow input fed from worker code: ``(handle, stream)``."""
        from tokenflow.dataflow.input import new_input

        return new_input(self, name)

    def subscribe(self, url: str, topic: str, token: str | None = None, **options: Any) -> Stream:
        """A source of ``topic`` published by another job (catalog at ``url``): whole epochs
        as Arrow record batches at their own (``int``) times, on worker 0; ``options`` and
        errors as for ``tokenflow.pubsub.subscribe_source``.

        Delegates to ``tokenflow.pubsub.subscribe_source`` (looked up by name: that layer is
        above this one).
        """
        import importlib

        module = importlib.import_module("tokenflow.pubsub")
        return module.subscribe_source(self, url, topic, token, **options)  # type: ignore[no-any-return]

    def iterative(self, build: Callable[[Scope], R], name: str = "Iterative") -> R:
        """Build a nested scope with ``Product(outer, iteration)`` times.

        ``build(inner)`` declares the loop: bring streams in with ``stream.enter(inner)``, make
        loop edges with ``inner.feedback(1)`` / ``stream.connect_loop(handle)``, and take
        results out with ``stream.leave()``.
        """
        index = self.allocate_child_id()
        builder = SubgraphBuilder(
            name,
            self.path + (index,),
            ProductSummary(self.identity, Increment(0)),
            to_inner=lambda t: Product(t, 0),
            to_outer=lambda t: t[0],
            summarize=lambda s: s.outer,
        )
        inner = Scope(
            self.worker,
            builder,
            Product(self.min_time, 0),
            ProductSummary(self.identity, Increment(0)),
            parent=self,
            index=index,
        )
        result = build(inner)
        progcaster = self.worker.progcaster(inner.path, name)
        subgraph = builder.build(progcaster, self.worker.activations)
        self.add_operator(subgraph, index)
        return result

    def feedback(self, summary: Any = 1) -> tuple[Any, Stream]:
        """A loop edge: ``(handle, stream)``; close it with ``stream.connect_loop(handle)``.

        ``summary`` is an ``int`` (iterations added to the inner coordinate) or a path summary.
        """
        from tokenflow.dataflow.operators.iterate import feedback

        return feedback(self, summary)

    def __repr__(self) -> str:
        return f"Scope({self.name!r}, path={self.path})"
