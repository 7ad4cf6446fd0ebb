"""examples/wordcount.py as a test: per-epoch counts equal a plain ``Counter`` of the text."""

from __future__ import annotations

import re
from collections import Counter
from pydoc_data.topics import topics

import pytest
import wordcount  # examples/wordcount.py (tests/examples/conftest.py puts examples/ on sys.path)

from tokenflow import execute


def expected_counts() -> dict[int, dict[str, int]]:
    """Counts computed directly: one ``Counter`` per topic (sorted names) over the whole text."""
    out: dict[int, dict[str, int]] = {}
    for epoch, name in enumerate(sorted(topics)):
        counts = Counter(re.findall(r"[a-z']+", topics[name].lower()))
        if counts:
            out[epoch] = dict(counts)
    return out


@pytest.fixture(scope="module")
def by_workers() -> dict[int, tuple[dict[int, dict[str, int]], int]]:
    """``workers -> (counts, words read)`` for 1, 2 and 3 workers."""
    out = {}
    for workers in (1, 2, 3):
        counts, words, _ = wordcount.run(workers)
        out[workers] = (counts, words)
    return out


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_counts_match_counter(workers: int, by_workers: dict) -> None:
    counts, words = by_workers[workers]
    expected = expected_counts()
    assert len(expected) > 50  # the corpus really has dozens of non-empty epochs
    assert counts.keys() == expected.keys()
    for epoch in expected:
        assert counts[epoch] == expected[epoch], f"epoch {epoch}"
    assert words == sum(sum(c.values()) for c in expected.values())


def test_main_returns_counts() -> None:
    assert wordcount.main(workers=2) == expected_counts()


def test_differential_workers_1_2_3(by_workers: dict) -> None:
    one, two, three = (by_workers[w][0] for w in (1, 2, 3))
    assert one == two == three


def test_count_words_emits_an_epoch_only_when_complete() -> None:
    """Counts of an epoch appear once the input passed it, never before, at the epoch's time."""
    observed: list[list[tuple[int, list[tuple[str, int]]]]] = []

    def job(worker):  # type: ignore[no-untyped-def]
        def build(scope):  # type: ignore[no-untyped-def]
            inp, words = scope.new_input()
            counts = wordcount.count_words(words)
            return inp, counts.probe(), counts.capture()

        inp, probe, cap = worker.dataflow(build)

        def snapshot() -> None:
            observed.append([(t, sorted(batch)) for t, batch in cap.events])

        inp.send_batch(["b", "a", "b"])
        for _ in range(20):
            worker.step()
        snapshot()  # epoch 0 still open: nothing emitted
        inp.advance_to(2)  # skips epoch 1
        worker.step_while(lambda: probe.less_than(2))
        snapshot()
        inp.send_batch(["a"])
        inp.send_batch(["a", "c"])  # two batches of one epoch are merged
        inp.advance_to(3)
        worker.step_while(lambda: probe.less_than(3))
        snapshot()
        inp.close()

    execute(job, workers=1)
    assert observed[0] == []
    assert observed[1] == [(0, [("a", 1), ("b", 2)])]
    assert observed[2] == [(0, [("a", 1), ("b", 2)]), (2, [("a", 2), ("c", 1)])]


def test_cli_prints_top_words(capsys: pytest.CaptureFixture[str]) -> None:
    wordcount.cli(["--workers", "2", "--top", "3"])
    out = capsys.readouterr().out.splitlines()
    total: Counter[str] = Counter()
    for counts in expected_counts().values():
        total.update(counts)
    assert "words/s" in out[0]
    assert [line.split() for line in out[1:]] == [[str(n), w] for w, n in total.most_common(3)]
