"""``spark.readStream.format("aws-kinesis")``: a Kinesis source on PySpark's Python Data Source API.

Offsets and the metadata (why a re-run batch reads the same records)
--------------------------------------------------------------------
Kinesis cannot say in advance where a shard's records stop, so, as the JVM connectors do, an
offset does not bound a micro-batch's data: it says *where* each shard's reading of that
micro-batch starts, and the executor task that reads first decides where it ends and records
that range in the batch-range table (DynamoDB, ``kinesis_dstream.aws.range_table``) before it
hands out a record. Every later computation of the same (query, shard, reading) -- a task
retry, a re-run after a restart -- reads exactly the recorded range.

An offset is ``{"v": 1, "query": id, "batch": n, "limit": cap, "shards": {shard id: position}}``
in that key order, shards sorted. ``batch`` numbers the reading that starts at these positions;
a position is ``{"after": "<seq>", "sub": k}``, ``{"at": "TRIM_HORIZON"}``,
``{"at": "AT_TIMESTAMP", "ts": epoch s}`` or ``{"ended": true}``; a child shard whose parents
have not all ended carries ``"wait": [parent ids]`` and is not read, nor is a shard the driver's
probe found quiet (``"quiet": true``: it sits the reading out; see "Quiet shards" below).
``latestOffset(O_n)`` builds ``O_n+1`` from ``O_n`` and the ranges recorded for reading n
(whose batch has completed), so ``O_n+1``'s positions are a pure function of committed facts,
and it is written to Spark's offset log before reading n+1 happens. ``partitions(O_n, O_n+1)`` plans reading n+1 at ``O_n+1``'s positions,
``cap`` records at most per shard.

The query id is born in ``initialOffset()`` (a UUID) and travels in every offset, so it lives
in the query's checkpointLocation (the offset log) without the source being told that
location: a query restarted from the same checkpoint finds its ranges, a new checkpoint starts
a new query. ``LATEST`` is pinned when the query starts (``AT_TIMESTAMP`` of that moment), so a
re-run of the first batch reads the same records.

Quiet shards: what a shard costs the query while nothing arrives
----------------------------------------------------------------
A shard whose last reading brought records is read again at the next trigger without asking
Kinesis first (a read that then finds nothing records an empty range, once). Any other
readable shard is read only where a probe (one GetRecords from the driver, with the
NextShardIterator the last read or probe of that position kept: no GetShardIterator) found
something. The probes run in a background thread of the driver's source process, each quiet
shard at most once every ``PROBE_INTERVAL_S`` whatever the trigger (the KCL polls an idle
shard once a second; every application reading the stream shares its 5 GetRecords a second),
and ``latestOffset`` only reads what they found: the trigger waits for no per-shard call. A
probe is tried once: a throttled or failed probe plans the shard, whose task waits the fault
out, so the probe never retries into the budget the readers need. The quiet mark is in the
offset, so a re-run of the reading plans the same shards; a probe only ever decides *when* a
shard is read, never what a reading returns.

Everything here but ``read()`` runs in the driver's long-lived Python process; ``read()`` runs
on executors with only what the partition carries.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - pyspark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

from ..aws.kinesis import KinesisClient, Shard
from ..aws.range_table import BatchRange, BatchRangeTable
from ..config import ConsumerConfig
from ..errors import DataLossError, KinesisDStreamError
from ..retry import FaultLog, is_transient
from ..records import AT_TIMESTAMP, TRIM_HORIZON, ExtendedSequenceNumber, Record
from ..retrieval import (ITERATOR_TTL_S, KinesisDataFetcher, ShardRange, group_shards,
                         read_shards, start_after, waiting_out_dynamodb)
from .options import SourceOptions

log = logging.getLogger(__name__)

NAME = "aws-kinesis"
OFFSET_VERSION = 1
# Rows per Arrow batch handed to Spark: bounded memory per batch, few batches per partition.
ARROW_ROWS = 10_000
# Ranges of finished readings are deleted in groups, every this many readings.
CLEANUP_EVERY = 10
# A quiet shard is probed at most this often (the KCL's idleTimeBetweenReadsInMillis).
PROBE_INTERVAL_S = 1.0
# A probe older than this (the background prober fell behind) is made again by latestOffset.
PROBE_STALE_S = 3 * PROBE_INTERVAL_S

SCHEMA = StructType([
    StructField("data", BinaryType(), False),
    StructField("streamName", StringType(), False),
    StructField("partitionKey", StringType(), False),
    StructField("sequenceNumber", StringType(), False),
    StructField("subSequenceNumber", LongType(), False),
    StructField("shardId", StringType(), False),
    StructField("approximateArrivalTimestamp", TimestampType(), False),
])


# pyspark 4.0 / 4.1 call latestOffset() without the offset the query stands at. A reader
# knows it from a batch it planned or committed, but not after a restart: there its next
# offset would start the query over (another query id) and read twice or skip. Its first
# planned batch then sees the two query ids and fails the query with this.
_RESTART_NEEDS_4_2 = (
    "format(\"aws-kinesis\"): this pyspark does not tell a restarted streaming source where "
    "its query stands (pyspark >= 4.2 does), so a query cannot resume from its "
    "checkpointLocation here. Upgrade to pyspark >= 4.2, or start the query with a new "
    "checkpointLocation (it then reads from kinesis.startingPosition)")


# -- positions in offsets ----------------------------------------------------------------------
def position_json(start: ExtendedSequenceNumber, timestamp: float | None) -> dict[str, Any]:
    """A reader position as offset JSON (sequence numbers as strings, fixed key order)."""
    if start.sequence_number == TRIM_HORIZON:
        return {"at": TRIM_HORIZON}
    if start.sequence_number == AT_TIMESTAMP:
        return {"at": AT_TIMESTAMP, "ts": float(timestamp) if timestamp is not None else 0.0}
    if start.is_sentinel:
        raise KinesisDStreamError(f"position {start} cannot be an offset")
    return {"after": start.sequence_number, "sub": int(start.sub_sequence_number)}


def position_of(entry: dict[str, Any]) -> tuple[ExtendedSequenceNumber, float | None]:
    if "after" in entry:
        return ExtendedSequenceNumber(str(entry["after"]), int(entry.get("sub", 0))), None
    if entry.get("at") == AT_TIMESTAMP:
        return ExtendedSequenceNumber(AT_TIMESTAMP), float(entry["ts"])
    if entry.get("at") == TRIM_HORIZON:
        return ExtendedSequenceNumber(TRIM_HORIZON), None
    raise KinesisDStreamError(f"not a readable position: {entry}")


def is_readable(entry: dict[str, Any]) -> bool:
    return not entry.get("ended") and not entry.get("wait")


def is_read(entry: dict[str, Any]) -> bool:
    """Read in the reading this offset starts: readable, and not found quiet by the probe."""
    return is_readable(entry) and not entry.get("quiet")


def _without_quiet(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "quiet"}


def stream_key(stream_name: str, query_id: str) -> str:
    """The range table's key of one query of one stream."""
    return f"sql/{stream_name}/{query_id}"


