"""Runs in the driver (but ``_read``, a task's body, on executors): batch planning for one
Kinesis input DStream.

Each batch gets Spark partitions that each carry a group of ``ShardRange``s (shard, where to
start, the iterator to start with, a record cap from ``spark.streaming.receiver.maxRate`` /
backpressure), never records: ``spark.streaming.kinesis.shardsPerTask`` shards at most a
task, the busiest spread over the cores. The batch's RDD is read right away by a small
Spark job (the read-ahead) whose tasks run on executors and cache what they read (at
``storageLevel``), so that the batch's record count and per-shard ranges are known when
Spark builds the batch: Spark's Streaming UI, its REST API and every StreamingListener see
the input, and the read of batch N+1 overlaps the processing of batch N. The records stay
on the executors; the driver receives only the tasks' small reports (an accumulator).
While there is a backlog a batch is read early, before Spark asks for it (``read_early``).

The read-ahead is the first computation of each partition, and its tasks know it (a Spark
local property): only they may decide a new range. Any later computation of the same
partition (a lost block, a task retry) reads the recorded range, or nothing where the
read-ahead read nothing, which recorded nothing. When the
read-ahead fails outright, the batch gets a fresh RDD whose unread partitions record even
an empty read, since no computation of theirs has been seen.

With ``storageLevel`` NONE nothing would keep what a read-ahead read, so there is none: the
batch's first output operation decides its ranges, every partition recording its range
(even an empty one) before a record leaves the task, and every later computation reads
exactly that. Where a batch ended is then known only when it completes, so the next batch
is planned once it has (waited for, bounded), and the reads still follow each other.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator

from ..config import ConsumerConfig
from ..retrieval import (MAX_FETCH_TIME_PER_SHARD_S, ReadReport, ShardRange, group_shards,
                         read_shards)
from .coordinator import ShardCoordinator
from .rate import RateController, RateSettings
from .records import RecordValues

log = logging.getLogger(__name__)

# A batch reads at most this many records per shard unless maxRate says fewer (the awslabs
# connector's maxFetchRecordsPerShard).
MAX_RECORDS_PER_SHARD = 100_000
# Built batch RDDs kept for another output operation's call (a batch's stay until it completes).
MAX_BUILT_BATCHES = 64
# With storageLevel NONE the next batch waits for the previous one's completion for at most
# its read time budget plus this many batch intervals; then its unsettled shards sit it out.
COMPLETION_WAIT_INTERVALS = 2


def _drop_oldest(batches: dict[int, Any] | set[int]) -> None:
    """Keep what is held per batch time for the newest MAX_BUILT_BATCHES batches only: a
    batch normally lets go of it when it completes, and one that never completes (a stop
    between its build and its jobs) must not hold it for the driver's life."""
    while len(batches) > MAX_BUILT_BATCHES:
        oldest = min(batches)
        if isinstance(batches, dict):
            del batches[oldest]
        else:
            batches.discard(oldest)


@dataclass(frozen=True)
class StreamSpec:
    """What the batch function carries into Spark's checkpoint: configuration only."""

    key: str
    config: dict = field(repr=False)  # ConsumerConfig.to_dict(): may hold a secret key
    batch_interval_ms: int = 1000
    rate: RateSettings = field(default_factory=RateSettings)
    storage_level: Any = None  # a pyspark StorageLevel
    max_records_per_shard: int = MAX_RECORDS_PER_SHARD

    @property
    def consumer_config(self) -> ConsumerConfig:
        return ConsumerConfig.from_dict(self.config)


# The local property that marks the read-ahead job of a batch (its value: the batch time).
READ_AHEAD = "kinesis_dstream.readAhead"


class RangeReports:
    """Accumulator parameter: {(stream key, shard id, batch ms): ReadReport}, merged by key.

    A partition computed twice reports the same range twice; merging by key keeps one, with
    the refusals and faults of every computation added up (a re-read at the limits is
    throttled too, and counted).
    """

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:  # noqa: N802 - PySpark's name
        for key, report in value2.items():
            earlier = value1.get(key)
            if earlier is not None and (earlier.throttled or earlier.faults):
                report = replace(report, throttled=report.throttled + earlier.throttled,
                                 faults=report.faults + earlier.faults)
            value1[key] = report
        return value1


