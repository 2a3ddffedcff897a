"""Runs in the driver: lease periods, and what the driver knows of each shard.

A lease period runs from taking a lease to losing or releasing it. It has a floor: the
lease's checkpoint when taken, where its first batch starts; LATEST is pinned to
AT_TIMESTAMP of that moment, so that the batch that starts there reads the same records
however often it is computed. A lease that lapsed (not renewed for failover time) and is
taken back untouched resumes its period where it stood; any other change closes it.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..aws.lease_table import Lease
from ..records import AT_TIMESTAMP, LATEST, ExtendedSequenceNumber
from ..retrieval import ITERATOR_TTL_S, ReadReport, start_after
from ..worker.leases import LeaseCoordinator
from .checkpointer import KinesisCheckpointer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedShard:
    """One shard of a batch's plan (``planning.BatchPlan``)."""

    shard_id: str
    floor: ExtendedSequenceNumber
    floor_timestamp: float | None
    since_ms: int
    start: ExtendedSequenceNumber | None  # None: the task finds it in the range table
    start_timestamp: float | None
    iterator: str | None
    weight: float  # records its previous batch read: heavy shards get tasks of their own


@dataclass
class ShardState:
    """Everything the driver knows of one shard, in one place.

    Each batch after the period's first starts where the shard's previous batch ended,
    known from that batch's read report (``last_read``), with the iterator that read handed
    back. The counters outlive the period, for ``metrics()``.
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
    last_checkpoint: ExtendedSequenceNumber | None = None
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

    def settle(self, batch_ms: int) -> None:
        """Batch ``batch_ms`` of the shard has a known end now: plan the shard again."""
        if self.unsettled_ms == batch_ms:
            self.unsettled_ms = None

    def plan(self, member: str, batch_ms: int, now: float) -> PlannedShard:
        """Plan the shard into ``member``'s batch ``batch_ms``: where its read starts."""
        if self.since_ms is None:
            self.since_ms = batch_ms
        start, timestamp, iterator = self._next_read(now)
        weight = self.last_read.batch_range.records if self.last_read else 0
        assert self.floor is not None
        self.last_planned_ms = self.unsettled_ms = batch_ms
        self.planned.add((member, batch_ms))
        return PlannedShard(self.shard_id, self.floor, self.floor_timestamp, self.since_ms,
                            start, timestamp, iterator, weight)

    def _next_read(self, now: float) -> tuple[ExtendedSequenceNumber | None, float | None, str | None]:
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

    def read(self, member: str, batch_ms: int, report: ReadReport) -> None:
        """A read of the shard in ``member``'s batch ``batch_ms`` (at its read-ahead, or
        recomputed later): counters, where its next batch starts, and its end."""
        self.records += report.batch_range.records
        self.data_bytes += report.data_bytes
        self.read_by_pids.add(report.reader_pid)
        if report.millis_behind_latest is not None:
            self.millis_behind_latest = report.millis_behind_latest
        if self.member != member or self.since_ms is None or batch_ms < self.since_ms:
            return  # a report of an earlier lease period
        self.settle(batch_ms)
        if self.last_read is None or self.last_read.batch_range.batch_ms <= batch_ms:
            self.last_read = report
        if report.batch_range.shard_end:
            self.ended = True
            self.child_shard_ids = report.batch_range.child_shard_ids

    def complete(self, member: str, batch_ms: int, report: ReadReport | None) -> bool:
        """``member``'s batch ``batch_ms`` completed, with the shard's read in it if any (the
        read-ahead's was reported already, a later computation's was not). True when the
        batch had planned the shard."""
        if report is not None:
            if self.last_read is None or self.last_read.batch_range.batch_ms < batch_ms:
                self.read(member, batch_ms, report)
            self.throttled += report.throttled  # every computation's (RangeReports)
            self.faults += report.faults
        if (member, batch_ms) not in self.planned:
            return False
        self.planned.discard((member, batch_ms))
        self.settle(batch_ms)  # its range is recorded now, or never will be
        if report is not None and report.recorded:
            self.recorded.add((member, batch_ms))
        return True

    def view(self, owner: str, completed: ExtendedSequenceNumber | None) -> dict[str, Any]:
        """The shard's line in ``metrics()``."""
        return dict(records=self.records, data_bytes=self.data_bytes,
                    millis_behind_latest=self.millis_behind_latest,
                    owner=owner if self.held and not self.lapsed else None,
                    last_checkpoint=str(self.last_checkpoint)
                    if self.last_checkpoint is not None else None,
                    processed=str(completed) if completed is not None else None,
                    state=self.state, read_by_pids=sorted(self.read_by_pids),
                    throttled=self.throttled, faults=self.faults)


