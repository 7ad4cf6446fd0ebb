"""Fixtures of the recovery tests: the word-count input and its failure-free output."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from recovery_jobs import NAME, committed_rows, wordcount, words_table

from tokenflow import execute


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return words_table()


@pytest.fixture(scope="module")
def expected(table: pa.Table, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Any, ...]]:
    """The committed rows of a failure-free run (one per input row)."""
    out = tmp_path_factory.mktemp("whole")
    execute(wordcount(table, str(out)), workers=2, name=NAME)
    rows = committed_rows(out)
    assert len(rows) == table.num_rows
    return rows
