"""``tokenflow run --rescale-schedule``: the job's migrating state follows the schedule while
it runs, and its output is still the unrescaled one."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

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
