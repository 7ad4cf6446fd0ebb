"""Worker-side access to the Spark partition of each named input (see ``runtime``), and the
driver-side RDD that carries local Arrow tables to the workers (``arrow_partitions``).

Two partition layouts reach a task (``split_inputs`` tells them apart by their items):

- *Spark DataFrames* (``runtime._input_partitions``): Arrow batches of one row per input
  row, columns prefixed per input (``__tf<k>_<column>``) plus the input tag; repartitioned
  by a hash of every column.
- *Local Arrow tables* (``arrow_partitions``): chunk tuples ``(input index, worker, seq,
  Arrow IPC stream of up to CHUNK_ROWS rows)``.  The driver deals rows to workers
  round-robin by position (``tokenflow.inputs.partition_inputs``, so worker ``i`` reads the
  same rows as on the thread and process runtimes) and sorts each share by its time column;
  Spark holds only ``W × chunks`` binary items, already in their partitions, so a table
  crosses the JVM as Arrow buffers without a per-row conversion, a shuffle or a sort.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

Chunk = tuple[int, int, int, bytes]
"""An item of ``arrow_partitions``: ``(input index, worker, seq, ipc)``, ``seq`` the chunk's
position in its worker's share of that input (padding after it), ``ipc`` one Arrow IPC stream
holding one record batch of the input (empty for padding); the reading task checks
``worker``."""
CHUNK_ROWS = 65536
"""Rows per IPC stream of ``arrow_partitions``."""
MAX_SHARE_BYTES = 1 << 30
"""Most bytes (Arrow buffers) of one worker's share that ``arrow_partitions`` carries:
``SparkContext.parallelize`` pickles a worker's chunks as one value with a 32-bit length,
which the JVM reads into one array (under 2 GiB); tables with a larger share go to Spark as a
DataFrame instead (``runtime._input_partitions``)."""


def is_local_table(value: Any) -> bool:
    """True for the inputs ``arrow_partitions`` carries: a ``pa.Table``, a ``pa.RecordBatch`` or a
    pandas DataFrame (anything else is taken as a Spark DataFrame)."""
    return isinstance(value, pa.Table | pa.RecordBatch) or \
        type(value).__module__.startswith("pandas")


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def arrow_partitions(spark: Any, inputs: dict[str, Any], workers: int, sort_by: dict[str, str],
                     ) -> tuple[Any, list[tuple[str, list[str]]]] | None:
    """An RDD of ``workers`` partitions that hands each worker its share of local tables, or
    None when a share holds more than ``MAX_SHARE_BYTES``.

    Worker ``i``'s chunks (padded with empty ones to as many as the worker with the most has)
    are positions ``[i C, (i + 1) C)`` of one list that ``SparkContext.parallelize`` cuts
    into ``workers`` slices, which gives slice ``i`` exactly those positions: no shuffle, sort
    or extra stage runs before the barrier stage (a DataFrame ``repartition`` by a key cost
    a stage of its own, 0.2-0.3 s).  The barrier task checks each chunk's worker against
    its partition.

    Args:
        spark: the SparkSession.
        inputs: input name -> ``pa.Table``, ``pa.RecordBatch`` or pandas DataFrame.
        workers: the number of partitions (= workers).
        sort_by: input name -> the column its shares are sorted by (ascending, stable).

    Returns:
        ``(rdd, layout)``: the RDD's partition ``i`` holds worker ``i``'s ``Chunk``s (in input
        and ``seq`` order), and per input ``(name, its columns)``.  Which rows worker ``i``
        gets depends only on the table and ``workers`` (round-robin by position), never on
        the run.  None: a share is too large to go this way.

    Raises:
        KeyError: a ``sort_by`` column missing from its input.
    """
    from tokenflow.inputs import as_table, partition_inputs

    tables = {name: as_table(value, name) for name, value in inputs.items()}
    shares = partition_inputs(tables, workers, sort_by, batch_rows=CHUNK_ROWS)
    if max(sum(b.nbytes for batches in share.values() for b in batches)
           for share in shares) > MAX_SHARE_BYTES:
        return None
    per_worker: list[list[Chunk]] = [[(k, i, j, _ipc(batch)) for k, name in enumerate(tables)
                   for j, batch in enumerate(share[name])] for i, share in enumerate(shares)]
    most = max(map(len, per_worker))
    last = len(tables) - 1
    empty = _ipc(pa.RecordBatch.from_pylist([], schema=list(tables.values())[last].schema))
    items: list[Chunk] = [chunk for i, chunks in enumerate(per_worker) for chunk in
                          chunks + [(last, i, len(chunks) + p, empty)
                                    for p in range(most - len(chunks))]]
    layout = [(name, list(table.column_names)) for name, table in tables.items()]
    return spark.sparkContext.parallelize(items, workers), layout


def split_inputs(batches: Iterator[Any], layout: list[tuple[str, list[str]]],
                 tag: str, partition: int | None = None) -> dict[str, Any]:
    """Map input name → iterable of this worker's Arrow batches (original column names).

    ``batches``: the task's partition, Arrow batches of a DataFrame partition or the
    ``Chunk``s of an ``arrow_partitions`` one (with no inputs, anything: it is consumed).
    With one input the partition streams lazily; with several, rows are grouped by input in
    memory first (the partition is sorted by input tag, so each input is one contiguous run).
    Chunks are decoded one by one; ``partition`` (default: the running Spark task's
    partition, if any) is checked against each chunk's worker.

    Raises:
        RuntimeError: (while reading) a chunk that belongs to another partition.
    """
    if not layout:
        for _ in batches:
            pass
        return {}
    batches = iter(batches)
    first = next(batches, None)
    if first is None:
        return {name: _OneShot(iter(())) for name, _ in layout}
    batches = itertools.chain([first], batches)
    if isinstance(first, tuple):
        return _split_chunks(batches, layout, partition)
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


def _task_partition() -> int | None:
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is there when a task runs
        return None
    context = TaskContext.get()
    return None if context is None else int(context.partitionId())


def _split_chunks(chunks: Iterator[Chunk], layout: list[tuple[str, list[str]]],
                  partition: int | None) -> dict[str, Any]:
    """``split_inputs`` for a partition of ``arrow_partitions``: decode the chunks in order."""
    expected = _task_partition() if partition is None else partition

    def decoded(items: Iterator[Chunk]) -> Iterator[tuple[int, pa.RecordBatch]]:
        for k, owner, _seq, blob in items:
            if expected is not None and owner != expected:
                raise RuntimeError(f"partition {expected} holds a chunk for worker {owner}: "
                                   f"Spark did not keep arrow_partitions' slices")
            for batch in pa.ipc.open_stream(blob):
                if batch.num_rows:
                    yield k, batch

    if len(layout) == 1:
        return {layout[0][0]: _OneShot(b for _, b in decoded(chunks))}
    grouped: dict[int, list[pa.RecordBatch]] = {k: [] for k in range(len(layout))}
    for k, batch in decoded(chunks):
        grouped[k].append(batch)
    return {name: _OneShot(iter(grouped[k])) for k, (name, _) in enumerate(layout)}


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
