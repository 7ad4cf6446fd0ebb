"""Fuzz the worker mesh of a live 2-worker job; writes ``benchmarks/results/fuzz.md``.

A ``process``-runtime job (input -> exchange -> map -> capture, 200 records per epoch) runs
while this script throws at both workers' listeners, on 127.0.0.1 only and bounded in count
and time: random bytes, random frame headers, oversized lengths, truncated and garbage
handshakes (valid headers, random bodies, msgpack of the wrong types), frames posing as sealed,
wrong secrets and the right secret with a wrong or taken worker index (through the library's
own ``connect_handshake``), slow connections trickling a byte a second, and a flood of
connections opened and closed at once.  Then it checks that

* the job's output equals a plain-Python computation of it, and an unfuzzed run's;
* both workers survived (the job finished) and refused the fuzzing connections;
* their threads and file descriptors stayed within the listener's limits (``MAX_PENDING``);
* their refusal logs stayed short (first refusal of each kind, then counts).

Exits 1 if a check fails.  ``--quick`` is a smaller run (~10 s); the default takes about
30 s (12,800 connections, most of them the flood; the slow connections set its length).
Source: docs/SECURITY.md ("Limits on unauthenticated connections", "Testing").
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgpack

RESULTS = Path(__file__).parent / "results"
RECORDS = 200
EPOCHS_DURING = 40  # epochs the job runs while the fuzzing goes on ...
EPOCHS_AFTER = 10  # ... and after it (the mesh must still carry data)
JOB = "fuzz-mesh"


# -- the job -----------------------------------------------------------------------------------


def records(epoch: int) -> list[int]:
    return [epoch * 1000 + r for r in range(RECORDS)]


def expected_output() -> list[tuple[int, tuple[int, int]]]:
    return sorted((e, (x % 17, x)) for e in range(EPOCHS_DURING + EPOCHS_AFTER) for x in records(e))


def fuzz_job(marker: str, log_dir: str, pace: float, wait_limit: float) -> Callable[[Any], dict[str, Any]]:
    """The worker function: ``EPOCHS_DURING`` paced epochs, then wait (stepping) for
    ``marker`` (the fuzzing is over), then ``EPOCHS_AFTER`` epochs; returns the captured
    output, the peak threads and file descriptors seen, and the mesh's refusal counts."""

    def job(worker: Any) -> dict[str, Any]:
        import logging
        import threading as th

        handler = logging.FileHandler(os.path.join(log_dir, f"worker-{worker.index}.log"))
        logging.getLogger("tokenflow.comm.tcp").addHandler(handler)
        Path(log_dir, f"ready-{worker.index}").touch()  # the fuzzing starts once both log

        def build(scope: Any) -> tuple[Any, Any]:
            inp, stream = scope.new_input()
            out = stream.exchange(lambda x: x).map(lambda x: (x % 17, x))
            return (inp, out.probe()), out.capture()

        (inp, probe), captured = worker.dataflow(build)
        mesh = worker.allocator.mesh
        base = {"threads": th.active_count(), "fds": len(os.listdir("/proc/self/fd"))}
        peak = dict(base)

        def sample() -> None:
            peak["threads"] = max(peak["threads"], th.active_count())
            peak["fds"] = max(peak["fds"], len(os.listdir("/proc/self/fd")))

        def run(epochs: range) -> None:
            for epoch in epochs:
                inp.send_batch([x for x in records(epoch) if x % worker.peers == worker.index])
                inp.advance_to(epoch + 1)
                worker.step_while(lambda e=epoch + 1: probe.less_than(e))
                sample()
                time.sleep(pace)

        run(range(EPOCHS_DURING))
        deadline = time.monotonic() + wait_limit
        while not os.path.exists(marker) and time.monotonic() < deadline:
            worker.step_or_park(0.05)
            sample()
        run(range(EPOCHS_DURING, EPOCHS_DURING + EPOCHS_AFTER))
        inp.close()
        worker.step_until_done()
        return {"output": sorted((t, r) for t, batch in captured.events for r in batch),
                "base": base, "peak": peak, "refused": mesh.refused,
                "accept_failures": mesh.accept_failures, "max_pending": mesh.max_pending}

    return job


# -- fuzz cases --------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    connections: int = 0
    client_errors: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def header(kind: int, length: int, flags: int = 0, channel: int = 0, magic: bytes = b"tF") -> bytes:
    return magic + bytes([kind & 0xFF, flags & 0xFF]) + channel.to_bytes(4, "big") + \
        (length % (1 << 64)).to_bytes(8, "big")


