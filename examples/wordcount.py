"""Word count with per-epoch counts over Python's own documentation text.

The text is ``pydoc_data.topics.topics`` (shipped with CPython: ~80 help topics, ~465 KB of
English).  Epoch ``e`` is the ``e``-th topic in sorted key order.  Each worker reads its share of
every topic's lines (line ``i`` goes to worker ``i % peers``), tokenizes the share in one regex
pass (``[a-z']+`` on the lower-cased text) and sends the words as one batch.  ``count_words``
routes words by a stable hash to the worker owning them (``stateful_unary``: the owner of the
word's bin), keeps each epoch's words until the input frontier has passed the epoch, then
counts them with a ``Counter`` and emits ``(word, count)`` records at the epoch.  The words
waiting for their epoch are the operator's declared state (per bin of the word), so a job
snapshot holds them and a restore at another worker count re-creates them on the word's new
owner.

Run::

    python examples/wordcount.py --workers 2 --top 10
"""

from __future__ import annotations

import argparse
import re
import time as timer
from collections import Counter
from typing import Any

from tokenflow import InputHandle, ProbeHandle, Scope, execute
from tokenflow.dataflow.operators.builder import Session
from tokenflow.dataflow.operators.capture import Capture
from tokenflow.dataflow.operators.stateful import stateful_unary
from tokenflow.dataflow.state import KeyedState
from tokenflow.dataflow.stream import Stream
from tokenflow.worker import Worker

WORD = re.compile(r"[a-z']+")
"""Tokens: maximal runs of lower-case ASCII letters and apostrophes (text is lower-cased)."""


def tokenize(text: str) -> list[str]:
    """The words of ``text`` (one regex pass over the whole chunk)."""
    return WORD.findall(text.lower())


def load_topics() -> list[str]:
    """The documentation topics' texts, one per epoch, in sorted topic-name order."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def count_words(stream: Stream, name: str = "CountWords") -> Stream:
    """Count the words of ``stream`` per time.

    Input: batches of words (``str``) at integer epochs, on any worker.  The words are
    exchanged by a stable hash of the word, so each word is counted on one worker.  Output:
    for every epoch ``t`` and word seen in it, one ``(word, count)`` record at time ``t``,
    emitted once the input frontier has passed ``t`` (one token per pending epoch, dropped
    after emitting; ``stateful_unary`` stashes the epoch's words in its declared, binned
    state and re-mints the tokens of a restored stash).
    """

    def count(t: Any, words: list[str], state: KeyedState[Any, Any], session: Session) -> None:
        session.give_batch(list(Counter(words).items()))

    return stateful_unary(stream, count, name=name)  # routed by the word itself


def run(workers: int = 2, texts: list[str] | None = None,
        lag: int = 4) -> tuple[dict[int, dict[str, int]], int, float]:
    """Count words per epoch; return ``(counts, words, seconds)``.

    Args:
        workers: worker threads.
        texts: one text per epoch (default: ``load_topics()``).
        lag: epochs the inputs may run ahead of the completed output (bounds memory).

    Returns:
        ``counts[epoch][word]``, the total number of words read, and the wall time in s.
    """
    if texts is None:
        texts = load_topics()
    lines = [text.splitlines() for text in texts]

    def job(worker: Worker) -> tuple[Capture, int]:
        index, peers = worker.index, worker.peers

        def build(scope: Scope) -> tuple[InputHandle, ProbeHandle, Capture]:
            inp, words = scope.new_input()
            counts = count_words(words)
            return inp, counts.probe(), counts.capture()

        inp, probe, cap = worker.dataflow(build)
        sent = 0
        for epoch, epoch_lines in enumerate(lines):
            batch = tokenize("\n".join(epoch_lines[index::peers]))
            sent += len(batch)
            inp.send_batch(batch)
            inp.advance_to(epoch + 1)
            worker.step_while(lambda: probe.less_than(inp.time - lag))
        inp.close()
        return cap, sent

    start = timer.perf_counter()
    results = execute(job, workers=workers)
    seconds = timer.perf_counter() - start
    counts: dict[int, dict[str, int]] = {}
    for cap, _ in results:
        for epoch, records in cap.by_time().items():
            per_epoch = counts.setdefault(epoch, {})
            for word, n in records:
                if word in per_epoch:
                    raise RuntimeError(f"word {word!r} counted on two workers in epoch {epoch}")
                per_epoch[word] = n
    return dict(sorted(counts.items())), sum(n for _, n in results), seconds


def main(workers: int = 2) -> dict[int, dict[str, int]]:
    """Per-epoch word counts of the documentation topics: ``counts[epoch][word]``."""
    return run(workers)[0]


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker threads (default 2)")
    parser.add_argument("--top", type=int, default=10, help="top words to print (default 10)")
    args = parser.parse_args(argv)
    counts, words, seconds = run(args.workers)
    total: Counter[str] = Counter()
    for per_epoch in counts.values():
        total.update(per_epoch)
    print(f"{words} words, {len(total)} distinct, {len(counts)} epochs, "
          f"{args.workers} workers: {seconds:.3f} s ({words / seconds:,.0f} words/s)")
    for word, n in total.most_common(args.top):
        print(f"{n:8d}  {word}")


if __name__ == "__main__":
    cli()