class LeasePeriods:
    """The driver's shards, and their lease periods kept in step with the lease coordinator.

    Each held shard is assigned to one of the input streams (members) that name this
    application, the least loaded, so nothing is read twice between them.
    """

    def __init__(self, name: str, leases: LeaseCoordinator, checkpointer: KinesisCheckpointer,
                 initial_timestamp: float | None, lock: threading.RLock) -> None:
        self.name = name
        self.leases = leases
        self.checkpointer = checkpointer
        self.initial_timestamp = initial_timestamp
        self.lock = lock
        self.members: list[str] = []
        self.shards: dict[str, ShardState] = {}

    def shard(self, shard_id: str) -> ShardState:
        return self.shards.setdefault(shard_id, ShardState(shard_id))

    def reconcile(self) -> None:
        """Open a lease period for each lease taken; close those lost or finished."""
        owned = {shard_id: self.leases.owned_lease(shard_id)
                 for shard_id in self.leases.owned_shard_ids()}
        with self.lock:
            for shard in self.shards.values():
                if shard.held and shard.shard_id not in owned and \
                        not (shard.lapsed and self.leases.is_lapsed(shard.shard_id)):
                    self.close(shard, "lost")
            for shard_id, lease in sorted(owned.items()):
                known = self.shards.get(shard_id)
                if lease is None:
                    continue
                if known is not None and known.held:
                    if not known.lapsed:
                        continue
                    if self.leases.resumed(shard_id):
                        self._resume(known)
                        continue
                    self.close(known, "lost")  # written by another in between
                if lease.is_finished:
                    self.leases.release(shard_id)
                    continue
                self.open(lease)

    def open(self, lease: Lease) -> None:
        floor, timestamp = lease.checkpoint, None
        if floor.sequence_number == LATEST:
            floor, timestamp = ExtendedSequenceNumber(AT_TIMESTAMP), time.time()
        elif floor.sequence_number == AT_TIMESTAMP:
            timestamp = self.initial_timestamp
        counts = {m: 0 for m in self.members}
        for shard in self.shards.values():
            if shard.held and shard.member is not None:
                counts[shard.member] = counts.get(shard.member, 0) + 1
        member = min(self.members, key=lambda m: counts[m])
        shard = self.shard(lease.lease_key)
        shard.open(member, floor, timestamp)
        shard.state, shard.last_checkpoint = "processing", lease.checkpoint
        self.checkpointer.shard_started(lease.lease_key, lease.checkpoint)
        log.info("%s: leased shard %s from %s for input stream %d", self.name, lease.lease_key,
                 lease.checkpoint, self.members.index(member))

    def _resume(self, shard: ShardState) -> None:
        """A lapsed lease taken back untouched: nobody read the shard meanwhile, so its
        period goes on where it stood, its batches under way included (not from the
        checkpoint, which would hand their records out twice)."""
        shard.lapsed, shard.state = False, "processing"
        log.warning("%s: took the lease of shard %s back untouched after it lapsed; reading "
                    "on where it stood", self.name, shard.shard_id)

    def close(self, shard: ShardState, state: str) -> None:
        shard.close(state)
        self.checkpointer.shard_closed(shard.shard_id)

    def lease_lost(self, shard_id: str) -> None:
        """The lease coordinator let go of the lease: a lapse keeps the period, else it ends."""
        with self.lock:
            shard = self.shards.get(shard_id)
            if shard is not None and shard.held and self.leases.is_lapsed(shard_id):
                shard.lapsed, shard.state = True, "lapsed"
                log.warning("%s: the lease of shard %s lapsed (not renewed for failover "
                            "time): no further reads of it until it is taken back",
                            self.name, shard_id)
                return
            if shard is not None and shard.held:
                self.close(shard, "lost")
        log.warning("%s: lost the lease of shard %s; no further checkpoint of it here",
                    self.name, shard_id)

