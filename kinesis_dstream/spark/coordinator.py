"""Runs in the driver: one shard coordinator per (application, stream) in a driver process.

It is the KCL worker of the driver, without record fetching: it syncs shards into the KCL
lease table, takes and renews leases under one worker id, assigns each held shard to one
of the input DStreams that name this application (however many ``createStream`` calls
there are), and writes the checkpoints the policy (``checkpointer.py``) says are due.
Several drivers with one application name split the shards through the lease table, as
KCL workers do; input streams inside one driver split them by assignment, so nothing is
stolen or read twice between them.

Each lease period (from taking a lease to losing or releasing it) has a floor: the lease's
checkpoint when taken. LATEST is pinned to AT_TIMESTAMP of that moment, so that the batch
that starts there reads the same records however often it is computed. Child shards are
planned only once every parent has checkpointed SHARD_END.

Permanent errors (no such stream, bad credentials) found after start are kept in
``fatal`` and raised by the next batch, which fails the StreamingContext
(``awaitTermination`` raises); transient ones back off and are logged at most once a minute.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..aws.kinesis import KinesisClient
from ..aws.lease_table import Lease, LeaseTable
from ..aws.range_table import BatchRangeTable
from ..config import ConsumerConfig, default_worker_id, made_by_another_process, proven_dead
from ..retrieval import ITERATOR_TTL_S, ReadReport, start_after
from ..errors import (
    ConfigurationError,
    CredentialsError,
    KinesisDStreamError,
    LeaseLostError,
    StreamNotFoundError,
)
from ..records import AT_TIMESTAMP, LATEST, ExtendedSequenceNumber
from ..worker.lease_loop import lease_loop_backoff, run_lease_loop
from ..worker.leases import LeaseCoordinator, LeaseManager
from ..worker.metrics import MetricsPublisher, ShardMetricsRecorder
from ..worker.shard_sync import ShardSyncer, parents_done
from .checkpointer import SHARD_END, KinesisCheckpointer

log = logging.getLogger(__name__)

PERMANENT_ERRORS = (StreamNotFoundError, CredentialsError, ConfigurationError)


@dataclass
class ShardState:
    """Everything the driver knows of one shard, in one place.

    The lease period (from taking the lease to losing or releasing it) has a floor, the
    lease's checkpoint when taken, where its first batch starts; each later batch starts
    where the shard's previous batch ended, known from that batch's read report
    (``last_read``), with the iterator that read handed back. The counters outlive the
    period, for ``metrics()``.
    """

    shard_id: str
    member: str | None = None  # the input stream (its key) that reads it; None: not held
    floor: ExtendedSequenceNumber | None = None
    floor_timestamp: float | None = None
    since_ms: int | None = None  # the first batch planned in this period
    last_planned_ms: int | None = None
    # The last planned batch while its range end is unknown: no read-ahead report yet and
    # not completed. Its range is recorded later by its own output operation, so a batch
    # planned meanwhile could only guess its start and read the same records again.
    unsettled_ms: int | None = None
    ended: bool = False  # a batch read its last record: plan no more
    # The lease was not renewed for failover time: plan no more, but keep the period (and
    # the batches under way) in case it is taken back untouched.
    lapsed: bool = False
    child_shard_ids: tuple[str, ...] = ()
    last_read: ReadReport | None = None  # the report of the period's newest batch read
    # (member, batch) planned and not yet completed; completed ones whose range is recorded
    planned: set = field(default_factory=set)
    recorded: set = field(default_factory=set)
    # counters
    records: int = 0
    data_bytes: int = 0
    throttled: int = 0  # reads Kinesis refused for throughput, in completed batches
    faults: int = 0  # other transient read failures waited out, in completed batches
    millis_behind_latest: int | None = None
    last_checkpoint: str | None = None
    state: str = "processing"
    read_by_pids: set = field(default_factory=set)

    @property
    def held(self) -> bool:
        return self.member is not None

    def open(self, member: str, floor: ExtendedSequenceNumber, timestamp: float | None) -> None:
        self.member, self.floor, self.floor_timestamp = member, floor, timestamp
        self.lapsed = False
        self.since_ms = self.last_planned_ms = self.unsettled_ms = None
        self.ended, self.child_shard_ids, self.last_read = False, (), None

    def close(self, state: str) -> None:
        self.member = None
        self.lapsed = False
        self.state = state

    def next_read(self, now: float) -> tuple[ExtendedSequenceNumber | None, float | None, str | None]:
        """(start, its timestamp, an iterator at it) of the shard's next batch; start None
        when the previous batch's end is not known here (the task looks it up)."""
        assert self.floor is not None
        if self.last_planned_ms is None:
            start, timestamp = start_after(None, self.floor, self.floor_timestamp)
            return start, timestamp, None
        report = self.last_read
        if report is None or report.batch_range.batch_ms != self.last_planned_ms:
            return None, None, None
        start, timestamp = start_after(report.batch_range, self.floor, self.floor_timestamp)
        iterator = report.next_iterator
        if iterator is not None and now - report.iterator_time > ITERATOR_TTL_S:
            iterator = None
        return start, timestamp, iterator


