"""NEXMark queries as tokenflow dataflows, each with a Spark SQL twin for validation.

Source: docs/NEXMARK.md ("Queries").  The registry lists the implemented queries;
``load(name)`` imports ``tokenflow.nexmark.queries.<name>`` on first use.

Module interface (every ``qN.py``):

``COLUMNS: list[str]``
    The output column names, in order.
``build(streams: dict[str, Stream], config: GeneratorConfig) -> Stream``
    ``streams`` holds ``"person"``, ``"auction"`` and ``"bid"``: streams of Arrow record batches
    with the generator's schemas (``tokenflow.nexmark.SCHEMAS``; Beam's field names, ids and
    prices in cents as ``int64``, times in ms since the Unix epoch), each message at a logical
    time ``<=`` the ``dateTime`` of each of its rows (``nexmark_source`` uses ``dateTime``
    rounded down to its granularity).  The result is a stream of Arrow record batches with
    exactly ``COLUMNS``; the logical time of an output message is documented by each query.
    ``build`` must create the same operators on every worker (it runs once per worker).
``SPARK_SQL: str``
    One Spark SQL query over the temp views ``person``, ``auction`` and ``bid`` (the same
    events, read from Parquet) producing the same columns: the independent engine the dataflow
    result is checked against.
``READS_EXTRA: bool`` (optional, default False)
    Whether ``build`` reads any kind's ``extra`` padding.  Without it ``run_query`` generates
    the events without that column (``generate(extra=False)``: every other value the same, about
    half of the generator's work saved), and the streams' schemas lack it.
``compare(dataflow: pd.DataFrame, spark: pd.DataFrame) -> None`` (optional)
    Raises ``AssertionError`` when the two results disagree; the default is
    ``compare_exact``: exact equality of the row multisets.

Stateful operators keep their state in plain dicts, lists and Arrow arrays held by a small
state object per operator and worker (see ``q3.JoinState`` and ``q8.WindowState``), which
offers ``snapshot()`` / ``restore()`` and is a ``BinnedState`` (``_windows.ColumnarState``)
the operator declares with ``OperatorInfo.state``: the system exports it per bin of its key
column and, when a job is restored at any worker count, loads the bins a worker owns into it
before the operator runs; the operator then re-mints its tokens at ``pending_times()``
(Megaphone, Hoffmann et al., VLDB 2019; the timestamp-tokens paper §5).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pandas as pd

QUERIES: tuple[str, ...] = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8")
"""The implemented queries, in order."""


def reads_extra(query: ModuleType) -> bool:
    """The query module's ``READS_EXTRA`` (False when it does not say)."""
    return bool(getattr(query, "READS_EXTRA", False))


def load(name: str) -> ModuleType:
    """The query module ``tokenflow.nexmark.queries.<name>`` (imported lazily).

    Raises:
        ValueError: for a name not in ``QUERIES``, e.g.
            ``unknown query 'q9'; available: q0, q1, q2, q3, q4, q5, q7, q8``.
    """
    if name not in QUERIES:
        raise ValueError(f"unknown query {name!r}; available: {', '.join(QUERIES)}")
    return importlib.import_module(f"{__name__}.{name}")


def compare_exact(dataflow: pd.DataFrame, spark: pd.DataFrame, columns: list[str] | None = None) -> None:
    """Assert that two results hold the same multiset of rows (the default ``compare``).

    Both frames must have exactly ``columns`` (default: the dataflow frame's columns, in
    order); rows are sorted by every column and compared value by value (integers as
    ``int64``, everything else as Python objects).

    Raises:
        AssertionError: naming the difference (columns, row counts, or the first rows that
            only one side has).
    """
    columns = list(dataflow.columns) if columns is None else list(columns)
    if list(dataflow.columns) != columns:
        raise AssertionError(f"dataflow columns {list(dataflow.columns)} != {columns}")
    if list(spark.columns) != columns:
        raise AssertionError(f"spark columns {list(spark.columns)} != {columns}")
    left = _canonical(dataflow, columns)
    right = _canonical(spark, columns)
    if len(left) != len(right) or not left.equals(right):
        merged = left.merge(right, how="outer", indicator=True)
        only_left = merged[merged["_merge"] == "left_only"].drop(columns="_merge")
        only_right = merged[merged["_merge"] == "right_only"].drop(columns="_merge")
        raise AssertionError(
            f"results differ: dataflow {len(left)} rows, spark {len(right)} rows; "
            f"{len(only_left)} distinct rows only in dataflow (first: "
            f"{only_left.head(3).to_dict('records')}), {len(only_right)} only in spark (first: "
            f"{only_right.head(3).to_dict('records')})"
            + ("" if len(only_left) or len(only_right) else "; same rows, different multiplicities"))


def _canonical(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    out = pd.DataFrame({
        c: frame[c].astype("int64") if pd.api.types.is_integer_dtype(frame[c].dtype)
        else frame[c].astype(object)
        for c in columns
    })
    return out.sort_values(columns, kind="stable").reset_index(drop=True)


def compare(name: str, dataflow: pd.DataFrame, spark: pd.DataFrame) -> None:
    """Check a dataflow result against the Spark SQL result with the query's ``compare``
    (``compare_exact`` over its ``COLUMNS`` when it defines none).

    Raises:
        ValueError: unknown query.
        AssertionError: the results differ.
    """
    module = load(name)
    check = getattr(module, "compare", None)
    if check is None:
        compare_exact(dataflow, spark, list(module.COLUMNS))
    else:
        check(dataflow, spark)


__all__ = ["QUERIES", "compare", "compare_exact", "load", "reads_extra"]
