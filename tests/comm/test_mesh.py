"""The TCP mesh between real worker processes (``execute(..., runtime="process")``).

* Stray connections — no job secret, a wrong job, a 1 GiB length prefix — are refused and
  logged by the workers while the job goes on and produces the right output.
* ``max_frame`` smaller than a data frame fails the job naming the sending peer (no hang).
* A worker killed by SIGKILL, or raising, fails the job with ``WorkerError`` naming it.
* The same dataflow gives the same output on the ``thread`` and ``process`` runtimes with
  1, 2 and 3 workers, equal to a plain-Python computation of it.

Worker processes cost ~1.5-2.5 s each to start, so the jobs here are few and small.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import msgpack
import pyarrow as pa
import pytest

from tokenflow import WorkerError, execute
from tokenflow.comm.auth import AuthenticationError, connect_handshake
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, unary_frontier
from tokenflow.dataflow.stream import Stream
from tokenflow.worker import Worker

# Jobs travel to the worker processes by value: the children need not import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT = 60.0  # seconds: a hanging job fails instead of blocking the suite
EPOCHS = 6


# -- the dataflow and its independent expectation ----------------------------------------------


def records(epoch: int) -> list[tuple[str, int]]:
    """All input records of ``epoch`` (each worker sends those with ``r % peers == index``)."""
    return [(f"k{(epoch * 7 + r) % 5}", r) for r in range(30 + 3 * epoch)]


def arrow_records(epoch: int) -> list[tuple[int, int]]:
    return [((r * 13 + epoch) % 7, r) for r in range(25 + epoch)]


def expected_output() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Per epoch and key: the count and the sum of ``3 r + 1`` (list path) / of ``r`` (Arrow
    path), computed with plain loops."""
    lists: list[tuple[Any, ...]] = []
    arrows: list[tuple[Any, ...]] = []
    for epoch in range(EPOCHS):
        count: Counter[Any] = Counter()
        total: Counter[Any] = Counter()
        for key, r in records(epoch):
            count[key] += 1
            total[key] += 3 * r + 1
        lists += [(epoch, k, count[k], total[k]) for k in count]
        count, total = Counter(), Counter()
        for key, r in arrow_records(epoch):
            count[key] += 1
            total[key] += r
        arrows += [(epoch, k, count[k], total[k]) for k in count]
    return sorted(lists), sorted(arrows)


def count_per_epoch(stream: Stream, pact: Any, name: str) -> Stream:
    """``(key, count, sum)`` per key and epoch, once the input frontier passed the epoch.
    Records are ``(key, value)`` tuples or rows of Arrow batches with ``key`` / ``value``."""

    def constructor(capability: Any, info: OperatorInfo) -> Callable[..., None]:
        capability.drop()
        pending: dict[Any, tuple[Any, dict[Any, list[int]]]] = {}

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for ref, batch in inp:
                entry = pending.get(ref.time)
                if entry is None:
                    entry = pending[ref.time] = (ref.retain(), defaultdict(lambda: [0, 0]))
                rows = ([(row["key"], row["value"]) for row in batch.to_pylist()]
                        if isinstance(batch, pa.RecordBatch) else batch)
                for key, value in rows:
                    acc = entry[1][key]
                    acc[0] += 1
                    acc[1] += value
            for t in sorted(t for t in pending if not inp.frontier.less_equal(t)):
                cap, acc = pending.pop(t)
                out.give_batch(cap, [(k, c, s) for k, (c, s) in acc.items()])
                cap.drop()

        return logic

    return unary_frontier(stream, pact, name, constructor)


def flatten(events: list[tuple[Any, list[Any]]]) -> list[tuple[Any, ...]]:
    return sorted((time, *rec) for time, batch in events for rec in batch)


def run_epochs(worker: Worker, handles: Any, epochs: range) -> None:
    lists, arrows, probe = handles
    index, peers = worker.index, worker.peers
    for epoch in epochs:
        lists.send_batch([rec for rec in records(epoch) if rec[1] % peers == index])
        mine = [rec for rec in arrow_records(epoch) if rec[1] % peers == index]
        arrows.send_batch(pa.RecordBatch.from_pydict({
            "key": pa.array([k for k, _ in mine], pa.int64()),
            "value": pa.array([v for _, v in mine], pa.int64()),
        }))
        lists.advance_to(epoch + 1)
        arrows.advance_to(epoch + 1)
        worker.step_while(lambda e=epoch + 1: probe.less_than(e))


