"""Every example gives identical per-epoch output on the thread, process and spark runtimes.

One worker function runs the dataflows of the examples one after the other (each driven to
completion before the next is built): hello (every worker sends ``r`` in epoch ``r``, exchanged
by value), word count (the first 10 documentation topics, ``wordcount.count_words``), connected
components (Les Misérables, ``min_weight=2``, ``connected_components.connected_components``) and,
when present, the windowed average (``window_average.window_average``).  The examples' ``main``
functions are fixed to the thread runtime, so the jobs here are built from the examples'
dataflow-building functions, reading their inputs the way the examples do.

The same function runs through ``tokenflow.execute(fn, workers=W, runtime=R)`` for R in
thread / process / spark and W in 2, 4 — six jobs in all, two of them Spark barrier stages on
the test session's ``local[4]`` SparkSession — and once more with W = 2 on a ``local[2]`` master
(exactly two task slots) in a child process with its own SparkSession.
Per example, the per-epoch records (merged over workers and sorted) must be identical to the
thread runtime's, and so must each worker's share (routing is by a stable hash, so the same
worker owns the same keys everywhere).  The thread runtime's output is checked against an
independent computation (plain Python, ``networkx``, ``pandas``) so that agreement is not
agreement on nothing.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections import Counter
from collections.abc import Callable
from types import ModuleType
from typing import Any

import cloudpickle
import numpy as np
import pandas as pd
import pytest
from pandas.util import hash_array

from tokenflow import execute
from tokenflow.worker import Worker

HELLO_ROUNDS = 10
TOPICS = 10  # word count over the first 10 documentation topics (keeps the jobs fast)
WINDOW = 10
MIN_WEIGHT = 2
TIMEOUT = 180.0

Outputs = dict[str, dict[int, list[Any]]]
"""Per example, one worker's records by epoch."""


