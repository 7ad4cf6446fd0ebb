"""``--move-sources``: with ``--max-workers`` a joining worker of ``tokenflow nexmark query``
reads a share of the generator's splits and a leaving one hands its share back; without
``--max-workers`` the flag is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tokenflow.nexmark.run import run_query

pytestmark = pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")


def query(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenflow", "nexmark", "query", "-q", "q5",
                           "--runtime", "thread", "--granularity", "100", "--quiet", *args],
                          capture_output=True, text=True, timeout=240)


def test_nexmark_query_moves_sources_to_a_joining_worker_and_back() -> None:
    done = query("--events", "600000", "--workers", "2", "--max-workers", "3", "--move-sources",
                 "--rescale-schedule", "0.2s:3,0.8s:2")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = len(run_query("q5", 600_000, workers=2, granularity_ms=100).rows)
    assert f"output: {rows} rows" in done.stdout
    assert "workers [0, 1] -> [0, 1, 2]" in done.stdout  # joined (with a share of the splits)
    assert "workers [0, 1, 2] -> [0, 1]" in done.stdout  # and left (handing it back)
    assert "error" not in (done.stdout + done.stderr).lower()
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("events read per worker")]
    shares = {int(w): int(n.replace(",", "")) for w, n in
              (part.split(": ") for part in line.split(": ", 1)[1].split(", "))}
    assert sum(shares.values()) == 600_000 and shares[2] > 0  # every event once; 2 read some


def test_move_sources_needs_free_worker_slots() -> None:
    done = query("--events", "1000", "--workers", "2", "--move-sources")
    assert done.returncode == 2
    assert "--move-sources needs --max-workers" in done.stderr