def advance(entry: dict[str, Any], stored: BatchRange | None) -> dict[str, Any]:
    """A shard's position after the reading whose recorded range is ``stored`` (the readers'
    one rule, ``start_after``)."""
    if stored is None:
        return entry
    if stored.shard_end:
        return {"ended": True}
    return position_json(*start_after(stored, *position_of(entry)))


def next_shards(current: dict[str, dict[str, Any]], listing: Sequence[Shard] | None,
                child_start: dict[str, Any], fail_on_data_loss: bool) -> dict[str, dict[str, Any]]:
    """Shard positions of the next offset: new shards added, waits re-checked, gone shards dropped.

    Pure (no I/O) so that parents-before-children is tested on its own. ``listing`` None means
    "not listed this time": only the waits are re-checked.
    """
    shards = dict(current)
    if listing is not None:
        listed = {s.shard_id: s for s in listing}
        for shard_id in sorted(listed):
            if shard_id not in shards:
                parents = [p for p in listed[shard_id].parent_shard_ids if p in shards]
                entry = dict(child_start)
                if parents:
                    entry["wait"] = parents
                shards[shard_id] = entry
                log.info("new shard %s (parents %s) joins the query", shard_id,
                         listed[shard_id].parent_shard_ids or "-")
        for shard_id in sorted(set(shards) - set(listed)):
            if shards[shard_id].get("ended"):
                del shards[shard_id]  # gone by retention after we read it all
                continue
            message = (f"shard {shard_id} is no longer listed by Kinesis (expired by retention?) "
                       f"before the query read it to its end: records may be lost")
            if fail_on_data_loss:
                raise DataLossError(message + " (kinesis.failOnDataLoss is true)")
            log.warning("%s; going on (kinesis.failOnDataLoss is false)", message)
            shards[shard_id] = {"ended": True}
    for shard_id, entry in list(shards.items()):
        if entry.get("wait"):
            waiting = [p for p in entry["wait"] if p in shards and not shards[p].get("ended")]
            entry = {k: v for k, v in entry.items() if k != "wait"}
            if waiting:
                entry["wait"] = waiting
            shards[shard_id] = entry
    return {k: shards[k] for k in sorted(shards)}


