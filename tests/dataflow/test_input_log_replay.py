"""``InputHandle`` with an input log (``worker.input_log``) on the thread runtime: a restored
run replays the logged input, whatever its (non-deterministic) worker code gives.

Each run's worker code sends words tagged with the run (``r1-..``, ``r2-..``) and drawn from an
unseeded RNG, so two runs never feed the same input; the tests record what every worker sent
at every epoch.  The oracle is a plain-Python running count over the input history the log
must have imposed: the first run's sends for the epochs it logged completely, the restored
run's own sends after them.  Output is a ``state_machine`` word count (keyed exchange, so the
worker counts of the two runs may differ).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from tokenflow import execute
from tokenflow.dataflow.operators.stateful import state_machine
from tokenflow.io.inputlog import InputLog, InputLogError
from tokenflow.job import start

pytestmark = pytest.mark.timeout(60)

EPOCHS = 16
NAME = "tests.input-log-replay"
Sent = dict[tuple[int, int, int], list[str]]  # (run, worker, epoch) -> words sent
KEYS: set[str] = set()  # the input handles' keys (their source keys)


def wordcount(log_root: Path, run: int, sent: Sent, captures: list[Any], *,
              gate: threading.Event | None = None, held: list[int] | None = None,
              hold_after: int = -1,
              crash_at: int = -1, replay: bool = False) -> Any:
    """Worker code: per epoch, send a few random words of run ``run``; after epoch
    ``hold_after`` note it in ``held`` and step until ``gate`` is set (so a snapshot can be
    taken there); worker 0
    raises at epoch ``crash_at`` after sending (that epoch is never sealed)."""

    def job(worker: Any) -> Any:
        worker.input_log = InputLog(log_root, NAME, worker.index)
        worker.replay = replay

        def build(scope: Any) -> Any:
            handle, stream = scope.new_input("words")
            counts = state_machine(stream.map(lambda w: (w, 1)),
                                   lambda w, n, c: ((c or 0) + n, [(w, (c or 0) + n)]))
            return handle, counts.probe(), counts.capture()

        handle, probe, captured = worker.dataflow(build)
        captures.append(captured)
        KEYS.update(worker.sources)
        rng = random.Random()  # unseeded: the worker code is not deterministic
        for epoch in range(EPOCHS):
            handle.advance_to(epoch)
            words = [f"r{run}-{rng.randrange(6)}" for _ in range(rng.randrange(1, 5))]
            sent[(run, worker.index, epoch)] = words
            handle.send_batch(words)
            if epoch == crash_at and worker.index == 0:
                raise RuntimeError("simulated crash")
            handle.advance_to(epoch + 1)
            worker.step_while(lambda e=epoch: probe.less_than(e + 1))
            if epoch == hold_after and gate is not None:
                if held is not None:
                    held.append(worker.index)
                while not gate.is_set():
                    worker.step_or_park()
        handle.close()
        return captured

    return job


def output(captures: list[Any]) -> dict[int, Counter[Any]]:
    out: dict[int, Counter[Any]] = defaultdict(Counter)
    for capture in captures:
        for t, batch in capture.events:
            out[t].update(batch)
    return dict(out)


def expected(history: dict[int, list[str]]) -> dict[int, Counter[Any]]:
    """The word count's output per epoch for an input history (epoch -> words)."""
    counts: Counter[str] = Counter()
    out: dict[int, Counter[Any]] = {}
    for t in sorted(history):
        c: Counter[Any] = Counter()
        for word, n in Counter(history[t]).items():
            c.update((word, counts[word] + k) for k in range(1, n + 1))
            counts[word] += n
        if c:
            out[t] = c
    return out


def words_at(sent: Sent, run: int, epoch: int) -> list[str]:
    return [w for (r, _, e), words in sent.items() if r == run and e == epoch for w in words]


def since(out: dict[int, Counter[Any]], epoch: int) -> dict[int, Counter[Any]]:
    return {t: c for t, c in out.items() if t >= epoch}


def run_with_snapshot(tmp_path: Path, sent: Sent, captures: list[Any], workers: int,
                      crash_at: int = -1) -> tuple[int, BaseException | None]:
    """Run 1 under the control plane: snapshot (and resume) after epoch 5, then go on to the
    end or to the crash.  Returns the snapshot's epoch and the job's failure."""
    gate = threading.Event()
    held: list[int] = []
    job = start(wordcount(tmp_path / "log", 1, sent, captures, gate=gate, held=held,
                          hold_after=5, crash_at=crash_at), workers=workers, name=NAME)
    try:
        deadline = time.monotonic() + 20
        while len(held) < workers and time.monotonic() < deadline:
            time.sleep(0.005)
        epoch = job.snapshot(str(tmp_path / "snap"), stop=False)
    finally:
        gate.set()
    try:
        job.result(timeout=30)
    except Exception as exc:  # noqa: BLE001 - the simulated crash
        return epoch, exc
    return epoch, None


def test_restored_run_replays_the_logged_input_not_its_own(tmp_path: Path) -> None:
    sent: Sent = {}
    first: list[Any] = []
    e, failure = run_with_snapshot(tmp_path, sent, first, workers=2)
    assert failure is None and e == 6  # paused after epoch 5's advance_to(6)
    history1 = {t: words_at(sent, 1, t) for t in range(EPOCHS)}
    assert output(first) == expected(history1)
    second: list[Any] = []
    execute(wordcount(tmp_path / "log", 2, sent, second), workers=3, restore=str(tmp_path / "snap"),
            name=NAME)
    assert any(words_at(sent, 2, t) for t in range(EPOCHS))  # run 2's code did send its own
    # the whole input was logged and closed: run 2 replays run 1's epochs e.. and nothing else
    assert output(second) == since(expected(history1), e)
    assert not any(w.startswith("r2-") for c in output(second).values() for w, _ in c)


