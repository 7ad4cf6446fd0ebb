"""``benchmarks/recovery.py``'s incremental-checkpoint section runs against today's state API.

Section 4 of the recovery benchmark captures a ``KeyedState`` through ``ChangeLog`` and writes
full, checksum-incremental and tracked-incremental checkpoints of it; it reads the
incremental ones back and asserts they equal the changed state.  It broke once unnoticed
when a capture started leaving its export to the writer (``Capture.resolve``), and with it
the rest of a 25-minute run: here it runs on a small state.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
if BENCHMARKS not in sys.path:  # the benchmarks import their siblings as top-level modules
    sys.path.insert(0, BENCHMARKS)

import recovery  # noqa: E402


def test_incremental_checkpoints_write_only_the_changed_bins(tmp_path: Path) -> None:
    """200,000 keys: ~50 per bin, past the size at which a full capture groups small bins into
    shared blobs (which a checksum-incremental part then rewrites whole)."""
    result, exports = recovery.measure_incremental(200_000, 0.03, 1, tmp_path,
                                                   np.random.default_rng(3))
    assert result.changed_bins == round(0.03 * recovery.BINS)
    # the tracked capture exported the changed bins that hold keys, no others
    assert 0 < result.tracked_bins <= result.changed_bins
    for written, reused in ((result.tracked_bytes, result.tracked_reused),
                            (result.incremental_bytes, result.incremental_reused)):
        assert 0 < written < result.full_bytes * 0.1
        assert reused > result.full_bytes * 0.8
    assert sum(len(e) for e in exports) == result.bins_used