def is_first_reading_again(start: dict[str, Any], end: dict[str, Any]) -> bool:
    """Spark re-runs a query's first micro-batch, planned but not committed before a stop.

    Spark then asks ``initialOffset()`` again for the start, and a restarted source process
    makes a new query id. The logged ``end`` alone says what reading 1 reads (its query id,
    its positions, LATEST's pinned time): ``start`` only bounds it. ``end`` is an initial
    offset itself (reading 0) where Spark ran an empty first batch (nothing had arrived at
    the first trigger). Either way that checkpoint resumes under the id it was born with,
    whatever moment the query was stopped at.
    """
    return int(start.get("batch", -1)) == 0 and int(end.get("batch", -1)) in (0, 1)


def make_offset(query_id: str, batch: int, limit: int,
                shards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"v": OFFSET_VERSION, "query": query_id, "batch": batch, "limit": limit,
            "shards": {k: shards[k] for k in sorted(shards)}}


# -- executors ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardPartition(InputPartition):
    """A task's shards in one micro-batch; all a task knows (picklable, small)."""

    config: ConsumerConfig
    ranges: tuple[ShardRange, ...]
    arrow: bool = True

    def __repr__(self) -> str:
        shards = ", ".join(f"{r.shard_id} after {r.start}" for r in self.ranges)
        return f"ShardPartition(reading {self.ranges[0].batch_ms}: {shards})"