def test_job_stopped_at_a_snapshot_logs_no_end(tmp_path: Path) -> None:
    """``snapshot(stop=True)`` closes the handles through ``Worker.stop``: that is not the end
    of the input, so the restored run feeds the epochs from the snapshot on itself."""
    sent: Sent = {}
    first: list[Any] = []
    gate = threading.Event()
    held: list[int] = []
    job = start(wordcount(tmp_path / "log", 1, sent, first, gate=gate, held=held, hold_after=5),
                workers=2, name=NAME)
    deadline = time.monotonic() + 20
    while len(held) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    e = job.snapshot(str(tmp_path / "snap"), stop=True)
    gate.set()
    job.result(timeout=30)
    assert e == 6
    second: list[Any] = []
    execute(wordcount(tmp_path / "log", 2, sent, second), workers=2,
            restore=str(tmp_path / "snap"), name=NAME)
    history = {t: words_at(sent, 1, t) for t in range(e)}
    history.update({t: words_at(sent, 2, t) for t in range(e, EPOCHS)})
    assert output(second) == since(expected(history), e)


def test_crash_after_the_snapshot_replays_the_sealed_epochs_then_takes_new_input(
        tmp_path: Path) -> None:
    crash = 10
    sent: Sent = {}
    first: list[Any] = []
    e, failure = run_with_snapshot(tmp_path, sent, first, workers=2, crash_at=crash)
    assert failure is not None and "simulated crash" in str(failure)
    released = output(first)
    assert max(released) == crash - 1  # epochs up to 9 were complete and released
    # worker 0 sent at 10 but never sealed it: the log holds 6..9, the restored run feeds 10..
    history = {t: words_at(sent, 1, t) for t in range(crash)}
    (key,) = KEYS
    plan = InputLog(tmp_path / "log", NAME, 0, peers=1).replay(key, e)
    assert (plan.until, plan.epochs) == (crash, list(range(e, crash)))
    second: list[Any] = []
    execute(wordcount(tmp_path / "log", 2, sent, second), workers=3,
            restore=str(tmp_path / "snap"), name=NAME)
    history.update({t: words_at(sent, 2, t) for t in range(crash, EPOCHS)})
    want = expected(history)
    assert output(first) == {t: c for t, c in want.items() if t < crash}  # run 1 agrees
    assert output(second) == since(want, e)  # released epochs 6..9 unchanged, 10.. are run 2's
    assert not any(w.startswith("r2-") for t in range(e, crash)
                   for w, _ in output(second).get(t, Counter()))

    # a third run from the same snapshot at 1 worker replays run 1's 6..9 and run 2's 10..
    third: list[Any] = []
    execute(wordcount(tmp_path / "log", 3, sent, third), workers=1,
            restore=str(tmp_path / "snap"), name=NAME)
    assert output(third) == since(want, e)


def test_replay_without_a_snapshot_and_fresh_runs_refuse_a_used_log(tmp_path: Path) -> None:
    sent: Sent = {}
    first: list[Any] = []
    execute(wordcount(tmp_path / "log", 1, sent, first), workers=2, name=NAME)
    history1 = {t: words_at(sent, 1, t) for t in range(EPOCHS)}
    assert output(first) == expected(history1)
    again: list[Any] = []  # a restart before the first checkpoint: worker.replay set
    execute(wordcount(tmp_path / "log", 2, sent, again, replay=True), workers=2, name=NAME)
    assert output(again) == expected(history1)
    with pytest.raises(Exception, match="already holds epochs") as info:
        execute(wordcount(tmp_path / "log", 3, sent, []), workers=1, name=NAME)
    assert isinstance(info.value.__cause__, InputLogError) or "InputLogError" in str(info.value)


class FailingLog(InputLog):
    """Fails to seal epoch ``fail``."""

    fail = 3

    def seal(self, key: str, epoch: int, until: int | None = None) -> str:
        if epoch == self.fail:
            raise OSError("disk full")
        return super().seal(key, epoch, until)


def test_epoch_is_sealed_before_the_token_moves(tmp_path: Path) -> None:
    """If sealing epoch 3 fails, the handle keeps epoch 3: nothing downstream sees it
    complete, so no output of it can be released."""
    seen: list[Any] = []
    keys: list[str] = []

    def job(worker: Any) -> Any:
        worker.input_log = FailingLog(tmp_path, NAME, worker.index)

        def build(scope: Any) -> Any:
            handle, stream = scope.new_input("words")
            return handle, stream.probe()

        handle, probe = worker.dataflow(build)
        keys.extend(worker.sources)
        for epoch in range(5):
            handle.send(f"x{epoch}")
            try:
                handle.advance_to(epoch + 1)
            except OSError:
                for _ in range(20):
                    worker.step()
                seen.append((handle.time, probe.less_than(epoch + 1)))
                handle.close()
                return
            worker.step_while(lambda e=epoch: probe.less_than(e + 1))

    execute(job, workers=1, name=NAME)
    assert seen == [(3, True)]
    log = InputLog(tmp_path, NAME, 0, peers=1)
    assert log.read(keys[0], 0) == {0: [["x0"]], 1: [["x1"]], 2: [["x2"]], 3: [["x3"]]}
    assert log.replay(keys[0], 0).ended  # close() sealed epoch 3 as the last