def _optional(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:  # an example still being written
        return None


hello = _optional("hello")
wordcount = _optional("wordcount")
connected_components = _optional("connected_components")
window_average = _optional("window_average")

# The job travels to worker processes and Spark tasks by value: they need not import this module
# or the examples (which are not an installed package).
cloudpickle.register_pickle_by_value(sys.modules[__name__])
for _module in (hello, wordcount, connected_components, window_average):
    if _module is not None:
        cloudpickle.register_pickle_by_value(_module)


# -- the examples' dataflows, each driven to completion --------------------------------------


def _by_time(cap: Any) -> dict[int, list[Any]]:
    return {t: sorted(records) for t, records in cap.by_time().items()}


def run_hello(worker: Worker) -> dict[int, list[Any]]:
    """hello.py's dataflow (input -> exchange by value -> inspect) with every worker sending."""

    def build(scope: Any) -> tuple[Any, Any, Any]:
        inp, stream = scope.new_input()
        seen = stream.exchange(lambda x: x)
        return inp, seen.probe(), seen.capture()

    inp, probe, cap = worker.dataflow(build)
    for r in range(HELLO_ROUNDS):
        inp.send(r)
        inp.advance_to(r + 1)
        worker.step_while(lambda: probe.less_than(inp.time))
    inp.close()
    worker.step_while(lambda: not probe.done())
    return _by_time(cap)


def run_wordcount(worker: Worker) -> dict[int, list[Any]]:
    """wordcount.py's job: worker ``i`` tokenizes lines ``i::peers`` of each topic (one epoch each)."""
    assert wordcount is not None
    texts = wordcount.load_topics()[:TOPICS]
    index, peers = worker.index, worker.peers

    def build(scope: Any) -> tuple[Any, Any, Any]:
        inp, words = scope.new_input()
        counts = wordcount.count_words(words)
        return inp, counts.probe(), counts.capture()

    inp, probe, cap = worker.dataflow(build)
    for epoch, text in enumerate(texts):
        inp.send_batch(wordcount.tokenize("\n".join(text.splitlines()[index::peers])))
        inp.advance_to(epoch + 1)
        worker.step_while(lambda: probe.less_than(inp.time - 4))
    inp.close()
    worker.step_while(lambda: not probe.done())
    return _by_time(cap)


def run_connected_components(worker: Worker) -> dict[int, list[Any]]:
    """connected_components.py's job: worker ``i`` reads nodes and edges ``i::peers``."""
    assert connected_components is not None
    nodes, edges = connected_components.les_miserables(MIN_WEIGHT)
    index, peers = worker.index, worker.peers

    def build(scope: Any) -> tuple[Any, Any, Any, Any]:
        edge_input, edge_stream = scope.new_input("Edges")
        label_input, label_stream = scope.new_input("Labels")
        result = connected_components.connected_components(edge_stream, label_stream)
        return edge_input, label_input, result.probe(), result.capture()

    edge_input, label_input, probe, cap = worker.dataflow(build)
    mine = edges[index::peers]
    edge_input.send_batch(mine + [(v, u) for u, v in mine])
    label_input.send_batch([(n, n) for n in nodes[index::peers]])
    edge_input.close()
    label_input.close()
    worker.step_while(lambda: not probe.done())
    return _by_time(cap)


def run_window_average(worker: Worker) -> dict[int, list[Any]]:
    """window_average.py's job: edge ``i`` (weight as value) at time ``i`` on worker ``i % peers``."""
    assert window_average is not None
    weights = window_average.edge_weights()

    def build(scope: Any) -> tuple[Any, Any, Any]:
        inp, stream = scope.new_input()
        averages = window_average.window_average(stream.exchange(lambda r: r[0] // WINDOW), WINDOW)
        return inp, averages.probe(), averages.capture()

    inp, probe, cap = worker.dataflow(build)
    for i in range(worker.index, len(weights), worker.peers):
        inp.advance_to(i)
        inp.send((i, weights[i]))
        worker.step()
    inp.close()
    worker.step_while(lambda: not probe.done())
    return _by_time(cap)


RUNNERS: dict[str, tuple[ModuleType | None, Callable[[Worker], dict[int, list[Any]]]]] = {
    "hello": (hello, run_hello),
    "wordcount": (wordcount, run_wordcount),
    "connected_components": (connected_components, run_connected_components),
    "window_average": (window_average, run_window_average),
}
PRESENT = [name for name, (module, _) in RUNNERS.items() if module is not None]


def all_examples(worker: Worker) -> Outputs:
    """The worker function: every present example, one after the other."""
    return {name: RUNNERS[name][1](worker) for name in PRESENT}


# -- independent expectations ----------------------------------------------------------------


def _route(value: int, peers: int) -> int:
    """pandas' ``hash_array`` of an int64 is the SplitMix64 finalizer tokenflow documents; a
    hash goes to worker ``(hash >> 32) * peers >> 32``."""
    h = int(hash_array(np.array([value], dtype=np.int64))[0])
    return ((h >> 32) * peers) >> 32


def expected(example: str, workers: int) -> dict[int, list[Any]]:
    """The example's per-epoch output, merged over workers and sorted, computed without tokenflow."""
    if example == "hello":
        return {r: [r] * workers for r in range(HELLO_ROUNDS)}
    if example == "wordcount":
        from pydoc_data.topics import topics

        texts = [topics[name] for name in sorted(topics)][:TOPICS]
        return {e: sorted(Counter(re.findall(r"[a-z']+", text.lower())).items())
                for e, text in enumerate(texts)}
    if example == "connected_components":
        import networkx as nx

        g = nx.les_miserables_graph()
        ids = {name: i for i, name in enumerate(sorted(g.nodes))}
        h = nx.Graph()
        h.add_nodes_from(ids.values())
        h.add_edges_from((ids[u], ids[v]) for u, v, w in g.edges(data="weight") if w >= MIN_WEIGHT)
        labels = {n: min(c) for c in nx.connected_components(h) for n in c}
        return {0: sorted(labels.items())}
    if example == "window_average":
        import networkx as nx

        weights = [w for _, _, w in nx.les_miserables_graph().edges(data="weight")]
        frame = pd.DataFrame({"i": range(len(weights)), "w": weights})
        means = frame.groupby(frame["i"] // WINDOW)["w"].mean()
        return {(int(k) + 1) * WINDOW: [float(v)] for k, v in means.items()}
    raise AssertionError(example)


# -- running the job once per (runtime, workers) ---------------------------------------------

_RESULTS: dict[tuple[str, int], list[Outputs]] = {}


def results(runtime: str, workers: int, request: pytest.FixtureRequest) -> list[Outputs]:
    """Per-worker outputs of ``all_examples`` on ``runtime`` with ``workers`` (run once)."""
    if (runtime, workers) not in _RESULTS:
        options: dict[str, Any] = {}
        if runtime == "spark":
            options["spark"] = request.getfixturevalue("spark")
        elif runtime == "process":
            options["timeout"] = TIMEOUT
        out = execute(all_examples, workers=workers, runtime=runtime, **options)
        assert len(out) == workers
        _RESULTS[runtime, workers] = out
    return _RESULTS[runtime, workers]


def merged(outputs: list[Outputs], example: str) -> dict[int, list[Any]]:
    """One example's per-epoch records over all workers, sorted."""
    out: dict[int, list[Any]] = {}
    for per_worker in outputs:
        for t, records in per_worker[example].items():
            out.setdefault(t, []).extend(records)
    return {t: sorted(out[t]) for t in sorted(out)}


EXAMPLE_PARAMS = [pytest.param(name, id=name) if name in PRESENT else
                  pytest.param(name, id=name, marks=pytest.mark.skip(reason=f"examples/{name}.py missing"))
                  for name in RUNNERS]
RUNTIME_PARAMS = [pytest.param("process", id="process"),
                  pytest.param("spark", id="spark", marks=pytest.mark.spark)]


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("example", EXAMPLE_PARAMS)
def test_thread_runtime_matches_independent_computation(example: str, workers: int,
                                                        request: pytest.FixtureRequest) -> None:
    outputs = results("thread", workers, request)
    assert merged(outputs, example) == expected(example, workers)
    if example == "hello":  # each value is seen on the worker its stable hash picks
        for w, per_worker in enumerate(outputs):
            assert all(_route(r, workers) == w for r in per_worker["hello"]), w


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("runtime", RUNTIME_PARAMS)
@pytest.mark.parametrize("example", EXAMPLE_PARAMS)
def test_identical_per_epoch_output_on_every_runtime(example: str, runtime: str, workers: int,
                                                     request: pytest.FixtureRequest) -> None:
    reference = results("thread", workers, request)
    outputs = results(runtime, workers, request)
    assert merged(outputs, example) == merged(reference, example)
    # Each worker's share too: the same worker owns the same keys on every runtime.
    assert [o[example] for o in outputs] == [o[example] for o in reference]


# -- spark local[2]: its own SparkSession in a child process ----------------------------------

LOCAL2_SCRIPT = """
import pickle, sys
from pathlib import Path
sys.path[:0] = [{tests!r}, {io_tests!r}, {examples!r}]
import test_differential as d
import test_directory_spark
from tokenflow import execute
from tokenflow.spark import session
spark = session.get_session("local[2]")
assert spark.sparkContext.master == "local[2]", spark.sparkContext.master
out = execute(d.all_examples, workers=2, runtime="spark", spark=spark)
with open({path!r}, "wb") as f:
    pickle.dump(out, f)
test_directory_spark.run_directory_job(Path({directory!r}), master="local[2]")  # asserts itself
spark.stop()
"""


@pytest.mark.spark
def test_spark_local2_matches_thread(request: pytest.FixtureRequest, tmp_path: Any) -> None:
    """The 2-worker job on a ``local[2]`` master (exactly two task slots) gives the thread
    runtime's output, per example and per worker; and on the same master, files dropped into
    a directory while a job reads it are committed once (``test_directory_spark``'s check).
    The test session's own SparkSession is ``local[4]`` and a process holds one, so this runs
    in a child process (one JVM for both jobs: a JVM's start is most of such a test's time)."""
    import pickle
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    path = tmp_path / "outputs.pickle"
    directory = tmp_path / "directory"
    directory.mkdir()
    script = LOCAL2_SCRIPT.format(tests=str(here), io_tests=str(here.parent / "io"),
                                  examples=str(here.parents[1] / "examples"), path=str(path),
                                  directory=str(directory))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with path.open("rb") as f:
        outputs = pickle.load(f)  # written by the child above: trusted
    reference = results("thread", 2, request)
    for example in RUNNERS:
        if example in PRESENT:
            assert merged(outputs, example) == merged(reference, example), example
            assert [o[example] for o in outputs] == [o[example] for o in reference], example