def arrow_schema() -> Any:
    """The Arrow schema Spark expects from read(): ``SCHEMA``'s, nullability included (pyspark
    >= 4.2 checks it). Spelled out, since PySpark's converter changed its keywords between
    4.0 and 4.2."""
    import pyarrow as pa

    return pa.schema([
        pa.field("data", pa.binary(), nullable=False),
        pa.field("streamName", pa.string(), nullable=False),
        pa.field("partitionKey", pa.string(), nullable=False),
        pa.field("sequenceNumber", pa.string(), nullable=False),
        pa.field("subSequenceNumber", pa.int64(), nullable=False),
        pa.field("shardId", pa.string(), nullable=False),
        pa.field("approximateArrivalTimestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    ])


def to_arrow(records: Sequence[Record], stream_name: str, schema: Any) -> Any:
    import pyarrow as pa

    n = len(records)
    columns = [
        pa.array([r.binary_data for r in records], pa.binary()),
        pa.array([stream_name] * n, pa.string()),
        pa.array([r.partition_key for r in records], pa.string()),
        pa.array([r.sequence_number for r in records], pa.string()),
        pa.array([r.sub_sequence_number for r in records], pa.int64()),
        pa.array([r.shard_id for r in records], pa.string()),
        pa.array([r.approximate_arrival_timestamp * 1000 for r in records],
                 pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def read_partition(partition: ShardPartition) -> Iterator[Any]:
    """The records of one partition, the same ones every time (see the module docstring)."""
    stream = partition.config.stream_name
    schema = arrow_schema() if partition.arrow else None
    for records, report in read_shards(partition.config, partition.ranges):
        r = report.batch_range
        log.info("shard %s reading %d: %d records after %s through %s%s, millisBehindLatest %s",
                 r.shard_id, r.batch_ms, r.records, r.start, r.end or "-",
                 " (shard end)" if r.shard_end else "", report.millis_behind_latest)
        if schema is None:
            import datetime as _dt

            utc = _dt.timezone.utc
            for x in records:
                yield (x.binary_data, stream, x.partition_key, x.sequence_number,
                       x.sub_sequence_number, x.shard_id,
                       _dt.datetime.fromtimestamp(x.approximate_arrival_timestamp / 1000.0, utc))
            continue
        for i in range(0, len(records), ARROW_ROWS):
            yield to_arrow(records[i:i + ARROW_ROWS], stream, schema)


# -- the driver --------------------------------------------------------------------------------
@dataclass
class Probe:
    """What the driver learnt about a shard's next reading before planning it."""

    has_data: bool
    millis_behind_latest: int | None = None


@dataclass
class ShardWatch:
    """The driver's view of one shard between its readings: the position it stands at, an
    iterator valid there (a read's or a probe's NextShardIterator), and the last probe there."""

    entry: dict[str, Any]
    iterator: str | None = None
    iterator_time: float = 0.0  # epoch s, when Kinesis handed ``iterator`` out
    probe: Probe | None = None
    probed_at: float = 0.0  # monotonic s

    def probe_due(self, now: float) -> bool:
        """No probe yet, or a quiet one older than the probe interval."""
        return self.probe is None or (not self.probe.has_data
                                      and now - self.probed_at >= PROBE_INTERVAL_S)


class KinesisStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Plans micro-batches on the driver; holds no records."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.config = options.config
        self._kinesis: KinesisClient | None = None
        self._ranges: BatchRangeTable | None = None
        self._listing: list[Shard] | None = None
        self._listed_at = 0.0
        self._target_ms: int | None = None  # Trigger.AvailableNow: read what arrived before
        self._last_end: dict[str, Any] | None = None  # pyspark < 4.2 calls latestOffset()
        self._initial: dict[str, Any] | None = None
        self._read_in: dict[int, list[str]] = {}  # reading -> the shards it read (to clean up)
        self._lag: dict[str, int | None] = {}
        self._weight: dict[str, int] = {}  # what each shard of the planned reading read last
        self._pool: ThreadPoolExecutor | None = None
        self._watch: dict[str, ShardWatch] = {}
        self._watch_lock = threading.Lock()
        self._quiet: dict[str, dict[str, Any]] = {}  # shards sitting out: the prober's work
        self._prober: threading.Thread | None = None
        self._halt = threading.Event()
        self._probe_kinesis: KinesisClient | None = None
        self._recorded: tuple[str, int, dict[str, BatchRange | None]] | None = None
        self._probe_faults = FaultLog(log, f"probing stream {self.config.stream_name}")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_kinesis=None, _ranges=None, _listing=None, _pool=None, _watch={},
                     _read_in={}, _watch_lock=None, _quiet={}, _prober=None, _halt=None,
                     _probe_kinesis=None, _recorded=None, _probe_faults=None)
        return state

    # clients, created on first use in the driver process
    @property
    def kinesis(self) -> KinesisClient:
        if self._kinesis is None:
            self._kinesis = KinesisClient(self.config)
        return self._kinesis

    @property
    def probe_kinesis(self) -> KinesisClient:
        """The probes' client: one try per call. A probe that fails says "read it" and the
        reading's task waits the fault out; a probe that retried would spend the budget the
        task needs, and hold the trigger up."""
        if self._probe_kinesis is None:
            self._probe_kinesis = KinesisClient(replace(self.config, retry_max_attempts=1))
        return self._probe_kinesis

    @property
    def ranges(self) -> BatchRangeTable:
        if self._ranges is None:
            table = BatchRangeTable(self.config)
            table.create_table_if_not_exists()
            self._ranges = table
        return self._ranges

    def _shards(self, force: bool = False) -> list[Shard] | None:
        """The stream's shards, listed at most every describeShardInterval (None: not due)."""
        now = time.monotonic()
        if force or self._listing is None or \
                now - self._listed_at >= self.options.describe_shard_interval_s:
            self._listing = self.kinesis.list_shards()
            self._listed_at = now
            return self._listing
        return None

    def _child_start(self) -> dict[str, Any]:
        start = self.options.starting_position
        if start.kind == "AT_TIMESTAMP":
            return {"at": AT_TIMESTAMP, "ts": float(start.timestamp)}
        return {"at": TRIM_HORIZON}

    # -- the DataSourceStreamReader API --------------------------------------------------------
    def initialOffset(self) -> dict:  # noqa: N802 - PySpark's name
        if self._initial is not None:  # pyspark < 4.2 may ask after latestOffset() made it
            return self._initial
        self.ranges  # noqa: B018 - the table exists before any executor needs it
        start = self.options.starting_position
        listing = self._shards(force=True) or []
        pinned = time.time()
        shards: dict[str, dict[str, Any]] = {}
        listed = {s.shard_id for s in listing}
        for shard in sorted(listing, key=lambda s: s.shard_id):
            if start.kind == "LATEST":
                shards[shard.shard_id] = ({"ended": True} if shard.is_closed
                                          else {"at": AT_TIMESTAMP, "ts": pinned})
                continue
            entry = dict(self._child_start())
            parents = [p for p in shard.parent_shard_ids if p in listed]
            if parents:
                entry["wait"] = parents
            shards[shard.shard_id] = entry
        offset = make_offset(uuid.uuid4().hex, 0, self.options.max_fetch_records_per_shard,
                             next_shards(shards, None, {}, False))
        log.info("aws-kinesis query %s on stream %s starts %s: %d shards", offset["query"],
                 self.config.stream_name, start.kind, len(shards))
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
        query, batch = start["query"], int(start["batch"])
        key = stream_key(self.config.stream_name, query)
        read_last = [s for s, e in start["shards"].items() if is_read(e)] if batch > 0 else []
        stored = self._recorded_ranges(key, batch, read_last)
        shards = {s: advance(_without_quiet(e), stored.get(s))
                  for s, e in start["shards"].items()}
        for shard_id, recorded in stored.items():  # the read's iterator, at the next position
            if recorded is not None and recorded.next_iterator is not None:
                self._watched(shard_id, shards[shard_id], recorded.next_iterator,
                              recorded.iterator_time, recorded.records == 0
                              and recorded.millis_behind_latest == 0)
        shards = next_shards(shards, self._shards(), self._child_start(),
                             self.options.fail_on_data_loss)
        readable = [s for s, e in shards.items() if is_readable(e)]
        # A shard whose last reading brought records is read again unasked (Trigger.AvailableNow
        # asks every shard: it stops at the records that arrived before it started).
        going = {s: stored[s] for s in readable if self._target_ms is None
                 and stored.get(s) is not None and stored[s].records > 0}  # type: ignore[union-attr]
        probes = self._probed({s: shards[s] for s in readable if s not in going})
        self._lag = {**{s: p.millis_behind_latest for s, p in probes.items()},
                     **{s: r.millis_behind_latest for s, r in going.items()}}
        self._weight = {**{s: p.millis_behind_latest or 0 for s, p in probes.items()},
                        **{s: r.records for s, r in going.items()}}
        busy = [s for s in readable if s in going or probes[s].has_data]
        # A shard found quiet sits this reading out: no task reads it, so it costs no range
        # item, no lookup and no task; the background prober watches it. The mark is in the
        # offset, so a re-run of the reading plans the same shards.
        quiet = {s: shards[s] for s in readable if s not in busy}
        self._watch_quiet(quiet)
        if not busy:
            return start
        for shard_id in quiet:
            shards[shard_id] = {**shards[shard_id], "quiet": True}
        cap = self.options.max_fetch_records_per_shard
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            cap = max(1, min(cap, limit.max_rows // len(busy)))
        end = make_offset(query, batch + 1, cap, shards)
        lags = [v for v in self._lag.values() if v is not None]
        log.info("aws-kinesis %s reading %d: %d of %d shards read, up to %d records each, max "
                 "millisBehindLatest %s ms", self.config.stream_name, batch + 1, len(busy),
                 len(readable), cap, max(lags) if lags else "-")
        self._last_end = end
        return end

    def reportLatestOffset(self) -> dict | None:  # noqa: N802 - PySpark's name
        """Shown as the source's ``latestOffset`` in the query progress: the lag per shard."""
        if not self._lag:
            return None
        return {"millisBehindLatest": {k: self._lag[k] for k in sorted(self._lag)}}

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
        key = stream_key(self.config.stream_name, end["query"])
        batch, cap = int(end["batch"]), int(end["limit"])
        ranges = []
        for shard_id, entry in end["shards"].items():
            if not is_read(entry):
                continue
            position, timestamp = position_of(entry)
            # Every empty read is recorded: a task cannot tell a re-run of its batch from
            # its first computation here.
            ranges.append(ShardRange(key, shard_id, batch, position, timestamp, batch, cap,
                                     self.options.max_fetch_time_per_shard_s, position,
                                     timestamp, iterator=self._iterator(shard_id, entry),
                                     record_empty=True))
        self._read_in[batch] = [r.shard_id for r in ranges]
        weight = dict(self._weight)
        groups = group_shards(ranges, self.config.shards_per_task, self._parallelism(),
                              lambda r: weight.get(r.shard_id, 0))
        return [ShardPartition(self.config, group, self.options.arrow_batches)
                for group in groups]

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
        key = stream_key(self.config.stream_name, end["query"])
        old = range(max(1, batch - 2 * CLEANUP_EVERY), max(1, batch - CLEANUP_EVERY))
        everyone = list(end["shards"])  # a reading planned before a restart: not known here
        doomed = [(key, shard_id, t) for t in old
                  for shard_id in self._read_in.pop(t, everyone)]

        def delete() -> None:
            try:
                self.ranges.delete(doomed)
            except KinesisDStreamError as exc:
                log.warning("could not delete old batch ranges of %s (TTL will): %s", key, exc)

        if doomed:
            self._threads().submit(delete)

    def stop(self) -> None:
        self._halt.set()
        if self._prober is not None:
            self._prober.join(timeout=30)
            self._prober = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._kinesis = self._ranges = self._probe_kinesis = None

    # -- probes: is there anything to read? ---------------------------------------------------
    def _parallel(self, fn: Any, shard_ids: Sequence[str]) -> dict[str, Any]:
        """``fn(shard id)`` for each shard, concurrently: the driver's wait per trigger is one
        round trip, not one per shard."""
        if len(shard_ids) <= 1:
            return {s: fn(s) for s in shard_ids}
        futures = {s: self._threads().submit(fn, s) for s in shard_ids}
        return {s: f.result() for s, f in futures.items()}

    def _threads(self) -> ThreadPoolExecutor:
        """The driver's threads for the per-shard calls and the range clean-up."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kinesis-source")
        return self._pool

    def _recorded_ranges(self, key: str, batch: int,
                         shard_ids: Sequence[str]) -> dict[str, BatchRange | None]:
        """The ranges reading ``batch`` recorded (it completed: they no longer change), looked
        up once however many triggers find nothing new to read."""
        if self._recorded is not None and self._recorded[:2] == (key, batch):
            return self._recorded[2]
        ranges = self.ranges  # created once, before the threads share it
        # A DynamoDB outage holds the trigger back (the tasks wait it out too), not the query.
        stored = self._parallel(lambda s: waiting_out_dynamodb(
            self.config, lambda: ranges.get(key, s, batch)), shard_ids)
        self._recorded = (key, batch, stored)
        return stored

    def _watched(self, shard_id: str, entry: dict[str, Any], iterator: str | None = None,
                 iterator_time: float = 0.0, read_empty: bool = False) -> ShardWatch:
        """The shard's watch at ``entry``: a new one when the shard moved, with ``iterator``.
        ``read_empty``: a read that found nothing at the shard's tip (millisBehindLatest 0;
        not a read refused by throttling, which knows nothing) ended there when Kinesis
        handed ``iterator`` out, which tells what a probe would: no probe is due before
        PROBE_INTERVAL_S from then."""
        with self._watch_lock:
            watch = self._watch.get(shard_id)
            if watch is None or watch.entry != entry:
                watch = self._watch[shard_id] = ShardWatch(dict(entry))
            if iterator is not None:
                watch.iterator, watch.iterator_time = iterator, iterator_time
                if read_empty:
                    age = max(0.0, time.time() - iterator_time)
                    watch.probe, watch.probed_at = Probe(False, 0), time.monotonic() - age
            return watch

    def _probed(self, shards: dict[str, dict[str, Any]]) -> dict[str, Probe]:
        """What the probes found at each shard's position: the background prober's finding
        while it is fresh, else a probe made now (a shard newly quiet, or the first trigger)."""
        now = time.monotonic()
        found: dict[str, Probe] = {}
        for shard_id, entry in shards.items():
            watch = self._watched(shard_id, entry)
            if watch.probe is not None and (watch.probe.has_data
                                            or now - watch.probed_at < PROBE_STALE_S):
                found[shard_id] = watch.probe
        if self._target_ms is not None:  # Trigger.AvailableNow asks afresh at every trigger
            found = {}
        missing = [s for s in shards if s not in found]
        found.update(self._parallel(lambda s: self._probe(s, shards[s]), missing))
        return found

    def _watch_quiet(self, quiet: dict[str, dict[str, Any]]) -> None:
        """Hand the shards that sit this reading out to the background prober."""
        with self._watch_lock:
            self._quiet = dict(quiet)
            for shard_id in [s for s in self._watch if s not in quiet]:
                if self._watch[shard_id].probe is not None:  # read next: a new position
                    self._watch[shard_id].probe = None
        if quiet and self._prober is None and self._target_ms is None:
            self._threads()  # made here, before two threads could race to make it
            self._prober = threading.Thread(target=self._probe_quiet_shards, daemon=True,
                                            name=f"kinesis-source-prober-{self.config.stream_name}")
            self._prober.start()

    def _probe_quiet_shards(self) -> None:
        """The background prober: each quiet shard once every PROBE_INTERVAL_S, until stop()."""
        while not self._halt.wait(PROBE_INTERVAL_S / 4):
            with self._watch_lock:
                quiet = dict(self._quiet)
                now = time.monotonic()
                due = [s for s, e in quiet.items() if s in self._watch
                       and self._watch[s].entry == e and self._watch[s].probe_due(now)]
            try:
                self._parallel(lambda s: self._probe(s, quiet[s]), due)
            except Exception as exc:  # noqa: BLE001 - latestOffset probes again, and raises
                log.debug("background probe of %s failed: %s", self.config.stream_name, exc)

    def _iterator(self, shard_id: str, entry: dict[str, Any]) -> str | None:
        """An iterator at the shard's position in ``entry`` while it is valid: from an earlier
        probe that found nothing there, or recorded by the read that ended there."""
        with self._watch_lock:
            watch = self._watch.get(shard_id)
            if watch is None or watch.entry != entry or watch.iterator is None or \
                    time.time() - watch.iterator_time > ITERATOR_TTL_S:
                return None
            return watch.iterator

    def _probe(self, shard_id: str, entry: dict[str, Any]) -> Probe:
        """One GetRecords from the shard's position: a record (before the AvailableNow target),
        the shard's end, or a positive lag means the next reading has work. Kept in the
        shard's watch.

        A probe that found nothing keeps Kinesis' NextShardIterator, which still points at
        the position: the next probe of a quiet shard, or the task that reads it, starts
        from it without a GetShardIterator (5 a second per shard for the whole account). A
        probe that meets throttling or an outage is not retried: it says "read it", and the
        reading's task waits the fault out with the reader's backoff.
        """
        position, timestamp = position_of(entry)
        config = replace(self.config, max_records=2,
                         initial_position_timestamp=timestamp or self.config.initial_position_timestamp)
        fetcher = KinesisDataFetcher(self.probe_kinesis, config, shard_id)
        iterator = self._iterator(shard_id, entry)
        try:
            if iterator is not None:
                fetcher.resume(position, iterator)
            else:
                fetcher.initialize(position)
            result = fetcher.get_records()
        except KinesisDStreamError as exc:
            if not is_transient(exc):
                raise
            self._probe_faults.failed(exc)
            return self._found(shard_id, entry, Probe(True))
        if self._probe_faults.failing:
            self._probe_faults.succeeded()
        lag = result.millis_behind_latest
        if result.shard_end:
            probe = Probe(True, lag)
        elif result.records:
            arrived = result.records[0].approximate_arrival_timestamp
            probe = Probe(self._target_ms is None or arrived <= self._target_ms, lag)
        else:
            probe = Probe(bool(lag) and self._target_ms is None, lag)
        # An empty page's NextShardIterator still points at the position.
        empty = not result.records and not result.shard_end
        return self._found(shard_id, entry, probe, fetcher.iterator if empty else None)

    def _found(self, shard_id: str, entry: dict[str, Any], probe: Probe,
               iterator: str | None = None) -> Probe:
        """Keep what a probe at ``entry`` found, unless the shard has moved on since."""
        with self._watch_lock:
            watch = self._watch.setdefault(shard_id, ShardWatch(dict(entry)))
            if watch.entry == entry:
                watch.probe, watch.probed_at = probe, time.monotonic()
                if iterator is not None:
                    watch.iterator, watch.iterator_time = iterator, time.time()
        return probe
