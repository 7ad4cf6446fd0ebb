"""examples/hello.py as a test: every value is seen once, at its epoch, after the exchange."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import hello  # examples/hello.py (tests/examples/conftest.py puts examples/ on sys.path)
import pytest


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_value_seen_once_at_its_epoch(workers: int) -> None:
    rounds = 30
    seen = hello.main(workers=workers, rounds=rounds, quiet=True)
    assert sorted(v for _, _, v in seen) == list(range(rounds))
    assert all(t == v for _, t, v in seen)
    assert all(0 <= w < workers for w, _, _ in seen)
    if workers > 1:
        # The exchange spreads 30 distinct values over more than one worker.
        assert len({w for w, _, _ in seen}) > 1


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_worker_sends_values_meet_on_one_worker(workers: int) -> None:
    rounds = 12
    seen = hello.run(workers=workers, rounds=rounds, every_worker_sends=True)
    # each worker sent each value once: every value is seen `workers` times ...
    assert Counter(s.value for s in seen) == {v: workers for v in range(rounds)}
    assert all(s.time == s.value for s in seen)
    # ... and all copies of one value (one key) land on the same worker.
    owners: dict[int, set[int]] = defaultdict(set)
    for s in seen:
        owners[s.value].add(s.worker)
    assert all(len(ws) == 1 for ws in owners.values()), owners
    # The probe bounds how far a worker runs ahead: a record of epoch t is inspected while the
    # inspecting worker's input is at epoch t or t + 1, never later.
    assert all(s.time <= s.round <= s.time + 1 for s in seen), seen


def test_no_rounds_sees_nothing() -> None:
    assert hello.main(workers=2, rounds=0, quiet=True) == []


def test_cli_prints_one_line_per_value(capsys: pytest.CaptureFixture[str]) -> None:
    hello.cli(["--workers", "2", "--rounds", "4"])
    lines = capsys.readouterr().out.splitlines()
    pattern = re.compile(r"worker ([01]): seen (\d+) at time (\d+)")
    matches = [pattern.fullmatch(line) for line in lines]
    assert all(matches), lines
    assert sorted(int(m.group(2)) for m in matches if m) == [0, 1, 2, 3]
    assert all(m.group(2) == m.group(3) for m in matches if m)
