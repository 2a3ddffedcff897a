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
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..aws.kinesis import KinesisClient
from ..aws.lease_table import Lease, LeaseTable
from ..aws.range_table import BatchRangeTable
from ..config import ConsumerConfig
from ..errors import (
    ConfigurationError,
    CredentialsError,
    KinesisDStreamError,
    LeaseLostError,
    StreamNotFoundError,
)
from ..records import AT_TIMESTAMP, LATEST, ExtendedSequenceNumber
from ..retry import Backoff, FaultLog
from ..worker.leases import LeaseCoordinator, LeaseManager
from ..worker.metrics import MetricsPublisher, ShardMetricsRecorder
from ..worker.shard_sync import ShardSyncer, parents_done
from .checkpointer import SHARD_END, KinesisCheckpointer
from .shard_reader import ReadReport

log = logging.getLogger(__name__)

_TICK_S = 0.2
PERMANENT_ERRORS = (StreamNotFoundError, CredentialsError, ConfigurationError)


@dataclass
class LeasePeriod:
    """A shard from the moment we took its lease: where its batches start, who reads it."""

    shard_id: str
    member: str  # the input stream (its key) that reads this shard
    floor: ExtendedSequenceNumber
    floor_timestamp: float | None
    since_ms: int | None = None  # the first batch planned in this period
    last_planned_ms: int | None = None
    # The last planned batch while its range end is unknown: no read-ahead report yet and
    # not completed. Its range is recorded later by its own output operation, so a batch
    # planned meanwhile could only guess its start and read the same records again.
    unsettled_ms: int | None = None
    ended: bool = False  # a batch read its last record: plan no more
    child_shard_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlannedShard:
    shard_id: str
    floor: ExtendedSequenceNumber
    floor_timestamp: float | None
    since_ms: int
    previous_ms: int | None  # the shard's previous batch in this lease period, if any