def _in_read_ahead(batch_ms: int) -> bool:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is not None and context.getLocalProperty(READ_AHEAD) == str(batch_ms)


def _read(config: ConsumerConfig, reports: Any, values: RecordValues,
          groups: Iterable[tuple[ShardRange, ...]]) -> Iterator[Any]:
    """A task's body (on an executor): read its group of shards, report, yield the values."""
    for group in groups:
        fresh = _in_read_ahead(group[0].batch_ms)
        for records, report in read_shards(config, group, fresh=fresh):
            r = report.batch_range
            reports.add({(r.stream_key, r.shard_id, r.batch_ms): report})
            yield from values(records)


class BatchPlanner:
    def __init__(self, spec: StreamSpec, coordinator: ShardCoordinator) -> None:
        self.spec = spec
        self.config = spec.consumer_config
        self.coordinator = coordinator
        self.rate = RateController(spec.rate, spec.batch_interval_ms)
        self.name = coordinator.name
        self._reports: Any = None
        self.input_stream_id: int | None = None
        self.attached = False  # a StreamingListener reports this stream's batch completions
        self._stopping = False
        self._counts: dict[int, int] = {}
        self._record_empty = False
        self._built: dict[int, Any] = {}  # batch time -> its RDD, until the batch completes
        # storageLevel NONE: batches planned (with shards) and not completed, and the newest
        # of them whose completion a wait gave up on
        self._unread: set[int] = set()
        self._waited_out = 0
        self._completions = threading.Condition()
        # Early reads: one batch is built at a time, by Spark's call or ahead of it
        self.values: RecordValues | None = None  # the stream's record values, for start
        self._build_lock = threading.Lock()
        self._early_wake = threading.Condition()
        self._early_next: tuple[Any, int, RecordValues] | None = None
        self._early_busy = False
        self._newest_built = 0
        self._asked = 0  # the newest batch Spark asked for
        self._early_ms = 0  # the newest batch an early read was started for
        self._more_left: set[int] = set()  # batches whose reads stopped before a shard's tip
        self._failed_early: dict[int, Exception] = {}
        self._early: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        return self._stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        """A stop releases a batch waiting for its predecessor's completion, and ends the
        early reads."""
        with self._completions:
            self._stopping = value
            self._completions.notify_all()
        with self._early_wake:  # the early reads' thread ends
            self._early_wake.notify_all()

    def _accumulator(self, sc: Any) -> Any:
        if self._reports is None:
            self._reports = sc.accumulator({}, RangeReports())
        return self._reports

    def _batch_reports(self, batch_ms: int) -> dict[tuple[str, str, int], ReadReport]:
        """This stream's reports of batch ``batch_ms`` (a copy: tasks' reports keep arriving)."""
        if self._reports is None:
            return {}
        return {k: r for k, r in list(self._reports.value.items())
                if k[0] == self.spec.key and k[2] == batch_ms}

    def _take_reports(self, batch_ms: int) -> dict[tuple[str, str, int], ReadReport]:
        reports = self._batch_reports(batch_ms)
        for key in reports:
            self._reports.value.pop(key, None)
        return reports

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
        """Build batch ``batch_ms`` now, in the background, before Spark asks for it.

        Spark asks for a batch at its time, and its read-ahead reads then; while there is a
        backlog that leaves Kinesis unread between one batch's read and the next batch's
        time. So the first batch is read as soon as the context has started (its first
        lease is taken by then), and the batch after one whose reads stopped before a
        shard's tip as soon as Spark has that one: reads follow each other without a gap,
        never more than one batch ahead of Spark's clock. It is the same build, only
        earlier: Spark's call finds the batch built (or waits for it), with the same ranges,
        so every guarantee holds; a build that failed fails Spark's call the same way.
        Nothing is read early with ``storageLevel`` NONE (no read-ahead) or while stopping.
        """
        if values is None or self.stopping or batch_ms <= self._newest_built or \
                _unreplicated(self.spec.storage_level) is None:
            return
        if self._asked and batch_ms > self._asked + self.spec.batch_interval_ms:
            return  # one batch ahead of Spark's clock at most
        with self._early_wake:
            if batch_ms <= self._early_ms:
                return  # asked for already
            self._early_ms = batch_ms
            self._early_next = (sc, batch_ms, values)
            if self._early is None:
                # One thread for the planner's life: PySpark pins a JVM thread to each Python
                # thread that calls Spark, and never ends it (a thread per batch would leak).
                self._early = threading.Thread(target=self._early_reads, daemon=True,
                                               name=f"{self.name}-early-reads")
                self._early.start()
            self._early_wake.notify_all()

    def _early_reads(self) -> None:
        while True:
            with self._early_wake:
                while self._early_next is None and not self._stopping:
                    self._early_wake.wait()
                if self._stopping:
                    return
                sc, batch_ms, values = self._early_next
                self._early_next, self._early_busy = None, True
            try:
                self._build_early(sc, batch_ms, values)
            finally:
                with self._early_wake:
                    self._early_busy = False
                    self._early_wake.notify_all()

    def _early_reads_idle(self, timeout_s: float) -> bool:
        """No early read asked for or running (tests wait on it)."""
        with self._early_wake:
            return self._early_wake.wait_for(
                lambda: self._early_next is None and not self._early_busy, timeout_s)

    def _build_early(self, sc: Any, batch_ms: int, values: RecordValues) -> None:
        with self._build_lock:
            if self.stopping or batch_ms <= self._newest_built:
                return
            log.debug("%s: batch %d is read early", self.name, batch_ms)
            try:
                self._build_once(sc, batch_ms, values)
            except Exception as exc:  # noqa: BLE001 - Spark's own call for the batch raises it
                self._failed_early[batch_ms] = exc
                _drop_oldest(self._failed_early)

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
        _drop_oldest(self._built)
        return built

    def _build(self, sc: Any, batch_ms: int, values: RecordValues) -> Any:
        unread = _unreplicated(self.spec.storage_level) is None
        if unread:
            self.wait_for_completions(batch_ms, completion_wait_s(
                self.spec.batch_interval_ms, self.coordinator.taking_leases))
        planned = self.coordinator.plan(self.spec.key, batch_ms)
        log.debug("%s: batch %d planned with %d shards", self.name, batch_ms, len(planned))
        if not planned:
            self._report_input(sc, batch_ms, 0, {})
            return sc.emptyRDD()
        self._accumulator(sc)  # made on first use: the tasks report through it
        limit = self.rate.batch_limit()
        per_shard = self.spec.max_records_per_shard
        if limit is not None:
            per_shard = max(1, min(per_shard, limit // len(planned)))
        budget = read_time_budget_s(self.spec.batch_interval_ms, self.coordinator.taking_leases)
        owner = self.coordinator.config.worker_id
        ranges = [ShardRange(self.spec.key, p.shard_id, batch_ms, p.floor, p.floor_timestamp,
                             p.since_ms, per_shard, budget, p.start, p.start_timestamp, owner,
                             p.iterator, self._record_empty or unread) for p in planned]
        weights = {p.shard_id: p.weight for p in planned}
        rdd = self._read_rdd(sc, values, ranges, weights)
        if unread:
            return self._unread_batch(sc, batch_ms, rdd, ranges)
        sc.setLocalProperty(READ_AHEAD, str(batch_ms))
        read_from = time.monotonic()
        try:
            # The JVM counts the cached pickled batches: the tasks read and cache the records,
            # and no second Python pass unpickles them only to count (the reports carry the
            # record counts).
            rdd._jrdd.count()
        except Exception as exc:  # noqa: BLE001 - the batch's own jobs read it again
            report = log.info if self.stopping else log.warning
            report("%s: reading batch %d ahead failed (%s); its output operations read it "
                   "themselves", self.name, batch_ms, str(exc).splitlines()[0][:300])
            read = self._batch_reports(batch_ms)
            rdd.unpersist(blocking=False)
            rdd = self._read_rdd(sc, values, [
                r if (r.stream_key, r.shard_id, batch_ms) in read else replace(r, record_empty=True)
                for r in ranges], weights)
        finally:
            sc.setLocalProperty(READ_AHEAD, None)
        batch_reports = self._batch_reports(batch_ms)
        if any(not r.fresh for r in batch_reports.values()) and not self._record_empty:
            # Tasks did not see the read-ahead's mark (a Spark that drops local properties):
            # no range would ever be decided. Empty reads are recorded from now on.
            log.error("%s: the read-ahead of batch %d was not recognised in its tasks; empty "
                      "reads are recorded from now on", self.name, batch_ms)
            self._record_empty = True
        self.coordinator.batch_read(batch_reports)
        count = sum(r.batch_range.records for r in batch_reports.values())
        log.debug("%s: batch %d read ahead: %d records from %d shards in %.3f s", self.name,
                  batch_ms, count, len(batch_reports), time.monotonic() - read_from)
        if any(r.more_left for r in batch_reports.values()):
            self._more_left.add(batch_ms)
        self._counts[batch_ms] = count
        self._report_input(sc, batch_ms, count, batch_reports)
        return rdd

    def _unread_batch(self, sc: Any, batch_ms: int, rdd: Any, ranges: list[ShardRange]) -> Any:
        """A batch left to its output operations (storageLevel NONE): its record count is
        not known while Spark builds it, so its input shows the planned shards and 0."""
        with self._completions:
            self._unread.add(batch_ms)
            _drop_oldest(self._unread)
        lines = [f"{r.shard_id}: after {r.start or 'its previous batch'}, read by the output "
                 f"operations (storageLevel NONE)" for r in ranges]
        self._report_input(sc, batch_ms, 0, {}, "\n".join(lines))
        return rdd

    def wait_for_completions(self, batch_ms: int, timeout_s: float) -> bool:
        """Wait until this stream's batches before ``batch_ms`` have completed (storageLevel
        NONE): only then is it known where each of their shards' reads ended, and a batch
        planned earlier makes those shards sit out.

        Runs on Spark's JobGenerator thread; completions come on the listener bus's thread,
        which this does not block. Not while stopping, and not again for batches a wait
        already gave up on. True when nothing is outstanding.
        """
        deadline = time.monotonic() + timeout_s
        with self._completions:
            while True:
                pending = [t for t in self._unread if self._waited_out < t < batch_ms]
                left = deadline - time.monotonic()
                if not pending or self._stopping or left <= 0:
                    break
                log.debug("%s: batch %d waits for batch %s to complete", self.name, batch_ms,
                          max(pending))
                self._completions.wait(left)
            if pending and not self._stopping:
                self._waited_out = max(pending)
                log.info("%s: batch %d is planned before batch %d completed (waited %.1f s); "
                         "that batch's shards sit it out", self.name, batch_ms, max(pending),
                         timeout_s)
            return not pending

    def _read_rdd(self, sc: Any, values: RecordValues, ranges: list[ShardRange],
                  weights: dict[str, float]) -> Any:
        groups = group_shards(ranges, self.config.shards_per_task, sc.defaultParallelism,
                              lambda r: weights.get(r.shard_id, 0))
        read = functools.partial(_read, self.config, self._reports, values)
        rdd = sc.parallelize(groups, len(groups)).mapPartitions(read)
        level = _unreplicated(self.spec.storage_level)
        return rdd.persist(level) if level is not None else rdd

    def _report_input(self, sc: Any, batch_ms: int, count: int,
                      reports: dict[tuple[str, str, int], ReadReport],
                      description: str | None = None) -> None:
        """Tell Spark's InputInfoTracker what this batch holds (UI, REST API, listeners)."""
        if self.input_stream_id is None:
            return
        try:
            jvm = sc._jvm
            lines = [f"{shard}: after {r.batch_range.start} through {r.batch_range.end or '-'}, "
                     f"{r.batch_range.records} records, millisBehindLatest "
                     f"{r.millis_behind_latest}" for (_, shard, _), r in sorted(reports.items())]
            metadata = jvm.java.util.HashMap()
            metadata.put("Description", description or "\n".join(lines) or "no shards planned")
            metadata = jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(metadata)
            info = jvm.org.apache.spark.streaming.scheduler.StreamInputInfo(
                self.input_stream_id, count, metadata)
            # JobScheduler makes its tracker when the context starts: look it up each time.
            tracker = self._scala_ssc.scheduler().inputInfoTracker()
            tracker.reportInfo(jvm.org.apache.spark.streaming.Time(batch_ms), info)
        except Exception as exc:  # noqa: BLE001 - visibility only, never the data path
            log.warning("%s: could not report batch %d input to Spark's UI: %s", self.name,
                        batch_ms, exc)

    def bind(self, jssc: Any) -> None:
        """Get an input stream id of our own from Spark and its input-info tracker."""
        if self.input_stream_id is None:
            self._scala_ssc = jssc.ssc()
            self.input_stream_id = int(self._scala_ssc.getNewInputStreamId())

    def batch_completed(self, batch_ms: int, succeeded: bool, processing_delay_ms: int | None,
                        scheduling_delay_ms: int | None, failure: str | None) -> None:
        unread = batch_ms in self._unread
        try:
            self._completed(batch_ms, succeeded, processing_delay_ms, scheduling_delay_ms,
                            failure, unread)
        finally:
            if unread:  # the coordinator knows where its shards ended: the next batch may plan
                with self._completions:
                    self._unread.discard(batch_ms)
                    self._completions.notify_all()

    def _completed(self, batch_ms: int, succeeded: bool, processing_delay_ms: int | None,
                   scheduling_delay_ms: int | None, failure: str | None, unread: bool) -> None:
        self._built.pop(batch_ms, None)
        self._more_left.discard(batch_ms)
        reports = self._take_reports(batch_ms)
        count = self._counts.pop(batch_ms, None)
        if count is None and not reports and not unread:
            return
        self.coordinator.batch_completed(self.spec.key, batch_ms, succeeded, reports)
        count = count if count is not None else sum(r.batch_range.records for r in reports.values())
        self.rate.batch_completed(batch_ms, count, processing_delay_ms or 0,
                                  scheduling_delay_ms or 0)
        lags = [r.millis_behind_latest for r in reports.values() if r.millis_behind_latest is not None]
        log.info("%s batch %d: %d records from %d shards, max millisBehindLatest %s ms, "
                 "processing %s ms%s", self.name, batch_ms, count, len(reports),
                 max(lags) if lags else "-", processing_delay_ms,
                 "" if succeeded else " FAILED: its shards are not checkpointed past it")
        if not succeeded:
            log.error("%s: batch %d failed (%s); shards %s keep their checkpoint from before it, "
                      "so its records are read again after a restart", self.name, batch_ms,
                      (failure or "output operation failed").splitlines()[0],
                      ", ".join(sorted(k[1] for k in reports)) or "-")


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


def _unreplicated(level: Any) -> Any:
    """``storageLevel`` with one replica, or None when it stores nothing.

    A receiver's blocks are the only copy of its records, hence PySpark's default
    MEMORY_AND_DISK_2. Ours are not: a lost block is read again from Kinesis, exactly, from
    its recorded range. A second replica would only cost each batch a copy to another
    executor (about half of the caching time in bench_spark's drain).
    """
    if level is None or not (level.useMemory or level.useDisk or level.useOffHeap):
        return None
    if level.replication <= 1:
        return level
    from pyspark import StorageLevel

    return StorageLevel(level.useDisk, level.useMemory, level.useOffHeap, level.deserialized, 1)
