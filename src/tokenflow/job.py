"""A job's identity, layout and restore point, and a handle on a running job.

Source: the distributed-DBSP design, "Layout changes" (cold: checkpoint, terminate the
workers, start them with the new layout, each loading the state it now owns) and "Scaling
state" (fixed sharding); Megaphone (bins and a routing table).

``JobSpec`` travels to every worker with the job (inside the job, pickled): the job's name,
its routing table (``bin -> worker``), and the snapshot to restore, if any.  ``start`` runs a
job in the background and returns a ``JobHandle`` whose ``snapshot()`` pauses it at an epoch
boundary, writes a snapshot and stops it (``tokenflow.control``); ``execute(..., restore=DIR)``
then starts the same job from that snapshot at any worker count, the routing table rebalanced
so that only the bins whose owner changes are read by a worker that did not write them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tokenflow.state.bins import DEFAULT_BINS, RoutingTable
from tokenflow.state.snapshot import Snapshot

FAILURE_WAIT = 5.0
"""Seconds a command that failed waits for a failing job to end, to name its failure."""
SIZES_TIMEOUT = 5.0
"""Seconds ``JobHandle.rescale`` waits for the workers' state bytes per bin (``bin_bytes``)
before it moves bins by their counts alone."""
_SIZE_ROUNDS = itertools.count()


def job_name(fn: Callable[..., Any]) -> str:
    """The default name of a job: its function's module and qualified name (the same on
    every run, so a snapshot can be matched to the job that wrote it)."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


@dataclass
class JobSpec:
    """What every worker must agree on before it builds a dataflow.

    Attributes:
        name: the job's name (snapshots carry it; restoring another job's snapshot fails).
        routing: the routing table (``RoutingTable.to_json()`` form).
        restore_root, restore_epoch: the snapshot to load (None: start empty).
        control: install the control-plane agent (``tokenflow.control.ControlAgent``).
        replay: the run may redo epochs a failed run of the job already produced
            (``Worker.replay``: committing sinks discard those epochs).
        log_root: where the job's durable input log lives (``Worker.input_log``), or None.
        run: this run's tag, the same on every worker (made on the driver): the input log
            tells runs apart by it.
        catalog: ``(host, port, token)`` of the job's publish/subscribe catalog
            (``tokenflow.pubsub.Catalog``), given to workers as ``Worker.catalog``.
    """

    name: str
    routing: dict[str, Any]
    restore_root: str | None = None
    restore_epoch: int | None = None
    control: bool = False
    replay: bool = False
    log_root: str | None = None
    run: str = field(default_factory=lambda: f"{time.time_ns():020d}")
    catalog: tuple[str, int, str] | None = None
    _table: RoutingTable | None = field(default=None, repr=False, compare=False)

    @classmethod
    def create(cls, name: str, workers: int, bins: int = DEFAULT_BINS, restore: str | None = None,
               epoch: int | None = None, control: bool = False, replay: bool = False,
               log_root: str | None = None) -> JobSpec:
        """The spec of a job of ``workers`` workers: an even routing table of ``bins`` bins,
        or, with ``restore``, the snapshot's table rebalanced onto ``workers`` workers.

        Raises:
            SnapshotError: ``restore`` holds no committed snapshot (of ``epoch``), or one of
                another job or another bin count.
            ValueError: ``workers < 1`` or a bad bin count.
        """
        if restore is None:
            table = RoutingTable.even(workers, bins)
            return cls(name, table.to_json(), control=control, replay=replay, log_root=log_root)
        snapshot = Snapshot.open(restore, epoch, job=name, bins=bins)
        table = snapshot.routing.rebalanced(range(workers))
        return cls(name, table.to_json(), restore, snapshot.epoch, control, replay, log_root)

    @property
    def table(self) -> RoutingTable:
        """The routing table."""
        if self._table is None:
            self._table = RoutingTable.from_json(self.routing)
        return self._table

    def apply(self, worker: Any) -> None:
        """Give ``worker`` the routing table and, when restoring, the snapshot to load from
        (before its dataflows are built).

        Raises:
            SnapshotError: the snapshot cannot be opened on this worker.
        """
        worker.routing = self.table
        worker.replay = self.replay
        worker.catalog = self.catalog
        if self.log_root is not None:
            from tokenflow.io.inputlog import InputLog  # the io layer, above this one

            worker.input_log = InputLog(self.log_root, self.name, worker.index, peers=worker.peers,
                                        run=self.run)
        if self.restore_root is not None:
            worker.restore = Snapshot.open(self.restore_root, self.restore_epoch, job=self.name,
                                           bins=self.table.bins)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_table"] = None
        return state


