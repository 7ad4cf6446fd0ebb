"""``run_query`` generates the events without the ``extra`` padding unless the query reads it
(``READS_EXTRA``): the queries that do not read it give the same rows either way, and Q0, which
passes bids through, still gets the padding the generator draws."""

from __future__ import annotations

from typing import Any

import pytest

import tokenflow.io.sources as sources_module
from tokenflow.nexmark.generator import generate
from tokenflow.nexmark.queries import load
from tokenflow.nexmark.run import run_query

EVENTS = 20_000


def rows(table: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    """``columns`` of an Arrow table or a pandas frame as sorted tuples."""
    if hasattr(table, "to_pylist"):
        values = [table.column(c).to_pylist() for c in columns]
    else:
        values = [table[c].tolist() for c in columns]
    return sorted(zip(*values, strict=True))


@pytest.mark.parametrize("name", ["q1", "q5"])
def test_a_query_that_does_not_read_the_padding_gets_the_same_rows_without_it(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []
    real = sources_module.generate

    def recording(first: int, count: int, config: Any = None, extra: bool = True) -> Any:
        asked.append(extra)
        return real(first, count, config, extra=extra)

    monkeypatch.setattr(sources_module, "generate", recording)
    projected = run_query(name, EVENTS, workers=2)
    assert asked and not any(asked)  # every read left the padding out
    asked.clear()
    monkeypatch.setattr(load(name), "READS_EXTRA", True, raising=False)
    whole = run_query(name, EVENTS, workers=2)
    assert asked and all(asked)
    columns = load(name).COLUMNS
    assert rows(projected.rows, columns) == rows(whole.rows, columns)
    assert len(projected.rows) > 0


def test_q0_passes_the_generated_padding_through() -> None:
    result = run_query("q0", EVENTS, workers=2)
    bids = generate(0, EVENTS)["bid"]
    columns = ["auction", "bidder", "price", "dateTime", "extra"]
    assert rows(result.rows, columns) == rows(bids, columns)