def build_dataflow(worker: Worker) -> tuple[Any, Any]:
    """input -> map -> exchange by key -> per-epoch count -> capture, for list batches and for
    Arrow batches (exchanged by column); one probe over both."""

    def build(scope: Any) -> tuple[Any, Any]:
        lists, s = scope.new_input("Lists")
        arrows, a = scope.new_input("Arrows")
        counted = count_per_epoch(s.map(lambda kv: (kv[0], 3 * kv[1] + 1)),
                                  Exchange(key=lambda kv: kv[0]), "CountLists")
        counted_arrow = count_per_epoch(a, Exchange(column="key"), "CountArrows")
        probe = counted.concat(counted_arrow).probe()
        return (lists, arrows, probe), (counted.capture(), counted_arrow.capture())

    return worker.dataflow(build)  # type: ignore[no-any-return]


def differential_job(worker: Worker) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    handles, (cap_lists, cap_arrows) = build_dataflow(worker)
    run_epochs(worker, handles, range(EPOCHS))
    handles[0].close()
    handles[1].close()
    worker.step_until_done()
    return flatten(cap_lists.events), flatten(cap_arrows.events)


def merged(results: list[Any]) -> tuple[list[Any], list[Any]]:
    return (sorted(r for res in results for r in res[0]),
            sorted(r for res in results for r in res[1]))


def no_worker_processes_left() -> bool:
    return not [p for p in mp.active_children() if p.name.startswith("tokenflow-worker")]


# -- differential: thread vs process -----------------------------------------------------------


def test_expected_output_is_not_trivial() -> None:
    lists, arrows = expected_output()
    assert len({k for _, k, _, _ in lists}) == 5 and len({k for _, k, _, _ in arrows}) == 7
    assert {e for e, *_ in lists} == set(range(EPOCHS))


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_thread_and_process_agree(workers: int) -> None:
    expected = expected_output()
    on_threads = execute(differential_job, workers=workers)
    on_processes = execute(differential_job, workers=workers, runtime="process", timeout=TIMEOUT)
    assert merged(on_threads) == expected
    assert merged(on_processes) == expected
    assert on_processes == on_threads, "each worker owns the same keys on both runtimes"
    if workers > 1:
        assert all(res[0] for res in on_processes), "every worker counted some keys"


# -- stray connections are refused and logged --------------------------------------------------


def probe_worker(address: tuple[str, int], job: str, worker: int) -> dict[str, str]:
    """Four unwelcome connections to ``worker``; how each one ended, seen from the client."""
    outcomes: dict[str, str] = {}

    def attempt(name: str, fn: Callable[[socket.socket], Any]) -> None:
        sock = socket.create_connection(address, timeout=5)
        try:
            fn(sock)
            # the worker must hang up: reading gets EOF or a reset, never a timeout
            outcomes[name] = "closed" if sock.recv(1 << 16) == b"" else "data"
        except (ConnectionResetError, BrokenPipeError, EOFError):
            outcomes[name] = "closed"
        except AuthenticationError as exc:
            outcomes[name] = f"AuthenticationError: {exc}"
        except TimeoutError:
            outcomes[name] = "timeout"
        finally:
            sock.close()

    def hs(obj: dict[str, Any]) -> bytes:
        payload = msgpack.packb(obj)
        return b"tF\x10\x00" + bytes(4) + len(payload).to_bytes(8, "big") + payload

    def hs_read(sock: socket.socket) -> dict[str, Any]:
        head = sock.recv(16, socket.MSG_WAITALL)
        if len(head) < 16:
            raise EOFError
        n = int.from_bytes(head[8:], "big")
        return msgpack.unpackb(sock.recv(n, socket.MSG_WAITALL))  # type: ignore[no-any-return]

    def wrong_mac(sock: socket.socket) -> None:
        sock.sendall(hs({"v": 2, "job": job, "worker": 5, "nonce": os.urandom(16)}))
        hs_read(sock)
        sock.sendall(hs({"mac": os.urandom(32)}))
        hs_read(sock)

    attempt("wrong-secret", lambda s: connect_handshake(s, b"not the secret", job, 5, worker))
    attempt("wrong-mac", wrong_mac)
    attempt("wrong-job", lambda s: connect_handshake(s, b"not the secret", "other-job", 5, worker))
    attempt("1GiB-frame", lambda s: s.sendall(b"tF\x10\x00" + bytes(4) + (1 << 30).to_bytes(8, "big")
                                              + b"\x00" * 65536))
    return outcomes


PROBES = 4