class JobHandle:
    """A job running in the background (``start``).

    ``snapshot(root)`` pauses every source at a common epoch, waits until nothing is in
    flight, writes every worker's state and source positions under ``root``, commits the
    snapshot and stops the job (``stop=False``: resumes it); ``result()`` waits for the
    per-worker results.
    """

    def __init__(self, spec: JobSpec, workers: int, hub: Any, run: Callable[[], list[Any]],
                 slots: int | None = None) -> None:
        self.spec = spec
        self.workers = workers
        self.slots = slots if slots is not None else workers
        """Worker slots: the most workers the job can have at once."""
        self.roster = list(range(workers))
        """The job's workers now (``add_worker`` / ``remove_worker`` change it)."""
        self.hub = hub
        self._used: set[int] = set(range(workers))  # slots never reused (the mesh's peers)
        self.scale_steps = 0
        """Migration steps the last ``scale`` (or ``remove_worker``) planned."""
        self.migrating = True
        """The job has migrating (Megaphone) operators: ``scale`` moves their bins (False: it
        only adds and removes workers)."""
        self.move_sources = False
        """``scale``, ``remove_worker`` and ``replace_worker`` also re-split the job's sources
        (``tokenflow.resplit``): joining workers read a share, leaving ones hand theirs away."""
        self.source_moves: list[Any] = []
        """What every re-split moved (``tokenflow.resplit.SourceMove``), in order."""
        self._result: list[Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(run,), daemon=True,
                                        name="tokenflow-job")
        if hasattr(hub, "alive"):
            hub.alive = self._thread.is_alive
        self._thread.start()

    def _run(self, run: Callable[[], list[Any]]) -> None:
        try:
            self._result = run()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._error = exc

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s for the job to end; True if it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @contextmanager
    def _naming_failure(self, timeout: float) -> Iterator[None]:
        """The body of a command with ``timeout`` s: a worker not connected yet is waited for
        that long at most (``command_deadline``), and a ``ControlError`` of a command the job
        could not answer because it ended says why: the control plane sees only that replies
        stopped coming, while ``result()`` has the failure (e.g. ``worker 2 was killed by
        SIGKILL``) or the results.  Unless the error is a ``ReplyTimeout``, waits up to
        ``FAILURE_WAIT`` s for an ending job to finish."""
        from tokenflow.control import ControlError, ReplyTimeout, command_deadline

        try:
            with command_deadline(timeout):
                yield
        except ControlError as exc:
            if getattr(exc, "names_job_end", False):  # named by a nested command already
                raise
            if not isinstance(exc, ReplyTimeout):  # a timeout in a live job raises at once
                self._thread.join(FAILURE_WAIT)
            if self._thread.is_alive():
                raise
            if self._error is None:
                named = type(exc)(f"{exc}; the job has finished (result() has its results)")
            else:
                named = type(exc)(f"{exc}; the job failed: {self._error}")
            named.names_job_end = True  # type: ignore[attr-defined]
            raise named from (self._error or exc)

    def snapshot(self, root: str, stop: bool = True, timeout: float = 60.0) -> int:
        """Snapshot the job at an epoch boundary under ``root``; returns the epoch.

        The epoch is no later than a pause the job set on a source itself
        (``SourceHandle.pause_at``), and with ``stop=False`` the job resumes but such a source
        stays paused until the job resumes it (the control plane's pause is its own).

        Raises:
            ControlError: a worker did not answer within ``timeout`` s, or the job ended before
                it could be snapshotted (``result()`` then has its results or its failure).
            SnapshotError: the snapshot could not be committed.
            ValueError: a worker joined the job (``add_worker``): its state and its sources'
                positions (splits a re-split handed it) are not part of a snapshot yet.
        """
        from tokenflow.control import take_snapshot

        if self._used != set(range(self.workers)):
            raise ValueError(f"job {self.spec.name!r}: workers {sorted(self._used)} took part "
                             f"(workers joined it); a snapshot holds workers 0..{self.workers - 1} "
                             "only, so it would lose the joined workers' state and the source "
                             "splits handed to them: jobs that workers join are not snapshotted")

        with self._naming_failure(timeout):
            epoch = take_snapshot(self.hub, list(range(self.workers)), root, self.spec.name,
                                  self.spec.table, stop=stop, timeout=timeout,
                                  alive=self._thread.is_alive)
        assert epoch is not None  # only a snapshot building on a previous one is skipped
        return epoch

    def rescale(self, roster: int | list[int], strategy: str = "batched",
                timeout: float = 30.0) -> int:
        """Spread the bins of every migrating operator (``tokenflow.rescale``) over
        ``roster`` (worker indices, or ``n`` for workers ``0..n-1``) while the job runs,
        moving only the bins whose owner changes; returns the number of steps.  The job's
        processes stay: a worker outside the roster keeps running and owns no bins.  Which
        bins move is chosen by the state's bytes per bin, gathered from every worker first
        (``_bin_bytes``; ``RoutingTable.rebalanced`` with ``sizes``): going from W to W + 1
        workers moves about ``1/(W + 1)`` of the bytes.

        Raises:
            ValueError: a roster member that is not a worker of the job.
            ControlError: worker 0 did not acknowledge within ``timeout`` s, or refused
                because the data of every migrating operator has ended (no logical time is
                left to move bins at; their state stays where it is).
        """
        members = list(range(roster)) if isinstance(roster, int) else sorted(set(roster))
        if not members or not set(members) <= set(self.roster) | set(range(self.workers)):
            raise ValueError(f"roster {members} is not within the job's workers {self.roster} "
                             "(add_worker first)")
        command: dict[str, Any] = {"roster": members, "strategy": strategy}
        with self._naming_failure(timeout):
            sizes = self._bin_bytes(min(timeout, SIZES_TIMEOUT))
            if sizes is not None:
                command["sizes"] = sizes
            return self._rescale(command, timeout, f"the rescale to {members}")

    def _bin_bytes(self, timeout: float) -> dict[str, Any] | None:
        """The job's state bytes per bin, summed over the roster's workers (each answers the
        control plane's ``bin_bytes`` between two of its steps), packed for a ``rescale``
        command's ``sizes`` (``tokenflow.control.pack_sizes``): the bins that move are then
        chosen by bytes (``RoutingTable.rebalanced``).  None when no worker holds migrating
        state, when a state does not weigh its bins (``BinnedState.bin_bytes``: e.g. a large
        columnar one), or when a worker did not answer within ``timeout`` s (e.g. it
        ended): the bins then move as the bin counts alone decide.

        Raises:
            ControlError: worker 0 (which carries out the rescale) cannot be reached.
        """
        from tokenflow.control import ControlError, pack_sizes, unpack_sizes

        round_ = f"bin_bytes-{next(_SIZE_ROUNDS)}"
        waiting = set(self.roster)
        for w in sorted(waiting):
            try:
                self.hub.send(w, {"kind": "bin_bytes", "round": round_})
            except (ControlError, OSError, KeyError):
                if w == 0:
                    raise
                return None
        parts = []
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline and self.running:
            reply = self.hub.receive(0.05)
            if reply is None and waiting & self.hub.gone():
                return None  # a worker that returned answers no more: the counts decide
            if reply is None or reply.get("kind") != "bin_bytes" or reply.get("round") != round_:
                continue
            waiting.discard(reply.get("worker"))
            if not reply.get("weighed", False):
                return None  # a state left unweighed: the bins' counts decide
            if reply.get("sizes") is not None:
                try:
                    parts.append(unpack_sizes(reply["sizes"], int(reply["bins"])))
                except (ControlError, KeyError, TypeError, ValueError) as exc:
                    raise ControlError(f"worker {reply.get('worker')}'s bin_bytes reply: "
                                       f"{exc}") from exc
        if waiting or not parts or len({len(p) for p in parts}) > 1:
            return None  # (bin counts that differ: operators of other tables; by count)
        return pack_sizes(sum(parts[1:], parts[0]))

    def _rescale(self, command: dict[str, Any], timeout: float, what: str) -> int:
        """Send worker 0 a ``rescale`` command and wait for its ``rescaled`` (its steps).

        Raises:
            ControlError: no acknowledgement within ``timeout`` s, the job ended, or worker 0
                refused (the migrating operators' data has ended).
        """
        from tokenflow.control import ControlError

        with self._naming_failure(timeout):
            self.hub.send(0, {"kind": "rescale", "round": None, **command})
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                reply = self.hub.receive(0.1)
                if reply is not None and reply.get("kind") == "rescaled":
                    if reply.get("error"):
                        raise ControlError(f"{what} was not carried out: {reply['error']}")
                    return int(reply.get("steps", 0))
                if not self.running:
                    raise ControlError(f"the job ended before worker 0 acknowledged {what}")
            raise ControlError(f"worker 0 did not acknowledge {what} within {timeout} s")

    def _abandon(self, k: int) -> None:
        """A join that failed: worker ``k`` ends without joining (``abandon``,
        ``tokenflow.membership``).  Its slot stays used: slots are never reused (``k`` may
        have dialled the members' meshes)."""
        from tokenflow.control import ControlError

        try:
            self.hub.send(k, {"kind": "abandon"})
        except (ControlError, OSError, KeyError):
            pass  # not connected (it gives up on its own) or gone

    def add_worker(self, timeout: float = 60.0, inputs: bool = False,
                   sources: bool = False) -> int:
        """Start a worker in a free slot and join it to the running job (its progress state
        bootstrapped from a running worker; ``tokenflow.membership``); returns its index.  It
        owns no bins until a ``rescale`` gives it some.  With ``inputs``, it is also lent a
        token for each open ``InputHandle`` at the job's current epoch, so its worker code can
        feed them (``handle.ready`` turns True); without, it can only close them.  With
        ``sources``, every replayable source's remaining work is re-split at a logical time
        so that it reads a share (``tokenflow.resplit``; its splits, or for an untimed
        directory source the files first listed from then on); without, its sources read
        nothing until a later re-split gives them some.

        Raises:
            MembershipError: no free slot (``start(..., slots=M)``), or the runtime cannot
                start workers.
            HandoverError: a source that cannot hand its work over (e.g. a directory source
                with a time column); the worker has joined.
            ControlError: a worker did not answer within ``timeout`` s, or the job ended
                (the worker started for the join is told to end; its slot is not reused).
        """
        from tokenflow.control import ControlError
        from tokenflow.membership import MembershipError, join, lend

        free = [k for k in range(self.slots) if k not in self._used]
        if not free:
            raise MembershipError(f"no free worker slot: the job has {self.slots} slots and "
                                  f"workers {self.roster} (start it with slots=M)")
        deadline = time.monotonic() + timeout
        while (launch := getattr(self.hub, "launch", None)) is None:  # the job starts up
            if time.monotonic() > deadline or not self.running:
                raise MembershipError("this runtime cannot start workers in a running job "
                                      "(the thread and process runtimes can)")
            time.sleep(0.05)
        k = free[0]
        self._used.add(k)
        launch(k, [*self.roster, k])
        with self._naming_failure(timeout):
            try:
                join(self.hub, list(self.roster), k, timeout, self._thread.is_alive)
            except ControlError:
                self._abandon(k)
                raise
            self.roster = sorted([*self.roster, k])
            if inputs:
                lend(self.hub, list(self.roster), k, timeout, self._thread.is_alive)
            if sources:
                self._move_sources([w for w in self.roster if w != k], list(self.roster),
                                   timeout)
        return k

    def _move_sources(self, old: list[int], new: list[int], timeout: float) -> None:
        from tokenflow.resplit import move_sources

        self.source_moves += move_sources(self.hub, old, new, timeout, self._thread.is_alive)

    def remove_worker(self, worker: int, strategy: str = "batched", timeout: float = 60.0,
                      sources: bool | None = None) -> None:
        """Move ``worker``'s bins of every migrating operator to the other workers, then let
        it leave the running job (``tokenflow.membership``).  With ``sources`` (default
        ``move_sources``) its sources' remaining work is first handed to the others
        (``tokenflow.resplit``); without, it leaves only once its sources have ended.

        Raises:
            ValueError: ``worker`` is not in the roster, or is the last one.
            HandoverError: a source that cannot hand its work over (nothing moved yet).
            ControlError: a worker did not answer within ``timeout`` s, or the job ended.
        """
        from tokenflow.membership import leave

        if worker not in self.roster or len(self.roster) == 1:
            raise ValueError(f"cannot remove worker {worker} from {self.roster}")
        rest = [w for w in self.roster if w != worker]
        with self._naming_failure(timeout):
            if self.move_sources if sources is None else sources:
                self._move_sources(list(self.roster), rest, timeout)
            if self.migrating:
                self.scale_steps += self.rescale(rest, strategy, timeout)
            leave(self.hub, list(self.roster), worker, timeout, self._thread.is_alive)
        self.roster = rest

    def replace_worker(self, worker: int, strategy: str = "batched",
                       timeout: float = 60.0) -> int:
        """Replace ``worker`` by a new one in one layout change (a rolling upgrade step: the
        new worker joins in a free slot, every bin of ``worker`` moves straight to it and no
        other bin moves, then ``worker`` leaves); returns the new worker's index.  ``worker``
        must hold no input token by then (its worker code closed its inputs); with
        ``move_sources`` its sources' remaining work is handed over (to the new worker, as the
        one below its share), otherwise it must hold none either.

        Raises:
            ValueError: ``worker`` is not in the roster.
            MembershipError, ControlError: see ``add_worker`` / ``remove_worker``.
        """
        from tokenflow.membership import leave

        if worker not in self.roster:
            raise ValueError(f"cannot replace worker {worker}: not in {self.roster}")
        new = self.add_worker(timeout)
        if self.move_sources:
            self._move_sources(list(self.roster), [w for w in self.roster if w != worker],
                               timeout)
        if self.migrating:
            rest = [w for w in self.roster if w != worker]
            self.scale_steps += self._rescale(
                {"roster": rest, "strategy": strategy, "replace": [worker, new]}, timeout,
                f"moving worker {worker}'s bins to worker {new}")
        leave(self.hub, list(self.roster), worker, timeout, self._thread.is_alive)
        self.roster = [w for w in self.roster if w != worker]
        return new

    def scale(self, n: int, strategy: str = "batched", timeout: float = 60.0) -> list[int]:
        """Grow or shrink the running job to ``n`` workers: joining workers take free slots
        and then receive their share of the bins; leaving ones (the highest slots first) hand
        theirs away before they go.  Returns the new roster.

        Raises:
            ValueError: ``n`` < 1 or more than the job's slots.
            MembershipError, ControlError: see ``add_worker`` / ``remove_worker``.
        """
        if not 1 <= n <= self.slots:
            raise ValueError(f"cannot scale to {n} workers: the job has {self.slots} slots")
        self.scale_steps = 0
        if n > len(self.roster):
            while len(self.roster) < n:
                self.add_worker(timeout, sources=self.move_sources)
            if self.migrating:
                self.scale_steps += self.rescale(list(self.roster), strategy, timeout)
        while len(self.roster) > n:
            self.remove_worker(self.roster[-1], strategy, timeout)
        return list(self.roster)

    def result(self, timeout: float | None = None) -> list[Any]:
        """The per-worker results once the job ends.

        Raises:
            TimeoutError: still running after ``timeout`` s.
            WorkerError: the job failed.
        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"job {self.spec.name!r} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def start(fn: Callable[[Any], Any], workers: int = 1, runtime: str = "thread",
          name: str | None = None, bins: int = DEFAULT_BINS, restore: str | None = None,
          spec: JobSpec | None = None, **options: Any) -> JobHandle:
    """Run ``fn`` like ``execute`` but in the background, under the control plane.

    Returns a ``JobHandle`` (``snapshot``, ``result``).  On ``process`` and ``spark`` the
    commands travel through a ``Coordinator``: pass one as ``coordinator=`` (with
    ``report_to=`` when workers must reach it at another address than its own), else one is
    created; on ``thread`` through in-process queues (a given coordinator still receives
    progress reports).

    ``spec``: the job's spec (its ``control`` is set); by default made from ``name``,
    ``bins`` and ``restore``.

    Raises:
        ValueError: see ``execute``; ``report_to=`` without ``coordinator=`` on ``process``
            or ``spark`` (the workers would await commands from the coordinator at
            ``report_to``, which the handle cannot send through: no checkpoint or rescale
            would ever reach them); SnapshotError: see ``JobSpec.create``.
    """
    from tokenflow.control import CoordinatorHub, QueueHub
    from tokenflow.execute import execute

    if spec is None:
        spec = JobSpec.create(name or job_name(fn), workers, bins, restore, control=True)
    spec.control = True
    coordinator = options.pop("coordinator", None)
    if runtime == "thread":
        hub: Any = QueueHub(int(options.get("slots", workers)))
        options["control_hub"] = hub
        if coordinator is not None:
            options.setdefault("report_to", coordinator.endpoint)
    else:
        if coordinator is None and options.get("report_to") is not None:
            raise ValueError(f"report_to={options['report_to'][:2]} without coordinator=: on the "
                             f"{runtime} runtime the workers take the control plane's commands "
                             "from the coordinator they report to; pass that Coordinator as "
                             "coordinator= (report_to= only gives its address as the workers "
                             "reach it)")
        if coordinator is None:
            from tokenflow.coordinator import Coordinator

            coordinator = Coordinator()
        options.setdefault("report_to", coordinator.endpoint)
        hub = CoordinatorHub(coordinator)
        if int(options.get("slots", workers)) > workers:
            options["control_hub"] = hub  # the runtime sets its ``launch`` of joining workers
    return JobHandle(spec, workers, hub,
                     lambda: execute(fn, workers=workers, runtime=runtime, spec=spec, **options),
                     slots=int(options.get("slots", workers)))


__all__ = ["JobHandle", "JobSpec", "job_name", "start"]
