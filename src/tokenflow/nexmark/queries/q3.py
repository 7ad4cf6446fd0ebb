"""NEXMark Q3: local item suggestion — auctions in category 10 by sellers in OR, ID or CA.

Source: docs/NEXMARK.md ("Queries": Q3, auctions in category 10 joined with sellers whose
state is OR, ID or CA → (name, city, state, auction id)); Beam's ``Query3``.

Output ``COLUMNS``: ``name, city, state, id`` — the seller's name, city and state (``utf8``) and
the auction's ``id`` (``int64``), one row per matching auction.

Dataflow (an incremental, symmetric hash join):

1. ``Q3Auctions`` keeps auctions with ``category == 10`` as ``(id, seller)``; ``Q3Persons`` keeps
   persons with ``state in (OR, ID, CA)`` as ``(id, name, city, state)`` (vectorized filters,
   pipeline pact).
2. ``Q3Join`` receives auctions exchanged by ``seller`` and persons by ``id``
   (``Exchange(column=...)``), so a seller and its auctions meet on one worker.  Its
   ``JoinState`` (per worker, kept for the whole run) holds every person seen, indexed by id,
   and every auction whose seller has not arrived yet (in this generator an auction may name a
   person created up to 10 persons later, or one whose state is filtered out, who never
   arrives).  Each arriving batch is first matched against the other side's state, then
   added to its own side's state, so a match is emitted exactly once, when both sides have
   arrived, whatever the order.  Person ids are unique (as the generator guarantees).
3. Logical time of an output row: ``max(time of the auction's message, time of the person's
   message)`` — the same whichever side arrives second, so results and their times do not
   depend on scheduling.  The join holds no tokens between activations: outputs are sent with
   the arriving message's token (delayed to that maximum).

Memory: one entry per matching person and one per waiting auction, for the whole run.

State: ``Q3Join`` declares its ``JoinState`` as ``"join"`` (``OperatorInfo.state``): persons
exported per bin of their ``id``, waiting auctions per bin of their ``seller`` — the columns
the two inputs are exchanged by — so a job restored at another worker count finds each
person and each waiting auction on the worker its exchange now routes it to.  The join holds
no tokens, so nothing is re-minted.
"""

from __future__ import annotations

from itertools import chain, repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, binary
from tokenflow.dataflow.routing import column_hashes
from tokenflow.dataflow.stream import Stream
from tokenflow.nexmark.generator import GeneratorConfig
from tokenflow.nexmark.queries._windows import ColumnarState, Taken, int_column, key_hashes

COLUMNS: list[str] = ["name", "city", "state", "id"]
SCHEMA: pa.Schema = pa.schema([("name", pa.utf8()), ("city", pa.utf8()), ("state", pa.utf8()),
                               ("id", pa.int64())])
CATEGORY = 10
"""Auctions of this category are reported."""
STATES = ("OR", "ID", "CA")
"""Sellers from these states are reported."""

SPARK_SQL = """
SELECT p.name, p.city, p.state, a.id
FROM auction a JOIN person p ON a.seller = p.id
WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')
"""

PERSON_SCHEMA = pa.schema([("name", pa.utf8()), ("city", pa.utf8()), ("state", pa.utf8())])
"""The person columns the join keeps (the key, ``id``, is in ``JoinState.person_row``)."""


WAITING_SCHEMA = pa.schema([("seller", pa.int64()), ("auction", pa.int64()), ("time", pa.int64())])
"""Waiting auctions as exported rows: the seller waited for, the auction id, its message's
logical time (ms)."""