def test_stray_connections_refused_and_logged(tmp_path: Path) -> None:
    expected = expected_output()

    def job(worker: Worker) -> dict[str, Any]:
        import logging

        handler = logging.FileHandler(tmp_path / f"worker-{worker.index}.log")
        logging.getLogger("tokenflow.comm.tcp").addHandler(handler)
        handles, (cap_lists, cap_arrows) = build_dataflow(worker)
        run_epochs(worker, handles, range(EPOCHS // 2))
        (tmp_path / f"ready-{worker.index}").touch()
        mesh = worker.allocator.mesh
        deadline = time.monotonic() + 30
        while mesh.refused < PROBES and time.monotonic() < deadline:
            worker.step_or_park(0.01)
        refused_mid_job = mesh.refused
        run_epochs(worker, handles, range(EPOCHS // 2, EPOCHS))  # the mesh still carries data
        handles[0].close()
        handles[1].close()
        worker.step_until_done()
        return {"refused": refused_mid_job, "lists": flatten(cap_lists.events),
                "arrows": flatten(cap_arrows.events)}

    seen: dict[int, dict[str, str]] = {}

    def on_addresses(addresses: list[tuple[str, int]], job_name: str) -> None:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready-{i}").exists() for i in range(len(addresses))):
            if time.monotonic() > deadline:
                return  # the assertions below report it
            time.sleep(0.02)
        for i, address in enumerate(addresses):
            seen[i] = probe_worker(address, job_name, i)

    results = execute(job, workers=2, runtime="process", on_addresses=on_addresses,
                      timeout=TIMEOUT)

    # the job went on and its output is right
    assert merged([(r["lists"], r["arrows"]) for r in results]) == expected
    # every stray connection was turned away (none got an answer or timed out)
    for i in (0, 1):
        assert seen[i]["wrong-secret"] == f"AuthenticationError: worker {i} does not know the job secret"
        assert seen[i]["wrong-mac"] == "closed"
        assert seen[i]["wrong-job"] == "closed"
        assert seen[i]["1GiB-frame"] == "closed"
        assert results[i]["refused"] == PROBES
        log = (tmp_path / f"worker-{i}.log").read_text()
        lines = [line for line in log.splitlines()
                 if f"worker {i} refused a connection from 127.0.0.1" in line]
        assert len(lines) == PROBES, log
        assert sum("failed the secret check" in line for line in lines) == 1, log
        assert sum("connection for job 'other-job'" in line for line in lines) == 1, log
        assert sum(f"frame of {1 << 30} bytes exceeds the limit of 4096 bytes" in line
                   for line in lines) == 1, log
        assert sum("connection closed" in line for line in lines) == 1, log  # client hung up


# -- a data frame over max_frame ---------------------------------------------------------------


def big_frame_job(worker: Worker) -> int:
    def build(scope: Any) -> tuple[Any, Any]:
        inp, s = scope.new_input()
        return inp, s.exchange(lambda x: x).probe()

    inp, probe = worker.dataflow(build)
    if worker.index == 0:  # ~1000 of these are routed to worker 1: one ~16 KB frame
        inp.send_batch([f"record-{i:06d}" for i in range(2000)])
    inp.advance_to(1)
    worker.step_while(lambda: probe.less_than(1))
    inp.close()
    return worker.index


def test_frame_over_max_frame_fails_the_job() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        execute(big_frame_job, workers=2, runtime="process", max_frame=4096, timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert info.value.worker == 1, message  # the receiver refused the frame ...
    assert "refused a frame from worker 0" in message, message  # ... and names the sender
    assert "exceeds the limit of 4096 bytes" in message, message
    assert elapsed < 30
    assert no_worker_processes_left()


# -- failing workers ---------------------------------------------------------------------------


def failing_job(bad: int, how: str) -> Callable[[Worker], int]:
    def job(worker: Worker) -> int:
        def build(scope: Any) -> tuple[Any, Any]:
            inp, s = scope.new_input()
            return inp, s.exchange(lambda x: x).probe()

        inp, probe = worker.dataflow(build)
        for epoch in range(1000):
            inp.send_batch(list(range(16)))
            inp.advance_to(epoch + 1)
            worker.step_while(lambda e=epoch + 1: probe.less_than(e))
            if epoch == 5 and worker.index == bad:
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise ValueError(f"worker {worker.index} gives up at epoch {epoch}")
        inp.close()
        return worker.index

    return job


def test_sigkilled_worker_fails_the_job_naming_it() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        execute(failing_job(1, "kill"), workers=3, runtime="process", timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    assert elapsed < 30
    assert info.value.worker == 1
    assert "worker 1 was killed by SIGKILL" in str(info.value)
    assert no_worker_processes_left()


def test_raising_worker_fails_the_job_naming_it() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        execute(failing_job(1, "raise"), workers=2, runtime="process", timeout=TIMEOUT)
    assert time.monotonic() - start < 30
    assert info.value.worker == 1
    assert "worker 1 failed" in str(info.value)
    assert "ValueError: worker 1 gives up at epoch 5" in str(info.value)
    assert no_worker_processes_left()
