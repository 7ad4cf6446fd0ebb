"""Publish/subscribe of streams with epoch atomicity (the Strymon protocol, and beyond it).

* ``Stream.publish(topic)`` / ``publish``: every worker serves its partition of a stream.
* ``Catalog``: the job's topics -> partitions -> addresses (on the driver).
* ``Subscription``: a plain client, an iterator of whole epochs ``(time, RecordBatch)``.
* ``Scope.subscribe(url, topic)`` / ``subscribe_source``: another job's topic as a source.

See docs/ARCHITECTURE.md ("Publish/subscribe") and docs/SECURITY.md ("Publish/subscribe endpoints").
"""

from tokenflow.pubsub.catalog import Catalog, lookup
from tokenflow.pubsub.publisher import Publisher, publish
from tokenflow.pubsub.source import subscribe as subscribe_source
from tokenflow.pubsub.subscriber import Epoch, Snapshot, Subscription, subscribe
from tokenflow.pubsub.wire import AuthenticationError, ProtocolError, new_token

__all__ = ["AuthenticationError", "Catalog", "Epoch", "ProtocolError", "Publisher", "Snapshot",
           "Subscription", "lookup", "new_token", "publish", "subscribe", "subscribe_source"]
