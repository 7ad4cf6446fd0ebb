"""The flights job with checkpoints: a worker killed while the sink commits a month is
recovered, and both the returned statistics and the committed dataset equal a run without
checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenflow.flights import COLUMNS, load_flights, read_hourly, run_flights_timed


def test_flights_recovers_from_a_sigkill_during_a_commit(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    flights = load_flights().select(COLUMNS).slice(0, 60_000)  # about two months
    plain = run_flights_timed(2, "thread", tmp_path / "plain", flights=flights, max_rows=2000)
    trigger = tmp_path / "trigger"
    trigger.touch()
    monkeypatch.setenv("TOKENFLOW_CRASH", f"parquet.commit={trigger}")
    recovered = run_flights_timed(2, "process", tmp_path / "out", flights=flights, max_rows=2000,
                                  checkpoint=tmp_path / "ckpt", checkpoint_interval=0.1)
    assert not trigger.exists(), "no worker reached the crash point: the test proves nothing"
    assert recovered.table.equals(plain.table)
    assert read_hourly(tmp_path / "out" / "hourly").equals(read_hourly(tmp_path / "plain" / "hourly"))


def test_checkpoints_need_an_output(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="output"):
        run_flights_timed(1, "thread", None, checkpoint=tmp_path)
