"""``subscribe``: a dataflow source reading a published topic of another job.

Source: the Strymon publish/subscribe protocol ("the subscriber might maintain a copy of the
current lower frontier in order to derive the capability set for downstream operators").  One
worker (``worker=0`` by default) holds the subscription: it emits every complete epoch at the
epoch's own time, as Arrow record batches, and downgrades its token to the subscription's lower
frontier after each, so downstream operators see the publisher's frontier.  The other workers
drop their token at once; exchange the stream to spread it.  Integer times only (a dataflow's
root scope counts epochs with ``int``).  With ``start="snapshot"`` the snapshot's rows come
first, at the source's first time (0), then the epochs after it.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

from tokenflow.pubsub.subscriber import Snapshot, Subscription

if TYPE_CHECKING:
    from tokenflow.dataflow.scope import Scope
    from tokenflow.dataflow.stream import Stream


def subscribe(scope: Scope, url: str, topic: str, token: str | None = None, *,
              start: str = "latent", since: list[Any] | None = None, worker: int = 0,
              name: str | None = None, **options: Any) -> Stream:
    """A stream of ``topic``'s epochs (``pyarrow.RecordBatch`` batches at each epoch's time).

    Args:
        url, topic, token, start, since, options: as for ``Subscription``.
        worker: the worker that holds the subscription.

    Raises (from the worker's step, naming the operator):
        RuntimeError: the subscription failed (catalog, token, a publisher gone, a time that is
            not an ``int``).
    """
    from tokenflow.dataflow.operators.generic import source

    op = name or f"Subscribe[{topic}]"

    def constructor(cap: Any, info: Any) -> Any:
        if info.worker_index != worker % info.peers:
            cap.drop()
            return lambda output: None
        events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()

        def run() -> None:
            try:
                with Subscription(url, topic, token, start=start, since=since, **options) as sub:
                    for item in sub:
                        if isinstance(item, Snapshot):
                            if item.batch is not None:
                                events.put(("snapshot", None, item.batch, None))
                        else:
                            events.put(("epoch", item.time, item.batch, sub.position))
                        info.activate()
                events.put(("done",))
            except BaseException as exc:  # noqa: BLE001 - handed to the worker's step
                events.put(("error", exc))
            info.activate()

        threading.Thread(target=run, daemon=True, name=f"tokenflow-{op}").start()
        held: list[Any] = [cap]

        def logic(output: Any) -> None:
            while held:
                try:
                    event = events.get_nowait()
                except queue.Empty:
                    return
                if event[0] == "error":
                    held.pop().drop()
                    raise RuntimeError(f"{op} on worker {info.worker_index}: {event[1]}") from event[1]
                if event[0] == "done":
                    held.pop().drop()
                    return
                kind, time, batch, position = event
                if kind == "snapshot":  # before every epoch: at the token's (earliest) time
                    output.give_batch(held[0], batch)
                    continue
                if time.__class__ is not int:
                    raise RuntimeError(f"{op}: topic {topic!r} has {type(time).__name__} times "
                                       f"({time!r}); a dataflow source needs int times")
                output.give_batch(held[0], batch, time=time)
                if position:
                    low = min(position)
                    if low > held[0].time:
                        held[0].downgrade(low)

        return logic

    return source(scope, op, constructor)