class JoinState(ColumnarState):
    """The ``Q3Join`` state of one worker: persons seen and auctions waiting for their seller.

    Attributes:
        person_row: person id -> row of that person in ``persons()`` and ``times()``.
        waiting: seller id -> ``[(auction id, logical time of its message), ...]`` for auctions
            whose seller has not arrived, in arrival order.

    The persons' ``(name, city, state)`` rows live in a list of Arrow tables, merged so that
    at most ``log2(rows)`` tables are kept (merging a table into its predecessor when it has
    grown as large), so looking rows up stays cheap and appending costs O(rows) amortized;
    the logical time (ms) of each person's message is in a growing ``int64`` numpy buffer.

    As a ``BinnedState`` (``ColumnarState``): part 0, the persons ``(id, name, city, state,
    time)`` keyed by ``id``; part 1, the waiting auctions (``WAITING_SCHEMA``) keyed by
    ``seller``, each seller's auctions in arrival order.  No pending times (the join holds no
    tokens).
    """

    PARTS = (("id", "name", "city", "state", "time"), tuple(WAITING_SCHEMA.names))

    def __init__(self) -> None:
        self.person_row: dict[int, int] = {}
        self.waiting: dict[int, list[tuple[int, int]]] = {}
        self._tables: list[pa.Table] = []  # person (name, city, state), in row order
        self._times = np.empty(1024, dtype=np.int64)  # person message time per row (a prefix)
        self._rows = 0

    # -- the two sides ---------------------------------------------------------------------

    def add_persons(self, ids: np.ndarray, rows: pa.RecordBatch,
                    time: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Store persons ``ids`` (with ``rows``: ``PERSON_SCHEMA``) that arrived at ``time``
        and release the auctions waiting for them.

        Returns:
            ``(person rows, auction ids, output times)`` of the new matches (``int64``).
        """
        first = self._rows
        n = len(ids)
        if n == 0:
            return _EMPTY, _EMPTY, _EMPTY
        self.person_row.update(zip(ids.tolist(), range(first, first + n), strict=True))
        self._append(pa.Table.from_batches([rows]), np.full(n, time, dtype=np.int64))
        if not self.waiting:
            return _EMPTY, _EMPTY, _EMPTY
        released = list(map(self.waiting.pop, ids.tolist(), repeat(None)))
        hits = [i for i, w in enumerate(released) if w]
        if not hits:
            return _EMPTY, _EMPTY, _EMPTY
        lists = [w for w in released if w]
        counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        pairs = np.array([p for w in lists for p in w], dtype=np.int64).reshape(-1, 2)
        person_rows = np.repeat(np.asarray(hits, dtype=np.int64) + first, counts)
        return person_rows, pairs[:, 0], np.maximum(pairs[:, 1], time)

    def match_auctions(self, ids: np.ndarray, sellers: np.ndarray,
                       time: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Match auctions ``ids`` (sellers ``sellers``) that arrived at ``time`` with the
        stored persons; the unmatched ones wait for their seller.

        Returns:
            ``(person rows, auction ids, output times)`` of the matches (``int64``).
        """
        n = len(ids)
        rows = np.fromiter(map(self.person_row.get, sellers.tolist(), repeat(-1)),
                           dtype=np.int64, count=n)
        hit = rows >= 0
        if not hit.all():
            miss = ~hit
            for seller, auction in zip(sellers[miss].tolist(), ids[miss].tolist(), strict=True):
                self.waiting.setdefault(seller, []).append((auction, time))
        rows = rows[hit]
        return rows, ids[hit], np.maximum(self.times()[rows], time)

    # -- rows --------------------------------------------------------------------------------

    def _append(self, table: pa.Table, times: np.ndarray) -> None:
        end = self._rows + table.num_rows
        if end > len(self._times):
            grown = np.empty(max(end, 2 * len(self._times)), dtype=np.int64)
            grown[: self._rows] = self._times[: self._rows]
            self._times = grown
        self._times[self._rows : end] = times
        self._rows = end
        self._tables.append(table)
        while len(self._tables) > 1 and self._tables[-2].num_rows <= self._tables[-1].num_rows:
            last = self._tables.pop()
            self._tables[-1] = pa.concat_tables([self._tables[-1], last]).combine_chunks()

    def persons(self) -> pa.Table:
        """Every stored person's ``(name, city, state)``, by row."""
        if not self._tables:
            return PERSON_SCHEMA.empty_table()
        return pa.concat_tables(self._tables)

    def times(self) -> np.ndarray:
        """The logical time of each stored person's message, by row (a view)."""
        return self._times[: self._rows]

    def output(self, person_rows: np.ndarray, auction_ids: np.ndarray) -> pa.RecordBatch:
        """Output rows (``SCHEMA``) for matched ``person_rows`` and ``auction_ids``."""
        people = self.persons().take(pa.array(person_rows))
        return pa.RecordBatch.from_arrays(
            [people.column("name").combine_chunks(), people.column("city").combine_chunks(),
             people.column("state").combine_chunks(), pa.array(auction_ids, pa.int64())],
            schema=SCHEMA)

    # -- checkpoints --------------------------------------------------------------------------

    def person_table(self) -> pa.Table:
        """Every stored person as ``(id, name, city, state, time)`` (a copy), by row."""
        ids = np.empty(self._rows, dtype=np.int64)
        n = len(self.person_row)  # == rows: person ids are unique
        if n:
            ids[np.fromiter(self.person_row.values(), dtype=np.int64, count=n)] = \
                np.fromiter(self.person_row.keys(), dtype=np.int64, count=n)
        persons = self.persons()
        return pa.table({"id": ids, "name": persons.column("name"), "city": persons.column("city"),
                         "state": persons.column("state"), "time": self.times().copy()})

    def waiting_table(self) -> pa.Table:
        """Every waiting auction as a ``WAITING_SCHEMA`` row, each seller's in arrival order."""
        if not self.waiting:
            return WAITING_SCHEMA.empty_table()
        counts = np.fromiter(map(len, self.waiting.values()), dtype=np.int64,
                             count=len(self.waiting))
        sellers = np.repeat(np.fromiter(self.waiting.keys(), dtype=np.int64,
                                        count=len(self.waiting)), counts)
        pairs = np.array([p for w in self.waiting.values() for p in w],
                         dtype=np.int64).reshape(-1, 2)
        return pa.table([sellers, pairs[:, 0], pairs[:, 1]], schema=WAITING_SCHEMA)

    def held_rows(self) -> int:
        return self._rows + sum(map(len, self.waiting.values()))

    def rows(self) -> list[tuple[pa.Table, np.ndarray | None]]:
        persons, waiting = self.person_table(), self.waiting_table()
        return [(persons, key_hashes(persons, "id")), (waiting, key_hashes(waiting, "seller"))]

    def take_rows(self, member: np.ndarray) -> list[Taken]:
        """Remove the persons and waiting auctions of ``member`` bins.

        Persons: one hash of every stored id and a mask filter of the rows, times and ids;
        when some go, the kept rows are renumbered (one table, and ``person_row`` rebuilt
        from the kept ids with ``dict(zip(...))``: a C-level pass, no Python per row).
        Waiting auctions: one hash of the waiting sellers; the taken sellers' lists are
        popped (``map``), the others stay as they are."""
        n = self._rows
        ids = np.empty(n, dtype=np.int64)
        if n:
            ids[np.fromiter(self.person_row.values(), dtype=np.int64, count=n)] = \
                np.fromiter(self.person_row.keys(), dtype=np.int64, count=n)
        hashes = column_hashes(pa.array(ids))
        mask = self.in_bins(hashes, member)
        times = self.times()
        if mask.any():
            persons = self.persons().combine_chunks()
            taken = persons.filter(pa.array(mask))
            people = pa.table({"id": ids[mask], "name": taken.column("name"),
                               "city": taken.column("city"), "state": taken.column("state"),
                               "time": times[mask]})
            keep = ~mask
            kept_ids, kept_times = ids[keep], times[keep]
            kept = persons.filter(pa.array(keep))
            self._tables, self._rows = [], 0
            self.person_row = dict(zip(kept_ids.tolist(), range(len(kept_ids)), strict=True))
            if len(kept_ids):
                self._append(kept, kept_times)
        else:
            people = self.person_table().slice(0, 0)
        out = [Taken(people, hashes[mask], n > 0)]
        sellers = np.fromiter(self.waiting.keys(), dtype=np.int64, count=len(self.waiting))
        seller_hashes = column_hashes(pa.array(sellers))
        gone = sellers[self.in_bins(seller_hashes, member)]
        if len(gone) == 0:
            return [*out, Taken(WAITING_SCHEMA.empty_table(), seller_hashes[:0],
                                any(self.waiting.values()))]
        held = any(self.waiting.values())
        lists = list(map(self.waiting.pop, gone.tolist()))
        counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        pairs = np.array(list(chain.from_iterable(lists)), dtype=np.int64).reshape(-1, 2)
        waiting = pa.table([np.repeat(gone, counts), pairs[:, 0], pairs[:, 1]],
                           schema=WAITING_SCHEMA)
        return [*out, Taken(waiting, key_hashes(waiting, "seller"), held)]

    def add_rows(self, part: int, table: pa.Table) -> None:
        if part == 0:
            ids = table.column("id").to_numpy()
            first = self._rows
            self.person_row.update(zip(ids.tolist(), range(first, first + len(ids)), strict=True))
            self._append(table.select(PERSON_SCHEMA.names).cast(PERSON_SCHEMA).combine_chunks(),
                         int_column(table, "time"))
            return
        waiting = self.waiting
        for seller, auction, time in zip(int_column(table, "seller").tolist(),
                                         int_column(table, "auction").tolist(),
                                         int_column(table, "time").tolist(), strict=True):
            waiting.setdefault(seller, []).append((auction, time))

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def snapshot(self) -> dict[str, Any]:
        """The state as plain data: ``{"persons": Table(id, name, city, state, time),
        "waiting": {seller: [(auction id, time), ...]}}`` (copies; safe to pickle)."""
        return {"persons": self.person_table(),
                "waiting": {k: list(v) for k, v in self.waiting.items()}}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Replace the state by a ``snapshot()``."""
        table: pa.Table = snapshot["persons"]
        self.clear()
        if table.num_rows:
            self.add_rows(0, table)
        self.waiting = {k: list(v) for k, v in snapshot["waiting"].items()}


_EMPTY = np.empty(0, dtype=np.int64)


def _send(output: OperatorOutput, ref: Any, batch: pa.RecordBatch, times: np.ndarray) -> None:
    """Send ``batch``'s rows at their ``times`` (each ``>= ref.time``), one message per time."""
    if len(times) == 0:
        return
    first = int(times[0])
    if (times == first).all():
        output.give_batch(ref, batch, time=first)
        return
    order = np.argsort(times, kind="stable")
    times = times[order]
    batch = batch.take(pa.array(order))
    bounds = np.flatnonzero(np.diff(times)) + 1
    starts = [0, *bounds.tolist()]
    ends = [*bounds.tolist(), len(times)]
    for s, e in zip(starts, ends, strict=True):
        output.give_batch(ref, batch.slice(s, e - s), time=int(times[s]))


def join(auctions: Stream, persons: Stream, name: str = "Q3Join",
         states: list[JoinState] | None = None) -> Stream:
    """The incremental join of ``auctions`` ``(id, seller)`` with ``persons``
    ``(id, name, city, state)`` on ``seller = id`` (see the module docstring).

    The worker's ``JoinState`` is declared as the operator's state ``"join"`` (restored from a
    snapshot before the join runs); ``states``, when given, also receives it (for tests).
    """

    def constructor(capability: Any, info: OperatorInfo) -> Any:
        capability.drop()  # outputs are sent with the arriving message's token
        state = info.state("join", JoinState())
        if states is not None:
            states.append(state)

        def logic(auction_in: OperatorInput, person_in: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in auction_in:
                rows, ids, times = state.match_auctions(
                    batch.column("id").to_numpy(), batch.column("seller").to_numpy(), ref.time)
                if len(rows):
                    _send(output, ref, state.output(rows, ids), times)
            for ref, batch in person_in:
                rows, ids, times = state.add_persons(
                    batch.column("id").to_numpy(), batch.select(PERSON_SCHEMA.names), ref.time)
                if len(rows):
                    _send(output, ref, state.output(rows, ids), times)

        return logic

    return binary(auctions, persons, Exchange(column="seller"), Exchange(column="id"), name,
                  constructor)


def build(streams: dict[str, Stream], config: GeneratorConfig,
          states: list[JoinState] | None = None) -> Stream:
    """Auctions of category 10 joined with their sellers from OR, ID or CA (``COLUMNS``)."""
    wanted = pa.array(STATES)

    def auctions_of_category(batch: Any) -> pa.RecordBatch:
        keep = batch.column("category").to_numpy() == CATEGORY
        return batch.select(["id", "seller"]).filter(pa.array(keep))

    def persons_in_states(batch: Any) -> pa.RecordBatch:
        keep = pc.is_in(batch.column("state"), value_set=wanted)
        return batch.select(["id", *PERSON_SCHEMA.names]).filter(keep)

    auctions = streams["auction"].map_batch(auctions_of_category, name="Q3Auctions")
    persons = streams["person"].map_batch(persons_in_states, name="Q3Persons")
    return join(auctions, persons, states=states)
