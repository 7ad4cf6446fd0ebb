"""``tokenflow run --rescale-schedule``: the job's migrating state follows the schedule while
it runs, and its output is still the unrescaled one."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tokenflow.cli import parse_rescale_schedule

JOB = '''
import json, random, sys, time
from tokenflow.rescale import megaphone_fold

def words(worker, epoch):
    rng = random.Random(worker * 1000 + epoch)
    return [f"w{rng.randrange(30)}" for _ in range(20)]

def job(worker):
    def build(scope):
        inp, stream = scope.new_input()
        handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                                lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]))
        return inp, handle, handle.stream.capture()
    inp, handle, capture = worker.dataflow(build)
    for e in range(60):
        for w in words(worker.index, e):
            inp.send(w)
        inp.advance_to(e + 1)
        deadline = time.monotonic() + 0.03
        while time.monotonic() < deadline:
            worker.step_or_park(0.005)
    inp.close()
    worker.step_until_done()
    with open(f"{OUT}/{worker.index}.json", "w") as f:
        json.dump({"final": {k: max(c for w, c in recs if w == k)
                             for recs in [capture.records()] for k in {w for w, _ in recs}},
                   "keys": len(handle.state.data)}, f)
'''


def test_schedule_is_parsed_and_checked() -> None:
    assert parse_rescale_schedule("20s:3, 40s:4,1m:2", 4) == [(20.0, 3), (40.0, 4), (60.0, 2)]
    for bad in ("20s:5", "20s:3,10s:2", "3", "20s:x", "20s:0"):
        with pytest.raises(ValueError):
            parse_rescale_schedule(bad, 4)


def test_run_with_a_rescale_schedule(tmp_path: Path) -> None:
    script = tmp_path / "jobs.py"
    script.write_text(f"OUT = {str(tmp_path)!r}\n" + JOB)
    done = subprocess.run([sys.executable, "-m", "tokenflow", "run", f"{script}:job", "--workers",
                           "3", "--quiet", "--rescale-schedule", "0.4s:1,0.9s:3,1.4s:2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("state over workers") == 3, done.stderr
    import random
    truth: Counter[str] = Counter()
    for w in range(3):
        for e in range(60):
            rng = random.Random(w * 1000 + e)
            truth.update(f"w{rng.randrange(30)}" for _ in range(20))
    final: dict[str, int] = {}
    keys = []
    for w in range(3):
        data = json.loads((tmp_path / f"{w}.json").read_text())
        for k, c in data["final"].items():
            final[k] = max(final.get(k, 0), c)
        keys.append(data["keys"])
    assert final == dict(truth)
    assert keys[2] == 0 and keys[0] > 0 and keys[1] > 0  # the last roster is workers 0..1


# -- tokenflow nexmark query --rescale-schedule, tokenflow scale --------------------------------

NEXMARK_ARGS = ["--query", "q5", "--rate", "2000", "--granularity", "500", "--quiet"]


def _rows(directory: Path) -> Any:
    from tokenflow.io import read_committed
    from tokenflow.nexmark.queries import q5

    table = read_committed(directory, columns=q5.COLUMNS)
    return table.to_pandas().sort_values(q5.COLUMNS).reset_index(drop=True)


def _reference(events: int, tmp_path: Path) -> Any:
    from tokenflow.nexmark.run import run_query

    run_query("q5", events, rate=2000, workers=2, granularity_ms=500,
              output=tmp_path / "reference")
    return _rows(tmp_path / "reference")


def test_nexmark_query_with_a_rescale_schedule(tmp_path: Path) -> None:
    events = 60_000
    done = subprocess.run([sys.executable, "-m", "tokenflow", "nexmark", "query", *NEXMARK_ARGS,
                           "--events", str(events), "--workers", "3", "--runtime", "process",
                           "--lag", "1", "--rescale-schedule", "0.2s:1,0.5s:3,0.8s:2",
                           "--strategy", "batched", "--output", str(tmp_path / "out"),
                           "--control-file", str(tmp_path / "control.json")],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "state over workers 0..0" in done.stderr, done.stderr
    assert "migration 1 at time" in done.stdout, done.stdout
    pd_equal(_rows(tmp_path / "out"), _reference(events, tmp_path))
    assert not (tmp_path / "control.json").exists()  # removed at the end


def pd_equal(got: Any, expected: Any) -> None:
    import pandas as pd

    assert len(expected) > 0
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_scale_a_running_nexmark_query(tmp_path: Path) -> None:
    """``tokenflow scale`` reaches the running job through its coordinator (the control file
    written by the job, token-authenticated); the job's output is still the reference's."""
    import time

    # The job must outlive both ``tokenflow scale`` calls (done ~4 s after it starts: two
    # interpreters' start-up); at lag 1 on 3 processes 200K events run ~10 s (400K: ~20 s).
    events = 200_000
    control = tmp_path / "control.json"
    job = subprocess.Popen([sys.executable, "-m", "tokenflow", "nexmark", "query", *NEXMARK_ARGS,
                            "--events", str(events), "--workers", "3", "--runtime", "process",
                            "--lag", "1", "--elastic", "--output", str(tmp_path / "out"),
                            "--control-file", str(control)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not control.exists() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.05)
        assert control.exists(), job.communicate(timeout=60)
        assert control.stat().st_mode & 0o077 == 0  # it holds the job's token
        scaled = subprocess.run([sys.executable, "-m", "tokenflow", "scale", "--workers", "1",
                                 "--control-file", str(control), "--strategy", "fluid"],
                                capture_output=True, text=True, timeout=120)
        too_many = subprocess.run([sys.executable, "-m", "tokenflow", "scale", "--workers", "5",
                                   "--control-file", str(control)],
                                  capture_output=True, text=True, timeout=120)
        out, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, out + err
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    assert "state over workers 0..0" in scaled.stdout
    assert "state over workers 0..0" in err and "tokenflow scale" in err, err
    assert too_many.returncode == 1 and "not within the job's" in too_many.stderr, \
        too_many.stdout + too_many.stderr
    assert "migration 1 at time" in out, out
    pd_equal(_rows(tmp_path / "out"), _reference(events, tmp_path))


def test_scale_without_a_running_job(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tokenflow", "scale", "--workers", "2",
                           "--control-file", str(tmp_path / "none.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no running elastic job" in done.stderr


def test_elastic_options_are_checked() -> None:
    for extra, message in ((["--query", "q7", "--elastic"], "no migrating state"),
                           (["--query", "q5", "--rescale-schedule", "1s:3"], "worker processes"),
                           (["--query", "q5", "--elastic", "--strategy", "sideways"], "strategy"),
                           (["--query", "q5", "--elastic", "--checkpoint", "/nonexistent"],
                            "checkpoint")):
        done = subprocess.run([sys.executable, "-m", "tokenflow", "nexmark", "query", "--events",
                               "1000", "--workers", "2", *extra],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, (extra, done.stderr)
