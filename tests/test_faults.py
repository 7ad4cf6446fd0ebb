"""Crash points (``tokenflow.faults``): armed only by the environment, fire once, in one
process, with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tokenflow import faults


def test_a_bad_setting_is_refused_naming_the_entry() -> None:
    with pytest.raises(ValueError, match="snapshot.nowhere=/x"):
        faults._parse("snapshot.part=/a,snapshot.nowhere=/x")
    with pytest.raises(ValueError, match="point=path"):
        faults._parse("parquet.commit")
    assert faults._parse(" parquet.commit=/a , snapshot.part=/b ") == {
        "parquet.commit": "/a", "snapshot.part": "/b"}


CHILD = """
import sys
from tokenflow.faults import crash_point
crash_point("snapshot.commit")   # not armed: nothing happens
print("before", flush=True)
crash_point("parquet.commit")
print("after", flush=True)
"""


@pytest.mark.parametrize("armed", [True, False])
def test_an_armed_point_kills_its_process_once(tmp_path: Path, armed: bool) -> None:
    trigger = tmp_path / "trigger"
    if armed:
        trigger.touch()
    env = {**os.environ, faults.ENV: f"parquet.commit={trigger}"}
    first = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
    second = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
    if armed:
        assert first.returncode == -signal.SIGKILL and first.stdout.split() == ["before"]
    else:
        assert first.returncode == 0
    assert second.returncode == 0 and second.stdout.split() == ["before", "after"]
    assert not trigger.exists()
