"""Allocators moving data and progress between workers (layer 4 of docs/ARCHITECTURE.md).

An allocator gives a worker, per channel identifier, one pusher per peer and its own puller,
reports which channels received messages (``receive``), parks an idle worker (``park``) and
ends that park from another thread (``wake``).
"""

from tokenflow.comm.thread import ThreadAllocator, ThreadFabric

__all__ = ["ThreadAllocator", "ThreadFabric"]