def handshake(obj: Any) -> bytes:
    from tokenflow.comm.frames import KIND_HANDSHAKE, encode_control

    return encode_control(KIND_HANDSHAKE, msgpack.packb(obj))


def hello(job: str = JOB, worker: Any = 5, nonce: Any = None, **extra: Any) -> dict[str, Any]:
    return {"v": 2, "job": job, "worker": worker, "nonce": nonce if nonce is not None else os.urandom(16),
            **extra}


def send_and_close(address: tuple[str, int], data: bytes, case: Case, linger: float = 0.0) -> None:
    """One connection: send ``data``, wait ``linger`` s for the worker to answer or hang up."""
    try:
        with socket.create_connection(address, timeout=5) as sock:
            case.connections += 1
            try:
                sock.sendall(data)
                if linger:
                    sock.settimeout(linger)
                    sock.recv(1 << 16)
            except (OSError, TimeoutError):
                pass  # the worker hung up first (as it should) or kept quiet
    except OSError:
        case.client_errors += 1


def random_garbage(rng: random.Random) -> Any:
    """A random msgpack-able value of a random type (nested a little)."""
    pick = rng.randrange(9)
    if pick == 0:
        return rng.randbytes(rng.randrange(64))
    if pick == 1:
        return rng.getrandbits(64) - (1 << 63)
    if pick == 2:
        return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(40)))
    if pick == 3:
        return [random_garbage(rng) for _ in range(rng.randrange(4))]
    if pick == 4:
        return {str(rng.random()): random_garbage(rng) for _ in range(rng.randrange(4))}
    if pick == 5:
        return rng.random()
    if pick == 6:
        return None
    if pick == 7:
        return rng.random() < 0.5
    return {rng.randrange(100): 1}  # an integer key


OVERSIZED = [4097, 1 << 30, 1 << 31, 1 << 63, (1 << 64) - 1]


