"""Read NEXMark events from Parquet: the datasets ``tokenflow nexmark generate`` writes.

Source: docs/NEXMARK.md ("Event model": field names and units; ids ``int64``, prices ``int64``
cents, times ``int64`` ms since the Unix epoch); ``tokenflow.nexmark.generator.SCHEMAS``.

``read_events(directory)`` reads ``directory/person``, ``directory/auction`` and
``directory/bid`` (each a Parquet file or a directory of them, as Spark or ``write_parquet``
writes; names starting with ``.`` or ``_`` are skipped) into Arrow tables with exactly the
generator's schemas, sorted by ``dateTime``.  Every file is read with its own column types and
checked before any query sees it:

* **Time units** (``dateTime``; ``expires`` of auctions): ``timestamp[s|ms|us|ns]`` (with or
  without a time zone) and ``date32`` / ``date64`` become ms since the Unix epoch, floored
  (``tokenflow.io.times.epoch_ms``); integer columns are taken as ms.  Spark writes
  ``timestamp[us]``, so its datasets read as they are.  Floating-point, string and other types
  are refused.
* **Other columns**: integer columns of any width become ``int64`` (ids, prices in cents,
  categories); string columns (``string``, ``large_string``, dictionary-encoded) become
  ``utf8``.  Any other type is refused.
* **Nulls** are refused in every column a query reads (``REQUIRED``); the others
  (``emailAddress``, ``creditCard``, ``itemName``, ``description``, ``extra``) may hold nulls.
* **Values**: ids, prices and categories must be ``>= 0``; ``dateTime`` and ``expires`` must
  lie in ``[0, MAX_TIME_MS)`` (1970-01-01 to the end of year 9999); an auction's ``expires``
  must not be before its ``dateTime``.

Anything else is an ``InputError`` naming the file (its path, which holds the kind), the
column, the row (0-based, in the file) and the value.  Checks are vectorized per file.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from tokenflow.io.times import INT64_MAX, InputError, Locate, epoch_ms, first_null, first_true
from tokenflow.nexmark.generator import KINDS
from tokenflow.nexmark.generator import schema as kind_schema

TIME_COLUMNS = frozenset({"dateTime", "expires"})
"""Columns holding event times: ms since the Unix epoch after ``epoch_ms``."""

REQUIRED: dict[str, tuple[str, ...]] = {
    "person": ("id", "name", "city", "state", "dateTime"),
    "auction": ("id", "initialBid", "reserve", "dateTime", "expires", "seller", "category"),
    "bid": ("auction", "bidder", "price", "dateTime"),
}
"""Per kind, the columns that must not hold a null: every column a query reads (Q3: person
``name, city, state``; Q8: ``name``), all integer columns."""

NON_NEGATIVE: dict[str, str] = {
    "id": "an id", "auction": "an auction id", "bidder": "a person id", "seller": "a person id",
    "category": "a category id", "price": "a price in cents", "initialBid": "a price in cents",
    "reserve": "a price in cents",
}
"""Integer columns that must be ``>= 0``, and what they hold (for messages)."""

MAX_TIME_MS = 253_402_300_800_000
"""10000-01-01T00:00:00Z in ms since the Unix epoch: times must be before it."""


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text or type(exc).__name__


def _is_string(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return _is_string(kind.value_type)
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or getattr(pa.types, "is_string_view", lambda _: False)(kind))


def _check_types(file: str, schema: pa.Schema, wanted: pa.Schema) -> None:
    """Refuse a missing column or a type ``_convert`` cannot turn into ``wanted``'s (the columns
    read: ``SCHEMAS[kind]``, less the padding when it is not read)."""
    for field in wanted:
        if field.name not in schema.names:
            raise InputError(f"{file!r}: no column {field.name!r} (columns: {schema.names})")
        found = schema.field(field.name).type
        if field.name in TIME_COLUMNS:
            ok = (pa.types.is_integer(found) or pa.types.is_timestamp(found)
                  or pa.types.is_date(found))
            expected = ("int64 ms since the Unix epoch (an integer, timestamp or date column; "
                        "not a float or string)")
        elif field.type == pa.int64():
            ok, expected = pa.types.is_integer(found), "int64 (an integer column)"
        else:
            ok, expected = _is_string(found), "string"
        if not ok:
            raise InputError(f"{file!r}: column {field.name!r} has type {found}, expected {expected}")


def _convert(table: pa.Table, file: str, kind: str, schema: pa.Schema) -> pa.Table:
    """``table`` (one file's rows, its own column types) as ``schema`` (the columns read of
    ``kind``), checked (see the module docstring)."""

    def locate(column: str) -> Locate:
        return lambda i: f"{file!r}, column {column!r}, row {i}"

    for name in REQUIRED[kind]:
        row = first_null(table.column(name))
        if row >= 0:
            raise InputError(f"{locate(name)(row)}: null (value None); the NEXMark queries need "
                             f"every {kind}'s {name}")
    arrays: dict[str, pa.Array] = {}
    for field in schema:
        column = table.column(field.name)
        if field.name in TIME_COLUMNS:
            values = epoch_ms(column, locate(field.name), floats=False, what=field.name)
            bad = first_true((values < 0) | (values >= MAX_TIME_MS))
            if bad >= 0:
                raise InputError(
                    f"{locate(field.name)(bad)}: value {int(values[bad])} ms since the Unix epoch "
                    f"is {'negative' if values[bad] < 0 else 'after the year 9999'}")
            arrays[field.name] = pa.array(values, pa.int64())
        elif field.type == pa.int64():
            if column.type == pa.uint64():
                bad = first_true(pc.fill_null(pc.greater(column, pa.scalar(INT64_MAX, pa.uint64())),
                                              False))
                if bad >= 0:
                    raise InputError(f"{locate(field.name)(bad)}: value {column[bad].as_py()} is "
                                     f"out of range of int64")
            converted = column.cast(pa.int64()).combine_chunks()
            if field.name in NON_NEGATIVE:
                bad = first_true(pc.fill_null(pc.less(converted, 0), False))
                if bad >= 0:
                    raise InputError(f"{locate(field.name)(bad)}: value {converted[bad].as_py()} "
                                     f"is negative ({field.name} is {NON_NEGATIVE[field.name]})")
            arrays[field.name] = converted
        else:
            try:
                arrays[field.name] = column.cast(pa.utf8()).combine_chunks()
            except pa.ArrowException as exc:
                raise InputError(f"{file!r}: column {field.name!r}: {_reason(exc)}") from exc
    if "expires" in arrays:
        date = arrays["dateTime"].to_numpy()
        expires = arrays["expires"].to_numpy()
        bad = first_true(expires < date)
        if bad >= 0:
            raise InputError(f"{locate('expires')(bad)}: value {int(expires[bad])} ms is before "
                             f"the auction's dateTime {int(date[bad])} ms")
    return pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema)



def read_kind(directory: str | os.PathLike[str], kind: str, extra: bool = True) -> pa.Table:
    """``directory/kind`` as a table with ``SCHEMAS[kind]`` (columns in that order; times in ms
    since the Unix epoch, ids and prices int64, strings utf8; see the module docstring for the
    conversions and checks), sorted by ``dateTime`` (stable: files in path order, rows in file
    order).  ``extra`` False: without the ``extra`` padding, which is then not read (a file
    need not have it; ``generator.schema(kind, False)``).

    Raises:
        InputError: the path does not exist or is not readable Parquet (naming the dataset or
            the file); a file lacks a column or has a column of a refused type (naming the
            file, column and type); a null in a ``REQUIRED`` column, a negative id or price, a
            time outside ``[0, MAX_TIME_MS)`` or an ``expires`` before its ``dateTime``
            (naming the file, column, row and value).
    """
    path = os.path.join(os.fspath(directory), kind)
    if not os.path.exists(path):
        raise InputError(f"no {kind} events at {path!r}: expected {', '.join(KINDS)} under "
                         f"{os.fspath(directory)!r} (as `tokenflow nexmark generate` writes)")
    try:
        fragments = list(ds.dataset(path, format="parquet").get_fragments())
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read Parquet dataset {path!r}: {_reason(exc)}") from exc
    schema = kind_schema(kind, extra)
    tables = []
    for fragment in fragments:
        file = fragment.path
        try:
            physical = fragment.physical_schema
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"cannot read Parquet dataset {path!r}: file {file!r}: "
                             f"{_reason(exc)}") from exc
        _check_types(file, physical, schema)
        try:
            raw = fragment.to_table(schema=physical, columns=schema.names)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"cannot read Parquet dataset {path!r}: file {file!r}: "
                             f"{_reason(exc)}") from exc
        tables.append(_convert(raw, file, kind, schema))
    if not tables:
        return schema.empty_table()
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    values = table.column("dateTime").to_numpy()
    if len(values) > 1 and (np.diff(values) < 0).any():
        table = table.take(np.argsort(values, kind="stable"))
    return table.combine_chunks()


def read_events(directory: str | os.PathLike[str], extra: bool = True) -> dict[str, pa.Table]:
    """``{"person", "auction", "bid"}`` tables from ``directory`` (see ``read_kind``; ``extra``
    False: without the padding column, not read).

    Raises:
        InputError: see ``read_kind``.
    """
    return {kind: read_kind(directory, kind, extra) for kind in KINDS}


__all__ = ["MAX_TIME_MS", "NON_NEGATIVE", "REQUIRED", "TIME_COLUMNS", "read_events", "read_kind"]