@dataclass
class ShardStats:
    records: int = 0
    data_bytes: int = 0
    millis_behind_latest: int | None = None
    last_checkpoint: str | None = None
    state: str = "processing"
    read_by_pids: set = field(default_factory=set)


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
        self._periods: dict[str, LeasePeriod] = {}
        self._stats: dict[str, ShardStats] = {}
        # (member, shard) -> completed batches whose range is recorded: deleted once checkpointed
        self._recorded: dict[tuple[str, str], set[int]] = {}
        self._planned: dict[tuple[str, int], list[str]] = {}  # (member, batch) -> shards
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
        self.table.create_table_if_not_exists()
        self.ranges.create_table_if_not_exists()
        self.syncer.sync()
        self.leases.take_leases(limit=self.lease_manager.pace.budget)
        self.lease_manager.pace.passed(self.leases.wanted_more, time.monotonic())
        self._reconcile()
        self.leases.start_renewer()
        if self.publisher is None:
            self.publisher = self.lease_manager.metrics = MetricsPublisher(self.config)
        self._up = True
        log.info("%s: driver %s coordinates the leases (input streams: %d)", self.name,
                 self.config.worker_id, len(self._members))

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
                period = self._periods.pop(shard_id, None)
                self.checkpointer.shard_closed(shard_id)
                if shard_id in self._stats and self._stats[shard_id].state == "processing":
                    self._stats[shard_id].state = "released"
            if period is not None:
                doomed += self._checkpointed_ranges(period.member, shard_id, keep_newest=False)
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
        policy), each with its lease period's floor and its previous batch in the period."""
        if self.fatal is not None:
            raise self.fatal
        planned = []
        with self._lock:
            leases = self.leases.known_leases()
            for shard_id, period in sorted(self._periods.items()):
                if period.member != member or period.ended:
                    continue
                lease = leases.get(shard_id)
                if lease is not None and not parents_done(lease, leases):
                    continue
                if period.unsettled_ms is not None:
                    log.info("%s: shard %s sits out batch %d: where batch %d ended is not "
                             "known yet", self.name, shard_id, batch_ms, period.unsettled_ms)
                    continue
                if period.since_ms is None:
                    period.since_ms = batch_ms
                planned.append(PlannedShard(shard_id, period.floor, period.floor_timestamp,
                                            period.since_ms, period.last_planned_ms))
                period.last_planned_ms = period.unsettled_ms = batch_ms
            self.checkpointer.batch_generated(batch_ms, [p.shard_id for p in planned])
            if planned:
                self._planned[(member, batch_ms)] = [p.shard_id for p in planned]
        return planned

    def batch_read(self, reports: dict[tuple[str, str, int], ReadReport]) -> None:
        """Reports of partitions read (at planning, or recomputed later): stats and ends."""
        with self._lock:
            for (_, shard_id, batch_ms), report in reports.items():
                period = self._settle(shard_id, batch_ms)
                stats = self._stats.setdefault(shard_id, ShardStats())
                stats.records += report.batch_range.records
                stats.data_bytes += report.data_bytes
                stats.read_by_pids.add(report.reader_pid)
                if report.millis_behind_latest is not None:
                    stats.millis_behind_latest = report.millis_behind_latest
                if report.batch_range.shard_end and period is not None:
                    period.ended = True
                    period.child_shard_ids = report.batch_range.child_shard_ids

    def _settle(self, shard_id: str, batch_ms: int) -> LeasePeriod | None:
        """Batch ``batch_ms`` of the shard has a known end now: plan the shard again."""
        period = self._periods.get(shard_id)
        if period is not None and period.unsettled_ms == batch_ms:
            period.unsettled_ms = None
        return period

    def batch_completed(self, member: str, batch_ms: int, succeeded: bool,
                        reports: dict[tuple[str, str, int], ReadReport]) -> None:
        """Batch ``batch_ms`` of input stream ``member`` completed (or failed)."""
        reached = {shard_id: (r.batch_range.end, r.batch_range.shard_end)
                   for (_, shard_id, t), r in reports.items() if t == batch_ms}
        if succeeded and self.publisher is not None:
            for (_, shard_id, t), r in reports.items():
                if t == batch_ms:
                    recorder = ShardMetricsRecorder(self.publisher, shard_id)
                    for _ in range(r.get_records_calls):
                        recorder.get_records(True, r.get_records_ms / r.get_records_calls)
                    recorder.processed(r.batch_range.records, r.data_bytes,
                                       r.millis_behind_latest, None)
        with self._lock:
            shard_ids = self._planned.pop((member, batch_ms), [])
            for shard_id in shard_ids:  # its range is recorded now, or never will be
                self._settle(shard_id, batch_ms)
            touched = self.checkpointer.batch_completed(batch_ms, succeeded, reached, shard_ids)
            for shard_id in reached:
                self._recorded.setdefault((member, shard_id), set()).add(batch_ms)
        if touched:
            self._wake.set()

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        backoff = Backoff(base_ms=200, cap_ms=30_000)
        fault = FaultLog(log, f"{self.name}: coordinator pass")
        while not self._stop.is_set():
            wait = _TICK_S
            try:
                if not self._up:
                    self._start_up()
                self.lease_manager.run_due(time.monotonic(), self._waiting_on_parents)
                self._reconcile()
                self._write_checkpoints(force=False)
                backoff.reset()
                fault.succeeded()
            except PERMANENT_ERRORS as exc:
                self._fail(exc)
                return
            except KinesisDStreamError as exc:
                wait = backoff.next_wait_s()
                fault.failed(exc, wait)
                self._stop.wait(wait)
                continue
            except Exception:  # noqa: BLE001 - keep coordinating, loudly
                log.exception("%s: coordinator pass failed unexpectedly", self.name)
            self._wake.wait(wait)
            self._wake.clear()

    def _waiting_on_parents(self) -> bool:
        with self._lock:
            leases = self.leases.known_leases()
            return any(s in leases and not parents_done(leases[s], leases) for s in self._periods)

    def _reconcile(self) -> None:
        """Open a lease period for each lease taken; close those lost or finished."""
        owned = {shard_id: self.leases.owned_lease(shard_id)
                 for shard_id in self.leases.owned_shard_ids()}
        with self._lock:
            for shard_id in list(self._periods):
                if shard_id not in owned:
                    self._close_period(shard_id, "lost")
            for shard_id, lease in sorted(owned.items()):
                if lease is None or shard_id in self._periods:
                    continue
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
        for period in self._periods.values():
            counts[period.member] = counts.get(period.member, 0) + 1
        member = min(self._members, key=lambda m: counts[m])
        self._periods[lease.lease_key] = LeasePeriod(lease.lease_key, member, floor, timestamp)
        self.checkpointer.shard_started(lease.lease_key, lease.checkpoint)
        stats = self._stats.setdefault(lease.lease_key, ShardStats())
        stats.state, stats.last_checkpoint = "processing", str(lease.checkpoint)
        log.info("%s: leased shard %s from %s for input stream %d", self.name, lease.lease_key,
                 lease.checkpoint, self._members.index(member))

    def _close_period(self, shard_id: str, state: str) -> None:
        self._periods.pop(shard_id, None)
        self.checkpointer.shard_closed(shard_id)
        if shard_id in self._stats:
            self._stats[shard_id].state = state

    def _lease_lost(self, shard_id: str) -> None:
        with self._lock:
            self._close_period(shard_id, "lost")
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
                period = self._periods.get(shard_id)
                if shard_id in self._stats:
                    self._stats[shard_id].last_checkpoint = str(position)
            log.debug("%s: checkpointed %s at %s", self.name, shard_id, position)
            if period is not None:
                doomed += self._checkpointed_ranges(period.member, shard_id, keep_newest=True)
            if position == SHARD_END:
                self._shard_ended(shard_id)
        self._delete_ranges(doomed + self._idle_ranges(force))

    def _idle_ranges(self, force: bool) -> list[tuple[str, str, int]]:
        """The ranges of batches that moved no checkpoint (an idle shard's empty batches).

        Without this they would stay until the shard's next record is checkpointed. They go
        25 at a time, one BatchWriteItem, so an idle stream costs a write per 25 batches.
        """
        with self._lock:
            idle = [(key, len(times) - 1) for key, times in self._recorded.items()
                    if len(times) > 1 and self.checkpointer.all_written(key[1])]
        if not idle or (not force and sum(n for _, n in idle) < 25):
            return []
        return [r for (member, shard_id), _ in idle
                for r in self._checkpointed_ranges(member, shard_id, keep_newest=True)]

    def _shard_ended(self, shard_id: str) -> None:
        with self._lock:
            period = self._periods.get(shard_id)
        children = list(period.child_shard_ids) if period is not None else []
        self.leases.record_children(shard_id, children)
        log.info("%s: shard %s ended and its last records are processed; children %s", self.name,
                 shard_id, children or "from the next shard sync")
        with self._lock:
            self._close_period(shard_id, "ended")
        if period is not None:
            self._delete_ranges(self._checkpointed_ranges(period.member, shard_id,
                                                          keep_newest=False))
        self.leases.release(shard_id)
        self.leases.refresh()
        self.lease_manager.sync_soon()

    def _checkpointed_ranges(self, member: str, shard_id: str,
                             keep_newest: bool) -> list[tuple[str, str, int]]:
        """The ranges of the shard's completed batches, whose positions are checkpointed,
        taken off the books for ``_delete_ranges``.

        While the shard is read here the newest one stays: a batch planned before its
        predecessor's range was known looks that range up to find where it starts.
        """
        with self._lock:
            times = self._recorded.get((member, shard_id), set())
            doomed = set(times)
            if keep_newest and times:
                doomed.discard(max(times))
            times -= doomed
        return [(member, shard_id, t) for t in sorted(doomed)]

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
            for shard_id, stats in sorted(self._stats.items()):
                period = self._periods.get(shard_id)
                if member is not None and (period is None or period.member != member):
                    continue
                completed = self.checkpointer.completed_position(shard_id)
                view[shard_id] = dict(
                    records=stats.records, data_bytes=stats.data_bytes,
                    millis_behind_latest=stats.millis_behind_latest,
                    owner=self.config.worker_id if period is not None else None,
                    last_checkpoint=stats.last_checkpoint,
                    processed=str(completed) if completed is not None else None,
                    state=stats.state, read_by_pids=sorted(stats.read_by_pids))
            return view

    def owned_shard_ids(self) -> list[str]:
        return self.leases.owned_shard_ids()


_registry: dict[tuple, ShardCoordinator] = {}
_registry_lock = threading.Lock()


def coordinator_for(config: ConsumerConfig) -> ShardCoordinator:
    """The driver's coordinator for this application and stream (made on first use)."""
    key = (config.application_name, config.stream_name, config.region_name,
           config.kinesis_endpoint, config.dynamodb_endpoint)
    with _registry_lock:
        coordinator = _registry.get(key)
        if coordinator is None or coordinator.stopped:
            coordinator = _registry[key] = ShardCoordinator(config)
        return coordinator


def coordinators() -> list[ShardCoordinator]:
    with _registry_lock:
        return list(_registry.values())
