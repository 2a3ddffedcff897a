"""Runs in the driver: batch planning for one Kinesis input DStream.

Each batch gets Spark partitions that each carry a group of ``ShardRange``s (shard, where to
start, the iterator to start with, a record cap from ``spark.streaming.receiver.maxRate`` /
backpressure), never records: ``spark.streaming.kinesis.shardsPerTask`` shards at most a
task, the busiest spread over the cores. The coordinator says which shards and from where
(``planning``); the batch is then read ahead (``read_ahead``) unless ``storageLevel`` is
NONE (``storage_level``); the tasks (``task``) report their reads, which go to the
coordinator at the read-ahead and at the batch's completion.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..aws.credentials import recovered_secret_key
from ..config import ConsumerConfig
from ..retrieval import MAX_FETCH_TIME_PER_SHARD_S, ReadReport, ShardRange, group_shards
from ..retrieval.peer_tls import PeerKey, new_peer_key
from .input_info import InputInfoReporter
from .locality import ShardPlacement, live_executors, located_groups, located_rdd
from .planning import BatchCoordinator
from .rate import RateController, RateSettings
from .read_ahead import ReadAhead, drop_oldest, read_ahead
from .records import RecordValues
from .storage_level import COMPLETION_WAIT_INTERVALS, UnreadBatches, unreplicated
from .task import RangeReports, batch_values, read_partition

log = logging.getLogger(__name__)

# A batch reads at most this many records per shard unless maxRate says fewer (the awslabs
# connector's maxFetchRecordsPerShard).
MAX_RECORDS_PER_SHARD = 100_000


@dataclass(frozen=True)
class StreamSpec:
    """What the batch function carries into Spark's checkpoint: configuration only, and never
    the secret key (pickled without it; a recovered driver finds it again by its key id in
    its environment or profile, ``aws.credentials``)."""

    key: str
    config: dict = field(repr=False)  # ConsumerConfig.to_dict(): may hold a secret key
    batch_interval_ms: int = 1000
    rate: RateSettings = field(default_factory=RateSettings)
    storage_level: Any = None  # a pyspark StorageLevel
    max_records_per_shard: int = MAX_RECORDS_PER_SHARD

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["config"] = {**self.config, "aws_secret_key": None}
        return state

    @property
    def consumer_config(self) -> ConsumerConfig:
        config = self.config
        key_id = config.get("aws_access_key_id")
        if key_id is not None and config.get("aws_secret_key") is None:  # a recovered spec
            config = {**config, "aws_secret_key": recovered_secret_key(key_id, config["stream_name"])}
        return ConsumerConfig.from_dict(config)


class BatchPlanner:
    def __init__(self, spec: StreamSpec, coordinator: BatchCoordinator,
                 peer_key: PeerKey | None = None) -> None:
        self.spec = spec
        self.config = spec.consumer_config
        self.coordinator = coordinator
        self.rate = RateController(spec.rate, spec.batch_interval_ms)
        self._limit = self.rate.batch_limit()  # records a batch may read; each completion says
        self.name = coordinator.name
        self.level = unreplicated(spec.storage_level)  # None: storageLevel NONE
        self.reports: Any = None  # the tasks' accumulator, made on first use
        self.ui = InputInfoReporter(self.name)
        self.read_ahead = ReadAhead(self.name, self._build_early, enabled=self.level is not None)
        # Each batch is built once, by Spark's call or an early read, whichever comes first.
        self._built: dict[int, Any] = {}  # batch time -> its RDD, until the batch completes
        self._failed_early: dict[int, Exception] = {}
        self._more_left: set[int] = set()  # batches whose reads stopped before a shard's tip
        self._build_lock = threading.Lock()
        self._newest_built = 0
        self._asked = 0  # the newest batch Spark asked for
        self.unread = UnreadBatches(self.name)
        self.attached = False  # a StreamingListener reports this stream's batch completions
        self.values: RecordValues | None = None  # the stream's record values, for start
        self._stopping = False
        self._counts: dict[int, int] = {}
        self._record_empty = False
        self._taking_leases = False  # as of the last plan
        # Fan-out: a shard's tasks stay on one executor, and the Python worker there that
        # holds its subscription reads for them, whichever worker runs them; the driver's
        # key proves them to it (``retrieval.subscription_peers``).
        fan_out = self.config.retrieval_mode == "FANOUT"
        self.placement = ShardPlacement() if fan_out else None
        self.peer_key = (peer_key or new_peer_key()) if fan_out else None

    @property
    def stopping(self) -> bool:
        return self._stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        """A stop releases a batch waiting for its predecessor's completion, and ends the
        early reads."""
        self._stopping = value
        self.unread.stop(value)
        self.read_ahead.stop(value)

    def bind(self, jssc: Any) -> None:
        self.ui.bind(jssc)

    def _reads(self, batch_ms: int, take: bool = False) -> dict[str, ReadReport]:
        """This stream's reports of batch ``batch_ms``, by shard (a copy: tasks' reports
        keep arriving); ``take`` removes them from the accumulator."""
        if self.reports is None:
            return {}
        value = self.reports.value
        mine = {k: r for k, r in list(value.items()) if k[0] == self.spec.key and k[2] == batch_ms}
        if take:
            for key in mine:
                value.pop(key, None)
        return {shard_id: r for (_, shard_id, _), r in mine.items()}

    def batch_rdd(self, sc: Any, batch_ms: int, values: RecordValues) -> Any:
        """The RDD of batch ``batch_ms``: its records' ``values``, read and cached on executors.

        PySpark pipelines the functions of DStreams derived from ours into one transform per
        output operation, so a job with two (a word count and a record count, say) calls the
        batch function twice per batch: the second call gets the batch's RDD already built.
        """
        if not self.attached:
            return sc.emptyRDD()
        self._asked = max(self._asked, batch_ms)
        built = self._built.get(batch_ms)
        if built is None:
            with self._build_lock:  # an early read of this batch may hold it
                built = self._build_once(sc, batch_ms, values)
        if batch_ms in self._more_left:
            self.read_early(sc, batch_ms + self.spec.batch_interval_ms, values)
        return built

    def read_early(self, sc: Any, batch_ms: int, values: RecordValues | None) -> None:
        """Have batch ``batch_ms`` read early (``read_ahead.ReadAhead.read_early``), unless
        it is built already or more than one batch ahead of Spark's clock."""
        if batch_ms <= self._newest_built:
            return
        if self._asked and batch_ms > self._asked + self.spec.batch_interval_ms:
            return
        self.read_ahead.read_early(sc, batch_ms, values)

    def _build_early(self, sc: Any, batch_ms: int, values: RecordValues) -> None:
        """The early reads' build of batch ``batch_ms`` (on their thread)."""
        with self._build_lock:
            if self.stopping or batch_ms <= self._newest_built:
                return
            log.debug("%s: batch %d is read early", self.name, batch_ms)
            try:
                self._build_once(sc, batch_ms, values)
            except Exception as exc:  # noqa: BLE001 - Spark's own call for the batch raises it
                self._failed_early[batch_ms] = exc
                drop_oldest(self._failed_early)

    def _build_once(self, sc: Any, batch_ms: int, values: RecordValues) -> Any:
        """The batch's RDD, built on the first call (the caller holds the build lock)."""
        built = self._built.get(batch_ms)
        if built is not None:
            return built
        failed = self._failed_early.pop(batch_ms, None)
        if failed is not None:
            raise failed
        built = self._built[batch_ms] = self._build(sc, batch_ms, values)
        self._newest_built = max(self._newest_built, batch_ms)
        drop_oldest(self._built)
        return built

    def _build(self, sc: Any, batch_ms: int, values: RecordValues) -> Any:
        unread = self.level is None
        if unread:
            self.unread.wait(batch_ms, completion_wait_s(self.spec.batch_interval_ms,
                                                         self._taking_leases))
        plan = self.coordinator.plan(self.spec.key, batch_ms)
        self._taking_leases = plan.taking_leases
        planned = plan.shards
        log.debug("%s: batch %d planned with %d shards", self.name, batch_ms, len(planned))
        if not planned:
            self.ui.report(sc, batch_ms, 0, {})
            return sc.emptyRDD()
        if self.reports is None:  # the tasks report through it
            self.reports = sc.accumulator({}, RangeReports())
        limit = self._limit
        per_shard = self.spec.max_records_per_shard
        if limit is not None:
            per_shard = max(1, min(per_shard, limit // len(planned)))
        budget = read_time_budget_s(self.spec.batch_interval_ms, plan.taking_leases)
        ranges = [ShardRange(self.spec.key, p.shard_id, batch_ms, p.floor, p.floor_timestamp,
                             p.since_ms, per_shard, budget, p.start, p.start_timestamp,
                             plan.owner, p.iterator, self._record_empty or unread,
                             weight=p.weight, subscriber=p.subscriber, peer_key=self.peer_key)
                  for p in planned]
        rdd = self._read_rdd(sc, values, ranges)
        if unread:
            return self._unread_batch(sc, batch_ms, rdd, ranges)
        read_from = time.monotonic()

        def reread() -> Any:
            read = self._reads(batch_ms)
            return self._read_rdd(sc, values, [
                r if r.shard_id in read else replace(r, record_empty=True) for r in ranges])

        rdd = read_ahead(sc, rdd, batch_ms, self.stopping, self.name, reread)
        reads = self._reads(batch_ms)
        if any(not r.fresh for r in reads.values()) and not self._record_empty:
            # Tasks did not see the read-ahead's mark (a Spark that drops local properties):
            # no range would ever be decided. Empty reads are recorded from now on.
            log.error("%s: the read-ahead of batch %d was not recognised in its tasks; empty "
                      "reads are recorded from now on", self.name, batch_ms)
            self._record_empty = True
        self.coordinator.batch_read(self.spec.key, batch_ms, reads)
        count = sum(r.batch_range.records for r in reads.values())
        log.debug("%s: batch %d read ahead: %d records from %d shards in %.3f s", self.name,
                  batch_ms, count, len(reads), time.monotonic() - read_from)
        if any(r.more_left for r in reads.values()):
            self._more_left.add(batch_ms)  # the next batch is read early
        self._counts[batch_ms] = count
        self.ui.report(sc, batch_ms, count, reads)
        return rdd

    def _unread_batch(self, sc: Any, batch_ms: int, rdd: Any, ranges: list[ShardRange]) -> Any:
        """A batch left to its output operations (storageLevel NONE): its record count is
        not known while Spark builds it, so its input shows the planned shards and 0."""
        self.unread.add(batch_ms)
        lines = [f"{r.shard_id}: after {r.start or 'its previous batch'}, read by the output "
                 f"operations (storageLevel NONE)" for r in ranges]
        self.ui.report(sc, batch_ms, 0, {}, "\n".join(lines))
        return rdd

    def _read_rdd(self, sc: Any, values: RecordValues, ranges: list[ShardRange]) -> Any:
        read = functools.partial(read_partition, self.config, self.reports, values)
        executors = live_executors(sc) if self.placement is not None else []
        if self.placement is not None and executors:
            placement = self.placement
            placed = placement.place([r.shard_id for r in ranges], executors)
            if placement.balance({r.shard_id: r.weight for r in ranges}, executors,
                                 {r.shard_id: r.subscriber for r in ranges}):
                placed = placement.place([r.shard_id for r in ranges], executors)
            ranges = [replace(r, subscriber=None)
                      if placement.subscribe_anew(r.shard_id, r.subscriber) else r
                      for r in ranges]
            tasks = located_groups(ranges, placed, self.config.shards_per_task,
                                   sc.defaultParallelism)
            rdd = located_rdd(sc, tasks).mapPartitions(read)
        else:
            groups = group_shards(ranges, self.config.shards_per_task, sc.defaultParallelism)
            rdd = sc.parallelize(groups, len(groups)).mapPartitions(read)
        rdd = batch_values(rdd)
        return rdd.persist(self.level) if self.level is not None else rdd

    def batch_completed(self, batch_ms: int, succeeded: bool, processing_delay_ms: int | None,
                        scheduling_delay_ms: int | None, failure: str | None) -> None:
        unread = self.level is None and batch_ms in self.unread  # storageLevel NONE only
        try:
            self._completed(batch_ms, succeeded, processing_delay_ms, scheduling_delay_ms,
                            failure, unread)
        finally:
            if unread:  # the coordinator knows where its shards ended: the next batch may plan
                self.unread.completed(batch_ms)

    def _completed(self, batch_ms: int, succeeded: bool, processing_delay_ms: int | None,
                   scheduling_delay_ms: int | None, failure: str | None, unread: bool) -> None:
        self._built.pop(batch_ms, None)
        self._more_left.discard(batch_ms)
        reads = self._reads(batch_ms, take=True)
        count = self._counts.pop(batch_ms, None)
        if count is None and not reads and not unread:
            return
        self.coordinator.batch_completed(self.spec.key, batch_ms, succeeded, reads)
        count = count if count is not None else sum(r.batch_range.records for r in reads.values())
        self._limit = self.rate.batch_completed(batch_ms, count, processing_delay_ms or 0,
                                                scheduling_delay_ms or 0)
        lags = [r.millis_behind_latest for r in reads.values() if r.millis_behind_latest is not None]
        log.info("%s batch %d: %d records from %d shards, max millisBehindLatest %s ms, "
                 "processing %s ms%s", self.name, batch_ms, count, len(reads),
                 max(lags) if lags else "-", processing_delay_ms,
                 "" if succeeded else " FAILED: its shards are not checkpointed past it")
        if not succeeded:
            log.error("%s: batch %d failed (%s); shards %s keep their checkpoint from before it, "
                      "so its records are read again after a restart", self.name, batch_ms,
                      (failure or "output operation failed").splitlines()[0],
                      ", ".join(sorted(reads)) or "-")


def read_time_budget_s(batch_interval_ms: int, taking_leases: bool) -> float:
    """How long a task may read its shard: a backlog in long reads (``shard_reader``), but
    short ones while leases are still being taken (the first second or so after start), so
    that the shards taken meanwhile join the next batch instead of waiting for long reads."""
    interval_s = batch_interval_ms / 1000.0
    if taking_leases:
        return 0.8 * interval_s
    return max(MAX_FETCH_TIME_PER_SHARD_S, 0.8 * interval_s)


def completion_wait_s(batch_interval_ms: int, taking_leases: bool) -> float:
    """How long a batch waits for its predecessor (storageLevel NONE): the predecessor's
    read may take its whole time budget, and its processing a batch interval or two."""
    return read_time_budget_s(batch_interval_ms, taking_leases) + \
        COMPLETION_WAIT_INTERVALS * batch_interval_ms / 1000.0