@dataclass(frozen=True)
class PlannedShard:
    shard_id: str
    floor: ExtendedSequenceNumber
    floor_timestamp: float | None
    since_ms: int
    start: ExtendedSequenceNumber | None  # None: the task finds it in the range table
    start_timestamp: float | None
    iterator: str | None
    weight: float  # records its previous batch read: heavy shards get tasks of their own


class ShardCoordinator:
    def __init__(self, config: ConsumerConfig, *, kinesis: Any = None, lease_table: Any = None,
                 range_table: Any = None) -> None:
        self.config = config
        self.name = f"kinesis-dstream[{config.application_name}/{config.stream_name}]"
        self.kinesis = kinesis if kinesis is not None else KinesisClient(config)
        self.table = lease_table if lease_table is not None else LeaseTable(config)
        self.ranges = range_table if range_table is not None else BatchRangeTable(config)
        self.leases = LeaseCoordinator(config, self.table, on_lease_lost=self._lease_lost)
        self.syncer = ShardSyncer(config, self.kinesis, self.table)
        self.lease_manager = LeaseManager(config, self.leases, self.syncer)
        self.publisher: MetricsPublisher | None = None  # made at start: CloudWatch, the KCL's names
        self.checkpointer = KinesisCheckpointer(config.checkpoint_interval_ms / 1000.0)
        self._lock = threading.RLock()
        self._members: list[str] = []
        self._shards: dict[str, ShardState] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = False
        self.stopped = False
        self.fatal: BaseException | None = None
        self._up = False

    # -- lifecycle ----------------------------------------------------------------------------
    def add_member(self, key: str) -> None:
        with self._lock:
            if key not in self._members:
                self._members.append(key)

    def start(self) -> None:
        """Check the stream and tables, take a first lease, then run the loop (idempotent).

        A permanent error (no such stream, bad credentials, a malformed endpoint) is kept in
        ``fatal``: the next batch raises it, which fails the StreamingContext with a message
        naming the stream, region and endpoint. A transient one (an endpoint that does not
        answer) leaves the start-up to the loop, which retries it with backoff.
        """
        with self._lock:
            if self.started:
                return
            self.started = True
        try:
            self._start_up()
        except PERMANENT_ERRORS as exc:
            self._fail(exc)
            return
        except KinesisDStreamError as exc:
            log.warning("%s: start-up failed, retrying in the background: %s", self.name, exc)
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-coordinator",
                                        daemon=True)
        self._thread.start()

    def _start_up(self) -> None:
        self.kinesis.describe_stream_summary()
        # The batch-range table is needed by the first read only: it is made (on AWS a new
        # table takes seconds to become ACTIVE) while the leases are synced and taken.
        with ThreadPoolExecutor(1, thread_name_prefix="kinesis-dstream-ranges") as pool:
            ranges_ready = pool.submit(self.ranges.create_table_if_not_exists)
            self.table.create_table_if_not_exists()
            self.syncer.sync()
            self.leases.take_leases(limit=self.lease_manager.pace.budget)
            ranges_ready.result()
        self.lease_manager.pace.passed(self.leases.wanted_more, time.monotonic())
        self._reconcile()
        self.leases.start_renewer()
        if self.publisher is None:
            self.publisher = self.lease_manager.metrics = MetricsPublisher(self.config)
        self._up = True
        log.info("%s: driver %s coordinates the leases (input streams: %d)", self.name,
                 self.config.worker_id, len(self._members))

    def recovered_from(self, predecessor: str) -> None:
        """This driver recovers from the one whose worker id is ``predecessor``."""
        if proven_dead(predecessor):
            self.leases.taker.dead_owners.add(predecessor)
            log.info("%s: recovering as %s from driver %s, which is dead (its process is gone "
                     "from this host): its leases are taken at once", self.name,
                     self.config.worker_id, predecessor)
        else:
            log.info("%s: recovering as %s from driver %s; its leases are taken once they "
                     "expire (%d ms without renewal)", self.name, self.config.worker_id,
                     predecessor, self.config.failover_time_ms)

    def _fail(self, exc: BaseException) -> None:
        self.fatal = exc
        log.error("%s: %s; the next batch fails the StreamingContext", self.name, exc)

    def stop(self) -> None:
        """Write every completed position, release the leases, clean up the batch ranges."""
        if not self.started or self.stopped:
            return
        if not self._up:
            self.stopped = True
            self._stop.set()
            return
        self.stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._write_checkpoints(force=True)
        doomed = []
        for shard_id in self.leases.owned_shard_ids():
            self.leases.release(shard_id)
            with self._lock:
                shard = self._shards.get(shard_id)
                if shard is not None and shard.held:
                    self._close_period(shard, "released")
                    doomed += self._checkpointed_ranges(shard, keep_newest=False)
        self._delete_ranges(doomed)
        self.leases.stop()
        if self.publisher is not None:
            self.publisher.close()
        log.info("%s: stopped; leases released", self.name)

    # -- planning (called by the planner of each input stream) ------------------------------
    @property
    def taking_leases(self) -> bool:
        """The last taker pass left free leases to the next one (the ramp-up after start)."""
        return self.leases.wanted_more

    def plan(self, member: str, batch_ms: int) -> list[PlannedShard]:
        """The shards ``member`` reads in batch ``batch_ms`` (registered with the checkpoint
        policy), each with where its read starts when that is known here."""
        if self.fatal is not None:
            raise self.fatal
        self.leases.drop_lapsed()  # a lease not renewed for failover time is read no more
        planned = []
        now = time.time()
        with self._lock:
            leases = self.leases.known_leases()
            for shard_id, shard in sorted(self._shards.items()):
                if shard.member != member or shard.ended or shard.lapsed:
                    continue
                lease = leases.get(shard_id)
                if lease is not None and not parents_done(lease, leases):
                    continue
                if shard.unsettled_ms is not None:
                    log.info("%s: shard %s sits out batch %d: where batch %d ended is not "
                             "known yet", self.name, shard_id, batch_ms, shard.unsettled_ms)
                    continue
                if shard.since_ms is None:
                    shard.since_ms = batch_ms
                start, timestamp, iterator = shard.next_read(now)
                weight = shard.last_read.batch_range.records if shard.last_read else 0
                assert shard.floor is not None
                planned.append(PlannedShard(shard_id, shard.floor, shard.floor_timestamp,
                                            shard.since_ms, start, timestamp, iterator, weight))
                shard.last_planned_ms = shard.unsettled_ms = batch_ms
                shard.planned.add((member, batch_ms))
            self.checkpointer.batch_generated(batch_ms, [p.shard_id for p in planned])
        return planned

    def batch_read(self, reports: dict[tuple[str, str, int], ReadReport]) -> None:
        """Reports of partitions read (at planning, or recomputed later): counters, where
        each shard's next batch starts, and shard ends. Not a completion: nothing is
        checkpointed before the batch completes."""
        with self._lock:
            for (member, shard_id, batch_ms), report in reports.items():
                shard = self._shards.setdefault(shard_id, ShardState(shard_id))
                shard.records += report.batch_range.records
                shard.data_bytes += report.data_bytes
                shard.read_by_pids.add(report.reader_pid)
                if report.millis_behind_latest is not None:
                    shard.millis_behind_latest = report.millis_behind_latest
                if shard.member != member or shard.since_ms is None or batch_ms < shard.since_ms:
                    continue  # a report of an earlier lease period
                self._settle(shard, batch_ms)
                if shard.last_read is None or shard.last_read.batch_range.batch_ms <= batch_ms:
                    shard.last_read = report
                if report.batch_range.shard_end:
                    shard.ended = True
                    shard.child_shard_ids = report.batch_range.child_shard_ids

    @staticmethod
    def _settle(shard: ShardState, batch_ms: int) -> None:
        """Batch ``batch_ms`` of the shard has a known end now: plan the shard again."""
        if shard.unsettled_ms == batch_ms:
            shard.unsettled_ms = None

    def batch_completed(self, member: str, batch_ms: int, succeeded: bool,
                        reports: dict[tuple[str, str, int], ReadReport]) -> None:
        """Batch ``batch_ms`` of input stream ``member`` completed (or failed)."""
        mine = {shard_id: r for (m, shard_id, t), r in reports.items()
                if m == member and t == batch_ms}
        if mine:
            self.batch_read({(member, s, batch_ms): r for s, r in mine.items()
                             if not self._known(s, batch_ms)})
        reached = {shard_id: (r.batch_range.end, r.batch_range.shard_end)
                   for shard_id, r in mine.items()}
        if succeeded and self.publisher is not None:
            for shard_id, r in mine.items():
                recorder = ShardMetricsRecorder(self.publisher, shard_id)
                for _ in range(r.get_records_served):
                    recorder.get_records(True, r.get_records_ms / r.get_records_calls)
                recorder.throttled(r.throttled)
                recorder.processed(r.batch_range.records, r.data_bytes,
                                   r.millis_behind_latest, None)
        with self._lock:
            for shard_id, r in mine.items():  # every computation's refusals (RangeReports)
                shard = self._shards.setdefault(shard_id, ShardState(shard_id))
                shard.throttled += r.throttled
                shard.faults += r.faults
            shard_ids = []
            for shard in self._shards.values():
                if (member, batch_ms) in shard.planned:
                    shard.planned.discard((member, batch_ms))
                    shard_ids.append(shard.shard_id)
                    self._settle(shard, batch_ms)  # its range is recorded now, or never will be
                    report = mine.get(shard.shard_id)
                    if report is not None and report.recorded:
                        shard.recorded.add((member, batch_ms))
            touched = self.checkpointer.batch_completed(batch_ms, succeeded, reached, shard_ids)
        if touched:
            self._wake.set()

    def _known(self, shard_id: str, batch_ms: int) -> bool:
        """The read-ahead already reported this read (its counters are in)."""
        with self._lock:
            shard = self._shards.get(shard_id)
            return shard is not None and shard.last_read is not None and \
                shard.last_read.batch_range.batch_ms >= batch_ms

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        run_lease_loop(self.lease_manager, self._pass, what=f"{self.name}: coordinator pass",
                       stop=self._stop, waiting_on_parents=self._waiting_on_parents,
                       backoff=lease_loop_backoff(self.config), wake=self._wake,
                       prepare=self._start_up_if_needed, permanent=PERMANENT_ERRORS,
                       on_permanent=self._fail)

    def _start_up_if_needed(self) -> None:
        if not self._up:
            self._start_up()

    def _pass(self) -> None:
        self._reconcile()
        self._write_checkpoints(force=False)

    def _waiting_on_parents(self) -> bool:
        with self._lock:
            leases = self.leases.known_leases()
            return any(s in leases and not parents_done(leases[s], leases)
                       for s, shard in self._shards.items() if shard.held)

    def _reconcile(self) -> None:
        """Open a lease period for each lease taken; close those lost or finished."""
        owned = {shard_id: self.leases.owned_lease(shard_id)
                 for shard_id in self.leases.owned_shard_ids()}
        with self._lock:
            for shard in self._shards.values():
                if shard.held and shard.shard_id not in owned and \
                        not (shard.lapsed and self.leases.is_lapsed(shard.shard_id)):
                    self._close_period(shard, "lost")
            for shard_id, lease in sorted(owned.items()):
                shard = self._shards.get(shard_id)
                if lease is None:
                    continue
                if shard is not None and shard.held:
                    if not shard.lapsed:
                        continue
                    if self.leases.resumed(shard_id):
                        self._resume_period(shard)
                        continue
                    self._close_period(shard, "lost")  # written by another in between
                if lease.is_finished:
                    self.leases.release(shard_id)
                    continue
                self._open_period(lease)

    def _open_period(self, lease: Lease) -> None:
        floor, timestamp = lease.checkpoint, None
        if floor.sequence_number == LATEST:
            floor, timestamp = ExtendedSequenceNumber(AT_TIMESTAMP), time.time()
        elif floor.sequence_number == AT_TIMESTAMP:
            timestamp = self.config.initial_position_timestamp
        counts = {m: 0 for m in self._members}
        for shard in self._shards.values():
            if shard.held:
                counts[shard.member] = counts.get(shard.member, 0) + 1
        member = min(self._members, key=lambda m: counts[m])
        shard = self._shards.setdefault(lease.lease_key, ShardState(lease.lease_key))
        shard.open(member, floor, timestamp)
        shard.state, shard.last_checkpoint = "processing", str(lease.checkpoint)
        self.checkpointer.shard_started(lease.lease_key, lease.checkpoint)
        log.info("%s: leased shard %s from %s for input stream %d", self.name, lease.lease_key,
                 lease.checkpoint, self._members.index(member))

    def _resume_period(self, shard: ShardState) -> None:
        """A lapsed lease taken back untouched: nobody read the shard meanwhile, so its
        period goes on where it stood, its batches under way included (not from the
        checkpoint, which would hand their records out twice)."""
        shard.lapsed, shard.state = False, "processing"
        log.warning("%s: took the lease of shard %s back untouched after it lapsed; reading "
                    "on where it stood", self.name, shard.shard_id)

    def _close_period(self, shard: ShardState, state: str) -> None:
        shard.close(state)
        self.checkpointer.shard_closed(shard.shard_id)

    def _lease_lost(self, shard_id: str) -> None:
        with self._lock:
            shard = self._shards.get(shard_id)
            if shard is not None and shard.held and self.leases.is_lapsed(shard_id):
                shard.lapsed, shard.state = True, "lapsed"
                log.warning("%s: the lease of shard %s lapsed (not renewed for failover "
                            "time): no further reads of it until it is taken back",
                            self.name, shard_id)
                return
            if shard is not None and shard.held:
                self._close_period(shard, "lost")
        log.warning("%s: lost the lease of shard %s; no further checkpoint of it here",
                    self.name, shard_id)

    # -- checkpoints ------------------------------------------------------------------------
    def _write_checkpoints(self, force: bool) -> None:
        with self._lock:
            due = self.checkpointer.due_checkpoints(force=force)
        doomed: list[tuple[str, str, int]] = []
        for shard_id, position in due:
            try:
                self.leases.checkpoint(shard_id, position)
            except LeaseLostError:
                continue  # reported by the lease coordinator
            with self._lock:
                self.checkpointer.checkpoint_written(shard_id, position)
                shard = self._shards.get(shard_id)
                if shard is not None:
                    shard.last_checkpoint = str(position)
                    doomed += self._checkpointed_ranges(shard, keep_newest=True)
            log.debug("%s: checkpointed %s at %s", self.name, shard_id, position)
            if position == SHARD_END:
                self._shard_ended(shard_id)
        self._delete_ranges(doomed + self._idle_ranges(force))

    def _idle_ranges(self, force: bool) -> list[tuple[str, str, int]]:
        """The recorded ranges of batches that moved no checkpoint (a shard whose records
        were all cut off, say, by a lease that moved).

        Without this they would stay until the shard's next record is checkpointed. They go
        25 at a time, one BatchWriteItem. (An idle shard's empty reads record nothing.)
        """
        with self._lock:
            idle = [shard for shard in self._shards.values()
                    if len(shard.recorded) > 1 and self.checkpointer.all_written(shard.shard_id)]
            if not idle or (not force and sum(len(s.recorded) - 1 for s in idle) < 25):
                return []
            return [r for shard in idle for r in self._checkpointed_ranges(shard, keep_newest=True)]

    def _shard_ended(self, shard_id: str) -> None:
        with self._lock:
            shard = self._shards.get(shard_id)
            children = list(shard.child_shard_ids) if shard is not None else []
        self.leases.record_children(shard_id, children)
        log.info("%s: shard %s ended and its last records are processed; children %s", self.name,
                 shard_id, children or "from the next shard sync")
        if shard is not None:
            with self._lock:
                self._close_period(shard, "ended")
                doomed = self._checkpointed_ranges(shard, keep_newest=False)
            self._delete_ranges(doomed)
        self.leases.release(shard_id)
        self.leases.refresh()
        self.lease_manager.sync_soon()

    def _checkpointed_ranges(self, shard: ShardState,
                             keep_newest: bool) -> list[tuple[str, str, int]]:
        """The recorded ranges of the shard's completed batches, whose positions are
        checkpointed, taken off the books for ``_delete_ranges``.

        While the shard is read here the newest one stays: a batch planned before its
        predecessor's range was known looks that range up to find where it starts.
        """
        doomed = set(shard.recorded)
        if keep_newest and doomed:
            doomed.discard(max(doomed, key=lambda r: r[1]))
        shard.recorded -= doomed
        return [(member, shard.shard_id, t) for member, t in sorted(doomed)]

    def _delete_ranges(self, doomed: list[tuple[str, str, int]]) -> None:
        """One deletion for every shard's ranges (25 to a call), not a call per shard."""
        if not doomed:
            return
        try:
            self.ranges.delete(doomed)
        except KinesisDStreamError as exc:
            log.warning("%s: could not delete %d batch range(s) of %d shard(s) (they expire): "
                        "%s", self.name, len(doomed), len({d[1] for d in doomed}), exc)

    # -- visibility -------------------------------------------------------------------------
    def metrics(self, member: str | None = None) -> dict[str, dict[str, Any]]:
        with self._lock:
            view = {}
            for shard_id, shard in sorted(self._shards.items()):
                if member is not None and shard.member != member:
                    continue
                completed = self.checkpointer.completed_position(shard_id)
                view[shard_id] = dict(
                    records=shard.records, data_bytes=shard.data_bytes,
                    millis_behind_latest=shard.millis_behind_latest,
                    owner=self.config.worker_id if shard.held and not shard.lapsed else None,
                    last_checkpoint=shard.last_checkpoint,
                    processed=str(completed) if completed is not None else None,
                    state=shard.state, read_by_pids=sorted(shard.read_by_pids),
                    throttled=shard.throttled, faults=shard.faults)
            return view

    def owned_shard_ids(self) -> list[str]:
        return self.leases.owned_shard_ids()


