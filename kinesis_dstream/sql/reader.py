"""``spark.readStream.format("aws-kinesis")``'s reader: the driver plans micro-batches.

``KinesisStreamReader`` is PySpark's ``DataSourceStreamReader``: it lives in the driver's
long-lived source process, builds each offset from the ranges the last reading recorded (see
``offsets``), plans the shards a reading reads (see ``prober``) and cleans up old ranges.
``LATEST`` is pinned when the query starts (``AT_TIMESTAMP`` of that moment), so a re-run of
the first batch reads the same records; a new query may start from a KCL lease table's
checkpoints instead (``initial_positions``). A query may read several streams
(``streamName`` a list): each shard is then known as ``stream/shardId`` (``StreamSet``), and
parents before children, probes and task grouping work over all of them at once. Spark
pickles the reader to executors for ``read()``, which needs only its partition: the driver's
clients, threads and watches live apart, in one ``DriverState`` that pickling leaves behind.
The driver-side modules (``driver_state``, ``initial_positions``, the consumers' and the
task grouping's) are imported where they are used: Spark's other processes import this
module to plan a read or to run one, and the executors' tasks read with ``partition_reader``.
"""
from __future__ import annotations

import functools
import logging
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - pyspark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

from ..config import ConsumerConfig
from ..errors import KinesisDStreamError
from ..retrieval import ShardRange
from . import source_stop
from .executor_guard import guarded_reduce
from .offsets import (
    StreamSet,
    advance,
    is_first_reading_again,
    is_read,
    is_readable,
    next_shards,
    position_of,
    stream_key,
    without_quiet,
)
from .option_table import STARTING_POSITION
from .options import SourceOptions
from .other_connectors import MB
from .partition_reader import ShardPartition, read_partition
from .progress import progress_report, reading_line, reading_metrics

if TYPE_CHECKING:
    from ..aws.kinesis import Shard
    from .driver_state import DriverState
    from .prober import Probe

log = logging.getLogger(__name__)

# Ranges of finished readings are deleted in groups, every this many readings.
CLEANUP_EVERY = 10
# The first reading a reader plans reads at most this many records a shard (one small
# GetRecords page): a query started on a backlog shows rows within seconds instead of after
# a full page per shard (10 MB each, served and converted before any row), and the shards'
# 2 MiB/s budgets stay nearly whole for the next reading. Its rows only open the query:
# the smaller its page, the sooner it is served, converted and handed over.
FIRST_READING_MAX_RECORDS = 100

# pyspark 4.0 / 4.1 call latestOffset() without the offset the query stands at. A reader
# knows it from a batch it planned or committed, but not after a restart: there its next
# offset would start the query over (another query id) and read twice or skip. Its first
# planned batch then sees the two query ids and fails the query with this.
_RESTART_NEEDS_4_2 = (
    "format(\"aws-kinesis\"): this pyspark does not tell a restarted streaming source where "
    "its query stands (pyspark >= 4.2 does), so a query cannot resume from its "
    "checkpointLocation here. Upgrade to pyspark >= 4.2, or start the query with a new "
    "checkpointLocation (it then reads from kinesis.startingPosition)")


class KinesisStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc,unused-ignore]
    """Plans micro-batches on the driver; holds no records.

    Its own fields are what an executor's copy may carry: the options and where the query
    stands. Everything else is in ``driver``, which pickling drops.
    """

    def __init__(self, options: SourceOptions, layout: str = "awslabs") -> None:
        self.options = options
        self.config = options.config
        self.streams = StreamSet(options.stream_names)
        self.layout = layout  # the rows' columns (partition_reader.LAYOUTS)
        self._target_ms: int | None = None  # Trigger.AvailableNow: read what arrived before
        self._last_end: dict[str, Any] | None = None  # pyspark < 4.2 calls latestOffset()
        self._initial: dict[str, Any] | None = None
        self._driver: DriverState | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_driver": None}

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A worker without the package fails naming its interpreter (executor_guard).
        return guarded_reduce(self, self.__getstate__(), "format(\"aws-kinesis\")'s reads") \
            or super().__reduce_ex__(protocol)

    @property
    def driver(self) -> DriverState:
        """The driver-only state, created on first use in the driver process."""
        if self._driver is None:
            from .driver_state import DriverState

            self._driver = DriverState(self.config, self.options.stream_configs)
            # This is the source's driver-side process: learn when Spark stops it.
            source_stop.install(id(self), self.stop)
        return self._driver

    @property
    def _what(self) -> str:
        return ", ".join(self.streams.names)

    def _shards(self, force: bool = False) -> dict[str, list[Shard]] | None:
        """Each stream's shards, listed at most every describeShardInterval (None: not due)."""
        driver, now = self.driver, time.monotonic()
        if force or driver.listing is None or \
                now - driver.listed_at >= self.options.describe_shard_interval_s:
            driver.listing = driver.list_shards()
            driver.listed_at = now
            return driver.listing
        return None

    def _register_named_consumer(self, query: str) -> None:
        """A fan-out consumer given by name is registered as the query starts, as the
        connectors do; one named after the query id waits for ``_read_configs``."""
        if self.options.fan_out and self.options.consumer_name is not None:
            for stream in self.streams.names:
                self.driver.consumer_arn(stream, self.options.consumer_name, query)

    def _read_configs(self, query: str) -> dict[str, ConsumerConfig]:
        """What the executors read each stream with: by fan-out as the consumer, registered
        (and ACTIVE) before any task subscribes, or polling. Spark's offset log holds
        ``query`` here, so a consumer named after it is the one every restart reads by; an
        id not logged yet (one ``initialOffset()`` makes again as a restart re-runs the first
        batch, or one a stop cuts off) would name a consumer nothing reads by again."""
        configs = self.options.stream_configs
        if not self.options.fan_out:
            return configs
        name = self.options.consumer_name_for(query)
        return {stream: replace(config, consumer_name=name, consumer_arn=self.driver.consumer_arn(
            stream, name, query)) for stream, config in configs.items()}

    def _next_shards(self, shards: dict[str, dict[str, Any]],
                     listing: dict[str, list[Shard]] | None) -> dict[str, dict[str, Any]]:
        """``next_shards`` of each stream (its parents are its own), by shard key."""
        out: dict[str, dict[str, Any]] = {}
        for stream, positions in self.streams.by_stream(shards).items():
            listed = listing.get(stream) if listing is not None else None
            found = next_shards(positions, listed, self._child_start(),
                                self.options.fail_on_data_loss,
                                functools.partial(self.streams.key, stream))
            out.update({self.streams.key(stream, s): e for s, e in found.items()})
        return {k: out[k] for k in sorted(out)}

    def _child_start(self) -> dict[str, Any]:
        from .initial_positions import child_start

        return child_start(self.options.starting_position)

    # -- the DataSourceStreamReader API --------------------------------------------------------
    def initialOffset(self) -> dict:  # noqa: N802 - PySpark's name
        if self._initial is not None:  # pyspark < 4.2 may ask after latestOffset() made it
            return self._initial
        from .initial_positions import initial_positions, read_checkpoints

        start, options = self.options.starting_position, self.options
        listings = self._shards(force=True) or {}
        pinned = time.time()
        query, shards, checkpointed = uuid.uuid4().hex, {}, 0
        for stream, config in options.stream_configs.items():
            listing = listings.get(stream, [])
            checkpoints = None
            if options.start_lease_table:  # read first: a wrong name fails the query at once
                checkpoints = read_checkpoints(config, options.start_lease_table,
                                               options.start_application or "", listing,
                                               several=not self.streams.single)
                checkpointed += len(set(checkpoints) & {s.shard_id for s in listing})
            positions = initial_positions(listing, start, pinned, checkpoints,
                                          options.start_lease_table or "",
                                          functools.partial(self.streams.key, stream),
                                          shard_starts=options.shard_starts)
            shards.update({self.streams.key(stream, s): e for s, e in positions.items()})
        # The streams and any start table checked out: the range table is made meanwhile
        # (needed before the first task, not here), so a query that fails to start makes none.
        self.driver.prepare_ranges()
        offset = self.streams.offset(query, 0, self.options.max_fetch_records_per_shard,
                                     self._next_shards(shards, None))
        if not options.fan_out and self._target_ms is None:  # probed while Spark logs it
            self.driver.prober.probe_soon({s: e for s, e in self.streams.flatten(offset).items()
                                           if is_readable(e)})
        if not options.start_lease_table:
            log.info("aws-kinesis query %s on stream %s starts %s: %d shards", query,
                     self._what, start.type, len(shards))
        else:
            log.info("aws-kinesis query %s on stream %s starts from lease table %s: %d shards, "
                     "%d of them checkpointed there (the others start as %s says)", query,
                     self._what, options.start_lease_table, len(shards), checkpointed,
                     STARTING_POSITION)
        self._register_named_consumer(offset["query"])
        self._initial = offset
        return offset

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 - PySpark's name
        if self.options.max_records_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - PySpark's name
        self._target_ms = int(time.time() * 1000)
        log.info("Trigger.AvailableNow: reading records that arrived up to %d", self._target_ms)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:  # noqa: N802
        if start is None:  # pyspark < 4.2 does not say where the next batch starts
            start = self._last_end if self._last_end is not None else self.initialOffset()
        driver, prober = self.driver, self.driver.prober
        query, batch = start["query"], int(start["batch"])
        started = self.streams.flatten(start)
        read_last = [s for s, e in started.items() if is_read(e)] if batch > 0 else []
        stored = self.driver.recorded_ranges(query, batch, read_last)
        if stored:
            driver.last_reading = reading_metrics(batch, stored)
        shards = {s: advance(without_quiet(e), stored.get(s)) for s, e in started.items()}
        for shard_id, recorded in stored.items():  # the read's iterator, at the next position
            if recorded is not None and (recorded.next_iterator is not None
                                         or recorded.ready_at):
                prober.watched(shard_id, shards[shard_id], recorded.next_iterator,
                               recorded.iterator_time, recorded.records == 0
                               and recorded.millis_behind_latest == 0, recorded.ready_at)
        shards = self._next_shards(shards, self._shards())
        readable = [s for s, e in shards.items() if is_readable(e)]
        # A shard whose last reading brought records is read again unasked (Trigger.AvailableNow
        # asks every shard: it stops at the records that arrived before it started).
        probes: dict[str, Probe] = {}
        if self.options.fan_out and self._target_ms is None:
            # By fan-out every readable shard is read: its held subscription knows what
            # came, and no probe (GetRecords) is made. Lag is the events' MillisBehindLatest.
            going = {s: stored.get(s) for s in readable}
        else:
            going = {s: r for s in readable if self._target_ms is None
                     and (r := stored.get(s)) is not None and r.records > 0}
            probes = prober.probed({s: shards[s] for s in readable if s not in going},
                                   self._target_ms)
        driver.lag = {**{s: p.millis_behind_latest for s, p in probes.items()},
                      **{s: r.millis_behind_latest if r else None for s, r in going.items()}}
        driver.stalls.retain(driver.lag)
        for shard_id, lag in driver.lag.items():  # lag, and where the shard's next read starts
            driver.stalls.observe(shard_id, lag, position_of(shards[shard_id]))
        driver.weight = {**{s: p.millis_behind_latest or 0 for s, p in probes.items()},
                         **{s: r.records if r else 0 for s, r in going.items()}}
        busy = [s for s in readable if s in going or probes[s].has_data]
        # A shard found quiet sits this reading out: no task reads it, so it costs no range
        # item, no lookup and no task; the background prober watches it. The mark is in the
        # offset, so a re-run of the reading plans the same shards.
        quiet = {s: shards[s] for s in readable if s not in busy}
        prober.watch_quiet(quiet, self._target_ms)
        if not busy:
            return start
        for shard_id in quiet:
            shards[shard_id] = {**shards[shard_id], "quiet": True}
        cap = self.options.max_fetch_records_per_shard
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            cap = max(1, min(cap, limit.max_rows // len(busy)))
        if not driver.planned and ReadMaxRows is not None:  # pyspark < 4.2: availableNow
            cap = min(cap, FIRST_READING_MAX_RECORDS)     # is one batch, so no small first
        end = self.streams.offset(query, batch + 1, cap, shards)
        lags = [v for v in driver.lag.values() if v is not None]
        log.info("aws-kinesis %s reading %d: %d of %d shards read, up to %d records each, max "
                 "millisBehindLatest %s ms%s", self._what, batch + 1, len(busy),
                 len(readable), cap, max(lags) if lags else "-",
                 reading_line(driver.last_reading))
        driver.planned += 1
        self._last_end = end
        return end

    def reportLatestOffset(self) -> dict | None:  # noqa: N802 - PySpark's name
        """Shown as the source's ``latestOffset`` in the query progress (``progress``): the
        lag per shard, the largest (the query's lag, whatever the shards), Databricks' lag
        metrics, the stalled shards, and what the last completed reading cost."""
        driver = self._driver
        if driver is None:
            return None
        return progress_report(driver.lag, driver.stalls.stalled, driver.stalls.stalls,
                               driver.last_reading)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if start.get("query") != end.get("query") and not is_first_reading_again(start, end):
            if ReadMaxRows is None:  # pyspark < 4.2: end was made without knowing start
                raise KinesisDStreamError(_RESTART_NEEDS_4_2)
            raise KinesisDStreamError(
                f"format(\"aws-kinesis\"): micro-batch from query {start.get('query')} reading "
                f"{start.get('batch')} to query {end.get('query')} reading {end.get('batch')}: "
                f"the checkpointLocation holds offsets of two queries")
        self._last_end = end  # where the query stands, for pyspark < 4.2's latestOffset()
        if start == end or int(end["batch"]) <= int(start["batch"]):
            return []
        driver, query = self.driver, end["query"]
        driver.ranges  # noqa: B018 - the table exists before any task needs it
        batch, cap = int(end["batch"]), int(end["limit"])
        read_now = {s: e for s, e in self.streams.flatten(end).items() if is_read(e)}
        pacing = self._pacing(len(read_now))
        held_at = self.driver.subscribers(query, batch - 1)
        # Polling: a task that leaves its shard on a backlog reads the next page ahead while
        # Spark completes this micro-batch and plans the next (``retrieval.prefetch``).
        ahead = 0 if self.options.fan_out else self.options.max_fetch_records_per_shard
        ranges, keys = [], {}
        weight = dict(driver.weight)
        for key, entry in read_now.items():
            stream, shard_id = self.streams.split(key)
            position, timestamp = position_of(entry)
            # Every empty read is recorded: a task cannot tell a re-run of its batch from
            # its first computation here.
            ranges.append(ShardRange(stream_key(stream, query), shard_id, batch, position,
                                     timestamp, batch, cap,
                                     self.options.max_fetch_time_per_shard_s, position,
                                     timestamp, iterator=driver.prober.iterator(key, entry),
                                     record_empty=True, weight=weight.get(key, 0),
                                     not_before=driver.prober.ready_at(key, entry),
                                     ahead_records=ahead, **pacing, **held_at(key)))
            keys[(ranges[-1].stream_key, shard_id)] = (stream, key)
        driver.read_in[batch] = list(read_now)
        from ..retrieval import group_shards

        groups = group_shards(ranges, self.config.shards_per_task, self._parallelism())
        configs = self._read_configs(query)
        first = configs[self.streams.names[0]]
        return [ShardPartition(first, group, self.options.arrow_batches, self.layout,
                               () if self.streams.single else tuple(
                                   configs[keys[(r.stream_key, r.shard_id)][0]] for r in group))
                for group in groups]

    def _pacing(self, shards_read: int) -> dict[str, Any]:
        """A reading's byte cap (fetchBufferSize, split over the shards it reads) and the
        pacing of each shard's GetRecords calls (maxFetchRate; minFetchPeriod or
        kinesis.getRecords.fetchIntervalMs, whichever is longer: both are least periods)."""
        options = self.options
        buffer = options.fetch_buffer_size_bytes
        return {"max_bytes": max(1, buffer // max(1, shards_read)) if buffer else 0,
                "max_bytes_per_s": (options.max_fetch_rate_mb_s or 0.0) * MB,
                "min_fetch_period_s": max(options.min_fetch_period_s, options.fetch_interval_s)}

    @staticmethod
    def _parallelism() -> int:
        """The cores the micro-batch's tasks can spread over (the driver's Spark, if any)."""
        try:
            from pyspark import SparkContext

            sc = SparkContext._active_spark_context
            return int(sc.defaultParallelism) if sc is not None else 2
        except Exception:  # noqa: BLE001 - a guess is enough for grouping
            return 2

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, ShardPartition)
        return read_partition(partition)

    def commit(self, end: dict) -> None:
        """Reading ``end.batch`` is done and the offsets after it are logged: the ranges of
        older readings are not needed any more. Every CLEANUP_EVERY readings, those of the
        readings CLEANUP_EVERY to 2 x CLEANUP_EVERY back are deleted, each range once, and
        only the shards each reading read (quiet shards wrote none), off the query's path
        (items also expire by TTL where the table has it)."""
        self._last_end = end
        batch = int(end["batch"])
        if batch % CLEANUP_EVERY:
            return
        old = range(max(1, batch - 2 * CLEANUP_EVERY), max(1, batch - CLEANUP_EVERY))
        # every shard, for a reading planned before a restart (which read_in does not know)
        self.driver.forget_readings(end["query"], old, list(self.streams.flatten(end)))

    def stop(self) -> None:
        """The source's process is ending (PySpark calls this in a ``finally``; see
        ``source_stop`` for how a stop by Spark reaches it): the fan-out consumers this
        process registered are deregistered if Spark stopped the query and the options ask
        for it, and the driver's threads end."""
        source_stop.forget(id(self))
        source_stop.note_further_stops()
        driver, self._driver = self._driver, None
        if driver is None:
            return
        try:
            self._deregister_consumers(driver)
        finally:
            driver.stop()

    def _deregister_consumers(self, driver: DriverState) -> None:
        """Deregister on a stop by Spark (``stop()``, ``Trigger.AvailableNow`` done, or a
        failure outside the source, which this process cannot tell apart); keep the
        consumers when the source itself failed, when the driver's listener decides
        (``register(spark)``), or when the options keep them (Databricks' default)."""
        if not self.options.fan_out or not driver.consumers:
            return
        names = ", ".join(f"{name} of stream {stream}"
                          for stream, (name, _) in driver.consumers.items())
        if source_stop.listener_in_driver():
            return  # consumer_listener, in the driver, knows whether the query failed
        if not source_stop.stopped_by_spark():
            log.warning("aws-kinesis source ended without a stop by Spark (its own error, or "
                        "its driver gone): fan-out consumer %s kept", names)
            return
        if not self.options.deregisters_consumer:
            log.info("aws-kinesis query stopped: fan-out consumer %s kept "
                     "(requireConsumerDeregistration is false)", names)
            return
        from ..aws.stream_consumer import deregister_stream_consumer

        for stream, (name, arn) in driver.consumers.items():
            try:
                gone = deregister_stream_consumer(driver.kinesis_of(stream), arn)
            except KinesisDStreamError as exc:
                log.warning("aws-kinesis: could not deregister fan-out consumer %s of stream "
                            "%s as the query stopped (`kinesis-dstream consumers` lists "
                            "it): %s", name, stream, exc)
                continue
            log.info("aws-kinesis query stopped: fan-out consumer %s of stream %s %s", name,
                     stream, "deregistered" if gone else "was gone already")
