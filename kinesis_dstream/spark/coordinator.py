"""Runs in the driver: one shard coordinator per (application, stream) in a driver process.

It is the KCL worker of the driver, without record fetching: it syncs shards into the KCL
lease table, takes and renews leases under one worker id, hands each held shard to one of
the input DStreams that name this application (``lease_period``), plans their batches
(``planning``) and writes the checkpoints the policy (``checkpointer``) says are due. Several
drivers with one application name split the shards through the lease table, as KCL workers
do. Child shards are planned only once every parent has checkpointed SHARD_END.

Permanent errors (no such stream, bad credentials) found after start are kept in
``fatal`` and raised by the next batch, which fails the StreamingContext
(``awaitTermination`` raises); transient ones back off and are logged at most once a minute.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..aws.kinesis import KinesisClient
from ..aws.lease_table import LeaseTable
from ..aws.range_table import BatchRangeTable
from ..config import ConsumerConfig
from ..errors import (
    ConfigurationError,
    CredentialsError,
    KinesisDStreamError,
    LeaseLostError,
    StreamNotFoundError,
)
from ..retrieval import ReadReport
from ..worker.lease_loop import lease_loop_backoff, run_lease_loop
from ..worker.lease_manager import LeaseManager
from ..worker.leases import LeaseCoordinator
from ..worker.metrics import MetricsPublisher, ShardMetricsRecorder
from ..worker.shard_sync import ShardSyncer
from ..worker.stall import ShardsView, StallWatch, largest_lag
from ..worker_id import proven_dead
from .checkpointer import SHARD_END, KinesisCheckpointer
from .lease_period import LeasePeriods, ShardState
from .planning import BatchPlan

log = logging.getLogger(__name__)

PERMANENT_ERRORS = (StreamNotFoundError, CredentialsError, ConfigurationError)


class ShardCoordinator:
    def __init__(self, config: ConsumerConfig, *, kinesis: Any = None, lease_table: Any = None,
                 range_table: Any = None) -> None:
        self.config = config
        self.name = f"kinesis-dstream[{config.application_name}/{config.stream_name}]"
        self.kinesis = kinesis if kinesis is not None else KinesisClient(config)
        self.table = lease_table if lease_table is not None else LeaseTable(config)
        self.ranges = range_table if range_table is not None else BatchRangeTable(config)
        self.leases = LeaseCoordinator(
            config, self.table, on_lease_lost=lambda shard_id: self.periods.lease_lost(shard_id),
            on_lease_lapsed=lambda shard_id, held: self.periods.lease_lost(shard_id, held),
            on_lease_taken=lambda previous, new: self.periods.lease_taken(previous, new))
        self.syncer = ShardSyncer(config, self.kinesis, self.table)
        self.lease_manager = LeaseManager(config, self.leases, self.syncer)
        self.publisher: MetricsPublisher | None = None  # made at start: CloudWatch, the KCL's names
        self.checkpointer = KinesisCheckpointer(config.checkpoint_interval_ms / 1000.0)
        self._lock = threading.RLock()
        self.periods = LeasePeriods(self.name, self.leases, config.initial_position_timestamp,
                                    self._lock)
        self._shards = self.periods.shards
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = False
        self.stopped = False
        self.fatal: BaseException | None = None
        self._up = False
        self.stalls = StallWatch.of(config, self.name)

    # -- lifecycle ----------------------------------------------------------------------------
    def add_member(self, key: str) -> None:
        with self._lock:
            if key not in self.periods.members:
                self.periods.members.append(key)

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
        self.periods.reconcile()
        self.leases.start_renewer()
        if self.publisher is None:
            self.publisher = self.lease_manager.metrics = MetricsPublisher(self.config)
        self._up = True
        log.info("%s: driver %s coordinates the leases (input streams: %d)", self.name,
                 self.config.worker_id, len(self.periods.members))

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
                    shard.close("released")
                    doomed += self._checkpointed_ranges(shard, keep_newest=False)
        self._delete_ranges(doomed)
        self.leases.stop()
        if self.publisher is not None:
            self.publisher.close()
        log.info("%s: stopped; leases released", self.name)

    # -- planning (the planners' interface, ``planning.BatchCoordinator``) ------------------
    def plan(self, member: str, batch_ms: int) -> BatchPlan:
        """The shards ``member`` reads in batch ``batch_ms`` (the batch joins each one's
        checkpoint progress), each with where its read starts when that is known here."""
        if self.fatal is not None:
            raise self.fatal
        # A lease not renewed for failover time is read no more (dropped first).
        waiting = self.leases.waiting_on_parents(list(self._shards), drop_lapsed=True)
        planned = []
        now = time.time()
        with self._lock:
            for shard_id, shard in sorted(self._shards.items()):
                if shard.member != member or shard.ended or shard.lapsed:
                    continue
                if shard_id in waiting:
                    continue
                if shard.unsettled_ms is not None:
                    log.info("%s: shard %s sits out batch %d: where batch %d ended is not "
                             "known yet", self.name, shard_id, batch_ms, shard.unsettled_ms)
                    continue
                planned.append(shard.plan(member, batch_ms, now))
        return BatchPlan(planned, self.config.worker_id, self.leases.wanted_more)

    def batch_read(self, member: str, batch_ms: int, reads: dict[str, ReadReport]) -> None:
        """Reports of ``member``'s partitions of batch ``batch_ms`` read (at planning, or
        recomputed later): counters, where each shard's next batch starts, and shard ends.
        Not a completion: nothing is checkpointed before the batch completes."""
        with self._lock:
            for shard_id, report in reads.items():
                self._shard(shard_id).read(member, batch_ms, report)

    def batch_completed(self, member: str, batch_ms: int, succeeded: bool,
                        reads: dict[str, ReadReport]) -> None:
        """Batch ``batch_ms`` of input stream ``member`` completed (or failed)."""
        if succeeded and self.publisher is not None:
            for shard_id, r in reads.items():
                recorder = ShardMetricsRecorder(self.publisher, shard_id)
                for _ in range(r.get_records_served):
                    recorder.get_records(True, r.get_records_ms / r.get_records_calls)
                recorder.throttled(r.throttled)
                recorder.processed(r.batch_range.records, r.data_bytes,
                                   r.millis_behind_latest, None)
        with self._lock:
            shard_ids = [shard_id for shard_id, shard in self._shards.items()
                         if shard_id in reads or (member, batch_ms) in shard.planned]
            shard_ids += [shard_id for shard_id in reads if shard_id not in self._shards]
            touched = [shard for shard in map(self._shard, shard_ids)
                       if shard.complete(member, batch_ms, reads.get(shard.shard_id), succeeded)]
        if touched:
            self._wake.set()

    def _shard(self, shard_id: str) -> ShardState:
        shard = self._shards.get(shard_id)
        return shard if shard is not None else self.periods.shard(shard_id)

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
        self.periods.reconcile()
        self._write_checkpoints(force=False)
        self._watch_stalls()

    def _watch_stalls(self) -> None:
        """The stall rule (worker.stall): each held shard's lag and processed position."""
        with self._lock:
            held = {s: shard for s, shard in self._shards.items() if shard.held}
            self.stalls.retain(held)
            for shard_id, shard in held.items():
                track = shard.track
                self.stalls.observe(shard_id, shard.millis_behind_latest,
                                    track.completed if track is not None else None)

    def _waiting_on_parents(self) -> bool:
        with self._lock:
            held = [s for s, shard in self._shards.items() if shard.held]
        return bool(self.leases.waiting_on_parents(held))

    # -- checkpoints ------------------------------------------------------------------------
    def _write_checkpoints(self, force: bool) -> None:
        with self._lock:
            due = self.checkpointer.due_checkpoints(
                [shard.track for shard in self._shards.values() if shard.track is not None], force)
        doomed: list[tuple[str, str, int]] = []
        for shard_id, position in due:
            try:
                self.leases.checkpoint(shard_id, position)
            except LeaseLostError:
                continue  # reported by the lease coordinator
            with self._lock:
                shard = self._shards.get(shard_id)
                if shard is not None:
                    shard.checkpointed(position, self.checkpointer.clock())
                    doomed += self._checkpointed_ranges(shard, keep_newest=True)
            log.debug("%s: checkpointed %s at %s", self.name, shard_id, position)
            if position.sequence_number == SHARD_END.sequence_number:
                self._shard_ended(shard_id)
        self._delete_ranges(doomed + self._idle_ranges(force))

    def _idle_ranges(self, force: bool) -> list[tuple[str, str, int]]:
        """The recorded ranges of batches that moved no checkpoint (a shard whose records
        were all cut off, say, by a lease that moved).

        Without this they would stay until the shard's next record is checkpointed. They go
        25 at a time, one BatchWriteItem. (An idle shard's empty reads record nothing.)
        """
        with self._lock:
            idle = [shard for shard in self._shards.values() if len(shard.recorded) > 1
                    and shard.track is not None and shard.track.all_written]
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
                shard.close("ended")
                doomed = self._checkpointed_ranges(shard, keep_newest=False)
            self._delete_ranges(doomed)
        self.leases.release(shard_id)
        self.leases.refresh()
        self.lease_manager.sync_soon()

    @staticmethod
    def _checkpointed_ranges(shard: ShardState, keep_newest: bool) -> list[tuple[str, str, int]]:
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
    def metrics(self, member: str | None = None) -> ShardsView:
        """Per shard, and as attributes the largest lag and the stalled shards (ShardsView)."""
        with self._lock:
            shards = {shard_id: shard.view(self.config.worker_id)
                      for shard_id, shard in sorted(self._shards.items())
                      if member is None or shard.member == member}
            stalled = [s for s in self.stalls.stalled if s in shards]
            return ShardsView(shards, largest_lag(v["millis_behind_latest"]
                                                  for v in shards.values()),
                              stalled, self.stalls.stalls)

    def owned_shard_ids(self) -> list[str]:
        return self.leases.owned_shard_ids()