_registry: dict[tuple, ShardCoordinator] = {}
_registry_lock = threading.Lock()


def coordinator_for(config: ConsumerConfig) -> ShardCoordinator:
    """The driver's coordinator for this application and stream (made on first use).

    A recovered driver's configuration comes from Spark's checkpoint with the worker id of
    the driver that wrote it. Two drivers started from one checkpoint directory (a zombie and
    its replacement) must not share an identity in the lease table, so this process takes
    an id of its own; it takes the predecessor's leases at once where that process is
    provably dead (it ran on this host and its pid is gone), else after failover_time_ms.
    """
    predecessor = None
    if made_by_another_process(config.worker_id):
        predecessor = config.worker_id
        config = config.replace(worker_id=_process_worker_id())
    key = (config.application_name, config.stream_name, config.region_name,
           config.kinesis_endpoint, config.dynamodb_endpoint)
    with _registry_lock:
        coordinator = _registry.get(key)
        if coordinator is None or coordinator.stopped:
            coordinator = _registry[key] = ShardCoordinator(config)
            if predecessor is not None:
                coordinator.recovered_from(predecessor)
        return coordinator


_worker_ids: dict[int, str] = {}


def _process_worker_id() -> str:
    """One worker id per driver process, for every stream it recovers."""
    return _worker_ids.setdefault(os.getpid(), default_worker_id())


def coordinators() -> list[ShardCoordinator]:
    with _registry_lock:
        return list(_registry.values())