def case_frames(addresses: list[tuple[str, int]], rng: random.Random, n: int, secret: bytes) -> list[Case]:
    """The one-connection-one-message cases, ``n`` connections each, alternating workers."""
    from tokenflow.comm.auth import AuthenticationError, connect_handshake

    def each(name: str, make: Callable[[int], bytes], linger: float = 0.0) -> Case:
        case = Case(name)
        start = time.monotonic()
        for k in range(n):
            send_and_close(addresses[k % 2], make(k), case, linger)
        case.seconds = time.monotonic() - start
        return case

    full_hello = handshake(hello())
    cases = [
        each("random bytes", lambda k: rng.randbytes(rng.randrange(1, 2048))),
        each("random frame headers", lambda k: header(rng.randrange(256), rng.getrandbits(64),
                                                      rng.randrange(256), rng.getrandbits(32))
             + rng.randbytes(rng.randrange(512))),
        each("oversized lengths", lambda k: header(16, OVERSIZED[k % len(OVERSIZED)], flags=k % 2)
             + rng.randbytes(1024)),
        each("truncated hellos", lambda k: full_hello[: rng.randrange(1, len(full_hello))]),
        each("valid header, random body", lambda k: (lambda body: header(16, len(body)) + body)(
            rng.randbytes(rng.randrange(1, 4096)))),
        each("msgpack of the wrong types", lambda k: handshake(
            random_garbage(rng) if k % 3 == 0 else
            hello(**{rng.choice(["v", "job", "worker", "nonce"]): random_garbage(rng)}))),
        each("frames posing as sealed", lambda k: header(rng.choice([1, 2, 3, 4]), 64, flags=1)
             + rng.randbytes(64)),
        each("valid hello, garbage after", lambda k: full_hello + rng.randbytes(rng.randrange(1, 600)),
             linger=0.5),
    ]
    for name, key, claim in (("wrong secret (connect_handshake)", None, 5),
                             ("right secret, taken or wrong index", secret, None)):
        case = Case(name)
        start = time.monotonic()
        for k in range(max(1, n // 3)):
            target = k % 2
            me = claim if claim is not None else [1, 0, 7, -1][k % 4]
            try:
                with socket.create_connection(addresses[target], timeout=5) as sock:
                    case.connections += 1
                    try:
                        connect_handshake(sock, key or os.urandom(32), JOB, me, target,
                                          deadline=time.monotonic() + 5)
                        case.notes.append(f"worker {target} ACCEPTED index {me}")
                    except (AuthenticationError, EOFError, OSError):
                        pass
            except OSError:
                case.client_errors += 1
        case.seconds = time.monotonic() - start
        cases.append(case)
    return cases


def case_slow(addresses: list[tuple[str, int]], count: int, seconds: float) -> Case:
    """``count`` connections sending a byte every second for ``seconds``."""
    case = Case(f"slow connections ({count}, a byte a second for {seconds:g} s)")
    start = time.monotonic()
    socks: list[socket.socket] = []
    for k in range(count):
        try:
            socks.append(socket.create_connection(addresses[k % 2], timeout=5))
            case.connections += 1
        except OSError:
            case.client_errors += 1
    prefix = handshake(hello())
    for tick in range(int(seconds)):
        time.sleep(1.0)
        for sock in socks:
            try:
                sock.send(prefix[tick % len(prefix) : tick % len(prefix) + 1])
            except OSError:
                pass
    closed = 0
    for sock in socks:
        try:
            sock.settimeout(0.01)
            closed += sock.recv(1) == b""
        except (OSError, TimeoutError):
            pass
        sock.close()
    case.notes.append(f"{closed} of {len(socks)} already closed by the workers when done")
    case.seconds = time.monotonic() - start
    return case


def case_flood(addresses: list[tuple[str, int]], count: int, threads: int = 8) -> Case:
    """``count`` connections opened and closed at once, from ``threads`` threads."""
    case = Case(f"connection flood ({count:,} opened and closed)")
    lock = threading.Lock()
    start = time.monotonic()

    def run(part: int) -> None:
        made = errors = 0
        for k in range(part, count, threads):
            try:
                socket.create_connection(addresses[k % 2], timeout=5).close()
                made += 1
            except OSError:
                errors += 1
        with lock:
            case.connections += made
            case.client_errors += errors

    workers = [threading.Thread(target=run, args=(p,)) for p in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    case.seconds = time.monotonic() - start
    return case


# -- driver ------------------------------------------------------------------------------------


def run_job(marker: Path, log_dir: Path, secret: bytes, fuzz: Callable[[list[tuple[str, int]]], None] | None,
            pace: float, wait_limit: float) -> tuple[list[dict[str, Any]], float]:
    from tokenflow import execute

    def on_addresses(addresses: list[tuple[str, int]], job: str) -> None:
        if fuzz is not None:
            threading.Thread(target=fuzz, args=([tuple(a) for a in addresses],), daemon=True).start()

    start = time.monotonic()
    results = execute(fuzz_job(str(marker), str(log_dir), pace, wait_limit), workers=2,
                      runtime="process", secret=secret, job=JOB, on_addresses=on_addresses,
                      timeout=wait_limit + 120)
    return results, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (~10 s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    per_case, slow, slow_seconds, flood = (60, 100, 5, 1_000) if args.quick else (300, 200, 15, 10_000)
    load = os.getloadavg()
    begin = time.monotonic()
    secret = os.urandom(32)
    expected = expected_output()

    with tempfile.TemporaryDirectory(prefix="tokenflow-fuzz-") as tmp:
        work = Path(tmp)
        # an unfuzzed run first: the output the fuzzed run must reproduce
        (work / "calm").mkdir()
        (work / "calm-done").touch()
        calm, calm_seconds = run_job(work / "calm-done", work / "calm", secret, None, 0.0, 5)
        print(f"unfuzzed run: {calm_seconds:.1f} s", flush=True)

        cases: list[Case] = []
        fuzz_error: list[BaseException] = []
        marker = work / "fuzz-done"

        def fuzz(addresses: list[tuple[str, int]]) -> None:
            try:
                deadline = time.monotonic() + 60
                while not all((work / "fuzz" / f"ready-{i}").exists() for i in (0, 1)):
                    if time.monotonic() > deadline:
                        raise TimeoutError("the workers did not start")
                    time.sleep(0.01)
                for step in (lambda: case_frames(addresses, rng, per_case, secret),
                             lambda: [case_slow(addresses, slow, slow_seconds)],
                             lambda: [case_flood(addresses, flood)]):
                    for case in step():
                        cases.append(case)
                        print(f"{case.name:<45} {case.connections:>6} connections "
                              f"{case.client_errors:>4} client errors {case.seconds:6.1f} s "
                              f"{'; '.join(case.notes)}", flush=True)
            except BaseException as exc:  # noqa: BLE001 - reported below
                fuzz_error.append(exc)
            finally:
                time.sleep(1.0)  # let the workers drain their backlogs
                marker.touch()

        (work / "fuzz").mkdir()
        fuzzed, fuzz_seconds = run_job(marker, work / "fuzz", secret, fuzz, 0.02, 170)
        logs = {i: (work / "fuzz" / f"worker-{i}.log").read_text() for i in (0, 1)}
    total = time.monotonic() - begin

    checks: list[tuple[str, bool, str]] = []

    def check(what: str, ok: bool, detail: str) -> None:
        checks.append((what, ok, detail))

    def merged(results: list[dict[str, Any]]) -> list[Any]:
        return sorted(r for res in results for r in res["output"])

    out = merged(fuzzed)
    check("fuzzing ran to the end", not fuzz_error, repr(fuzz_error[0]) if fuzz_error else "")
    check("output equals the plain-Python computation", out == expected,
          f"{len(out):,} records, expected {len(expected):,}")
    check("output equals the unfuzzed run's", out == merged(calm), "")
    check("each worker's part is the unfuzzed run's", [r["output"] for r in fuzzed] ==
          [r["output"] for r in calm], "")
    connections = sum(c.connections for c in cases)
    refused = sum(r["refused"] for r in fuzzed)
    check("no fuzzing connection was accepted", not any(c.notes and "ACCEPTED" in " ".join(c.notes)
                                                       for c in cases), "")
    check("the workers refused the fuzzing connections", refused >= 0.95 * connections,
          f"{refused:,} refused of {connections:,} made")
    for i, r in enumerate(fuzzed):
        cap = r["max_pending"]
        check(f"worker {i}: threads bounded", r["peak"]["threads"] <= r["base"]["threads"] + cap + 2,
              f"{r['base']['threads']} at the start, peak {r['peak']['threads']} (max_pending {cap})")
        check(f"worker {i}: file descriptors bounded", r["peak"]["fds"] <= r["base"]["fds"] + cap + 4,
              f"{r['base']['fds']} at the start, peak {r['peak']['fds']}")
        lines = [line for line in logs[i].splitlines() if "refused" in line]
        check(f"worker {i}: refusal log stays short", len(lines) <= 40,
              f"{len(lines)} lines for {r['refused']:,} refusals")

    report = write_report(cases, checks, fuzzed, logs, args, load, total, calm_seconds, fuzz_seconds)
    print()
    print(report)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "fuzz.md").write_text(report)
        print(f"wrote {RESULTS / 'fuzz.md'}", file=sys.stderr)
    if not all(ok for _, ok, _ in checks):
        sys.exit(1)


def write_report(cases: list[Case], checks: list[tuple[str, bool, str]], fuzzed: list[dict[str, Any]],
                 logs: dict[int, str], args: argparse.Namespace, load: tuple[float, float, float],
                 total: float, calm_seconds: float, fuzz_seconds: float) -> str:
    lines = [
        "# Mesh fuzzing",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average at start {load[0]:.1f}. "
        f"Produced by `python benchmarks/fuzz_mesh.py{' --quick' if args.quick else ''}` "
        f"(seed {args.seed}) in {total:.0f} s: a 2-worker `process` job "
        f"({EPOCHS_DURING + EPOCHS_AFTER} epochs of {RECORDS} records through an exchange) ran "
        f"{fuzz_seconds:.1f} s while both workers' listeners (127.0.0.1) were fuzzed; the same "
        f"job unfuzzed took {calm_seconds:.1f} s.",
        "",
        "## Cases",
        "",
        "| case | connections | client-side errors | seconds | notes |",
        "|---|---:|---:|---:|---|",
    ]
    for c in cases:
        lines.append(f"| {c.name} | {c.connections:,} | {c.client_errors:,} | {c.seconds:.1f} | "
                     f"{'; '.join(c.notes)} |")
    lines += ["", "## Checks", "", "| check | result | detail |", "|---|---|---|"]
    for what, ok, detail in checks:
        lines.append(f"| {what} | {'ok' if ok else 'FAILED'} | {detail} |")
    lines += ["", "## Workers", ""]
    for i, r in enumerate(fuzzed):
        lines.append(f"- worker {i}: refused {r['refused']:,} connections, {r['accept_failures']} "
                     f"accept failures; threads {r['base']['threads']} -> peak {r['peak']['threads']}, "
                     f"file descriptors {r['base']['fds']} -> peak {r['peak']['fds']}.")
    lines += ["", "Worker 0's mesh log, whole (the first refusal of each kind in full, then counts):",
              "", "```"]
    lines += [line[:300] for line in logs[0].splitlines()]
    lines += ["```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
