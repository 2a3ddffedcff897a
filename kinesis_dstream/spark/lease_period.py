"""Runs in the driver: lease periods, and what the driver knows of each shard.

A lease period runs from taking a lease to losing or releasing it. It has a floor: the
lease's checkpoint when taken, where its first batch starts; LATEST is pinned to
AT_TIMESTAMP of that moment, so that the batch that starts there reads the same records
however often it is computed. A lease that lapsed (not renewed for failover time) and is
taken back untouched resumes its period where it stood; any other change closes it.

What the driver knows of a shard is one ``ShardState``: its lease period, its reads, its
checkpoint progress over its batches (``ShardTrack``, which each plan and completion of the
shard moves; ``checkpointer`` says when a position is due) and, once its lease lapsed, the
lease as it was last held; the lease coordinator only reports what happened to the lease,
and this module alone decides what that means for the period.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..aws.lease_table import Lease
from ..aws.range_table import start_after
from ..records import AT_TIMESTAMP, LATEST, ExtendedSequenceNumber
from ..retrieval import ITERATOR_TTL_S, ReadReport
from ..worker.leases import LeaseCoordinator

log = logging.getLogger(__name__)


@dataclass
class _Batch:
    time_ms: int
    end: ExtendedSequenceNumber | None = None  # last record the batch read, if any
    shard_end: bool = False
    succeeded: bool | None = None  # None while the batch runs


@dataclass
class ShardTrack:
    """One shard's progress through this driver's batches in one lease period (the shard's
    ``ShardState`` holds it while it holds the lease): the completed position advances in
    batch order and stops for good at the first batch that failed."""

    shard_id: str
    batches: deque = field(default_factory=deque)
    completed: ExtendedSequenceNumber | None = None  # highest position of completed batches
    ended: bool = False  # the batch holding the shard's last records completed
    failed_batch_ms: int | None = None
    written: ExtendedSequenceNumber | None = None  # in the lease table
    written_at: float = -math.inf

    @property
    def has_running_batches(self) -> bool:
        return any(b.succeeded is None for b in self.batches)

    @property
    def has_failed(self) -> bool:
        return self.failed_batch_ms is not None

    @property
    def all_written(self) -> bool:
        """Every batch completed and what they reached is in the lease table (an idle
        shard's empty batches, say): their ranges serve nothing any more."""
        if self.failed_batch_ms is not None or self.has_running_batches:
            return False
        return self.completed is None or (self.written is not None
                                          and self.completed <= self.written)

    def batch_generated(self, time_ms: int) -> None:
        self.batches.append(_Batch(time_ms))

    def batch_completed(self, time_ms: int, succeeded: bool, end: ExtendedSequenceNumber | None,
                        shard_end: bool) -> bool:
        """Batch ``time_ms`` completed, having read through ``end`` (None: nothing) and
        ``shard_end``. A batch that planned the shard but never read it (an output operation
        that looked at only some partitions) made no progress: its records come in a later
        batch. True when the shard's progress may have changed."""
        for batch in self.batches:
            if batch.time_ms == time_ms and batch.succeeded is None:
                batch.end, batch.shard_end, batch.succeeded = end, shard_end, succeeded
                self.advance()
                return True
        return False

    def advance(self) -> None:
        while self.failed_batch_ms is None and self.batches and self.batches[0].succeeded is not None:
            batch = self.batches.popleft()
            if not batch.succeeded:
                self.failed_batch_ms = batch.time_ms
                return
            if batch.end is not None and (self.completed is None or batch.end > self.completed):
                self.completed = batch.end
            self.ended = self.ended or batch.shard_end


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
    # Under fan-out, the executor process holding the shard's subscription, as the period's
    # newest read named it: the task asks it to read (``retrieval.subscription_peers``).
    subscriber: str | None = None


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
    # The lease as last held, once it was not renewed for failover time: plan no more, but
    # keep the period (and the batches under way) in case it is taken back untouched.
    lapsed: Lease | None = None
    track: ShardTrack | None = None  # the period's progress through the checkpoint policy
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

    def open(self, member: str, floor: ExtendedSequenceNumber, timestamp: float | None,
             checkpoint: ExtendedSequenceNumber) -> None:
        """A lease period begins, the lease's checkpoint being ``checkpoint``."""
        self.member, self.floor, self.floor_timestamp = member, floor, timestamp
        self.lapsed = None
        self.since_ms = self.last_planned_ms = self.unsettled_ms = None
        self.ended, self.child_shard_ids, self.last_read = False, (), None
        self.state, self.last_checkpoint = "processing", checkpoint
        self.track = ShardTrack(self.shard_id, written=checkpoint)

    def close(self, state: str) -> None:
        """Lease lost, released or finished: nothing more is planned or written for it here."""
        self.member = None
        self.lapsed = None
        self.state = state
        self.track = None

    def lapse(self, held: Lease, seen: Lease | None) -> bool:
        """The lease was let go for want of renewal, ``held`` as we last held it; ``seen`` is
        the last table scan's. True when the period is kept (lapsed) for a take back;
        False when another worker is known to have written the lease since."""
        self.lapsed, self.state = held, "lapsed"
        return self.still_lapsed(seen)

    def still_lapsed(self, seen: Lease | None) -> bool:
        """Lapsed, and nobody else is known to have written the lease since (a scan may
        predate our last renewal; any other worker's write moves the counter past ours)."""
        return self.lapsed is not None and \
            (seen is None or seen.lease_counter <= self.lapsed.lease_counter)

    def taken_back(self, previous: Lease) -> bool:
        """We took the lease again, finding it as ``previous``. Taken back untouched (the
        take's condition held on the counter we last wrote: nobody took it, which moves the
        counter, so nobody read the shard meanwhile) the period goes on where it stood, its
        batches under way included, not from the checkpoint, which would hand their records
        out twice. True when it resumed."""
        if self.lapsed is None or (previous.lease_owner, previous.lease_counter) != \
                (self.lapsed.lease_owner, self.lapsed.lease_counter):
            return False
        self.lapsed, self.state = None, "processing"
        return True

    def checkpointed(self, position: ExtendedSequenceNumber, at: float) -> None:
        """``position`` is in the lease table now (written at ``at`` on the policy's clock)."""
        self.last_checkpoint = position
        if self.track is not None:
            self.track.written, self.track.written_at = position, at

    def settle(self, batch_ms: int) -> None:
        """Batch ``batch_ms`` of the shard has a known end now: plan the shard again."""
        if self.unsettled_ms == batch_ms:
            self.unsettled_ms = None

    def plan(self, member: str, batch_ms: int, now: float) -> PlannedShard:
        """Plan the shard into ``member``'s batch ``batch_ms``: where its read starts."""
        if self.since_ms is None:
            self.since_ms = batch_ms
        start, timestamp, iterator = self._next_read(now)
        last = self.last_read.batch_range if self.last_read is not None else None
        weight = last.records if last is not None else 0
        assert self.floor is not None
        self.last_planned_ms = self.unsettled_ms = batch_ms
        self.planned.add((member, batch_ms))
        if self.track is not None:  # the batch joins the shard's checkpoint progress
            self.track.batch_generated(batch_ms)
        return PlannedShard(self.shard_id, self.floor, self.floor_timestamp, self.since_ms,
                            start, timestamp, iterator, weight,
                            last.subscriber if last is not None else None)

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

    def complete(self, member: str, batch_ms: int, report: ReadReport | None,
                 succeeded: bool) -> bool:
        """``member``'s batch ``batch_ms`` completed (or failed), with the shard's read in it
        if any (the read-ahead's was reported already, a later computation's was not). True
        when the batch had planned the shard and its checkpoint progress may have moved."""
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
        if self.track is None:
            return False
        if report is None:  # planned, never read (an output operation that skipped it)
            return self.track.batch_completed(batch_ms, succeeded, None, False)
        return self.track.batch_completed(batch_ms, succeeded, report.batch_range.end,
                                          report.batch_range.shard_end)

    def view(self, owner: str) -> dict[str, Any]:
        """The shard's line in ``metrics()``."""
        completed = self.track.completed if self.track is not None else None
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

    def __init__(self, name: str, leases: LeaseCoordinator, initial_timestamp: float | None,
                 lock: threading.RLock) -> None:
        self.name = name
        self.leases = leases
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
        seen = self.leases.known_leases()
        with self.lock:
            for shard in self.shards.values():
                if shard.held and shard.shard_id not in owned and \
                        not shard.still_lapsed(seen.get(shard.shard_id)):
                    shard.close("lost")
            for shard_id, lease in sorted(owned.items()):
                known = self.shards.get(shard_id)
                if lease is None:
                    continue
                if known is not None and known.held:
                    if known.lapsed is None:
                        continue
                    known.close("lost")  # taken back, but written by another in between
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
        self.shard(lease.lease_key).open(member, floor, timestamp, lease.checkpoint)
        log.info("%s: leased shard %s from %s for input stream %d", self.name, lease.lease_key,
                 lease.checkpoint, self.members.index(member))

    def lease_taken(self, previous: Lease, new: Lease) -> None:
        """The lease coordinator took ``new``, found as ``previous``: a lapsed period taken
        back untouched resumes here; any other take opens a period at the next reconcile."""
        with self.lock:
            shard = self.shards.get(new.lease_key)
            if shard is None or not shard.held or not shard.taken_back(previous):
                return
        log.warning("%s: took the lease of shard %s back untouched after it lapsed; reading "
                    "on where it stood", self.name, new.lease_key)

    def lease_lost(self, shard_id: str, lapsed: Lease | None = None) -> None:
        """The lease coordinator let go of the lease (``lapsed``: for want of renewal, as we
        last held it): a lapse keeps the period, else it ends."""
        seen = self.leases.known_leases().get(shard_id) if lapsed is not None else None
        with self.lock:
            shard = self.shards.get(shard_id)
            if shard is not None and shard.held:
                if lapsed is not None and shard.lapse(lapsed, seen):
                    log.warning("%s: the lease of shard %s lapsed (not renewed for failover "
                                "time): no further reads of it until it is taken back",
                                self.name, shard_id)
                    return
                shard.close("lost")
        log.warning("%s: lost the lease of shard %s; no further checkpoint of it here",
                    self.name, shard_id)
