"""Worker-side access to the Spark partition of each named input (see ``runtime``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def split_inputs(batches: Iterator[pa.RecordBatch], layout: list[tuple[str, list[str]]],
                 tag: str) -> dict[str, Any]:
    """Map input name → iterable of this worker's Arrow batches (original column names).

    With one input the partition streams lazily; with several, rows are grouped by input in
    memory first (the partition is sorted by input tag, so each input is one contiguous run).
    """
    if not layout:
        for _ in batches:
            pass
        return {}
    if len(layout) == 1:
        name, cols = layout[0]
        return {name: _OneShot(_select(batches, 0, cols))}
    grouped: dict[int, list[pa.RecordBatch]] = {k: [] for k in range(len(layout))}
    for batch in batches:
        tags = batch.column(tag)
        for k in range(len(layout)):
            part = batch.filter(pc.equal(tags, k))
            if part.num_rows:
                grouped[k].append(part)
    return {name: _OneShot(_select(iter(grouped[k]), k, cols))
            for k, (name, cols) in enumerate(layout)}


def _select(batches: Iterator[pa.RecordBatch], k: int, cols: list[str]) -> Iterator[pa.RecordBatch]:
    prefix = f"__tf{k}_"
    for batch in batches:
        if batch.num_rows:
            yield pa.RecordBatch.from_arrays([batch.column(prefix + c) for c in cols], cols)


class _OneShot:
    """An iterator of batches that can be consumed once (a Spark partition)."""

    def __init__(self, it: Iterator[pa.RecordBatch]) -> None:
        self._it: Iterator[pa.RecordBatch] | None = it

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._it is None:
            raise RuntimeError("this input partition was already consumed")
        it, self._it = self._it, None
        return it
