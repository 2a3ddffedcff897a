"""Runs on executors: one shard's read for one batch, the same records every time.

A batch's partition names a shard and where its read starts (``ShardRange``); Kinesis cannot
say in advance where the shard's records stop, so the first computation of the partition
decides where the batch ends (a record cap, shard end, caught up, or a time budget) and
records that range in the batch-range table *before* any record leaves the task. Every later
computation (a task retry, a lost cached block, a second output operation) finds the range
and reads exactly it.

What an idle shard costs. A read that found nothing hands out nothing, so it records
nothing either: a later computation that finds no recorded range knows the first one was
empty, and returns nothing too, whatever arrived since (the caller says which computation
is the first; see ``read_shard_range``). A shard with no records thus costs one GetRecords
per batch and no DynamoDB call; the lease check (one read of the lease item) is made only
when there are records to hand out. And a read that ended at a page boundary hands back
Kinesis' NextShardIterator, which the next batch's read of the shard starts from: no
GetShardIterator while the shard is read batch after batch, as a KCL shard consumer keeps
its iterator for the life of its lease.

Throttling and an endpoint that does not answer never fail a new range: the task keeps what
it read, or reads nothing, and the next batch goes on from there. A recorded range must be
read in full; its reads (GetShardIterator included) wait those faults out. So do the DynamoDB
calls (the range written, looked up, the lease read): a DynamoDB outage holds the task's
records back until their range is recorded, and batches go on from what was recorded.

At Kinesis' read limits (5 calls/s and 2 MiB/s per shard, for every application together) a
refused read is tried again after ``throttle_wait_s`` (about a second, as AWS advises), not
after a fast exponential: a shard in debt after a full page refuses for seconds whatever
the reader does. A new range that meets a throttle before any record waits one such pause
at most, then hands out nothing, so a task does not hold its executor core for seconds
while the next batch could read the shard as well. Every refusal is counted in the read's
report (``throttled``), for ``KinesisUtils.metrics()`` and the KCL's CloudWatch metrics.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, TypeVar

from ..aws.kinesis import KinesisClient
from ..aws.lease_table import LeaseTable
from ..aws.range_table import BatchRange, BatchRangeTable, range_table_name
from ..config import ConsumerConfig
from ..errors import KinesisDStreamError
from ..records import AT_TIMESTAMP, ExtendedSequenceNumber, Record
from ..retry import (Backoff, FaultLog, RetryPolicy, is_throttling, is_transient,
                     throttle_wait_s, wait_out)
from ..worker.fetcher import KinesisDataFetcher, TrimmedRange, report_data_loss

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long one read of one shard may last. Only a backlog reaches it: a shard that is caught
# up stops at its tip. A batch that reads a backlog is late anyway, and bigger reads spread
# each batch's fixed cost over more records (bench_spark's drain of 4 x 100k records took a
# fifth less time with 5 s than with 0.8 s). Record caps bound the batch's size.
MAX_FETCH_TIME_PER_SHARD_S = 5.0
# A handed-back iterator is used while younger than this: Kinesis expires it after 5 minutes.
ITERATOR_TTL_S = 240.0
# A recorded range must be read whole: its reads wait a throttled or unreachable Kinesis out
# for up to this long before the task fails (and Spark retries it).
EXACT_READ_PATIENCE_S = 600.0
# A new range refused before its first record waits for at most this long in all (one
# ``throttle_wait_s`` pause), then hands out nothing: the next batch tries again.
NEW_READ_THROTTLE_PATIENCE_S = 1.0


@dataclass(frozen=True)
class ShardRange:
    """One shard's read in one batch: which shard, and what bounds its start.

    ``floor`` is the lease's checkpoint when the lease period began (or a sentinel, with
    ``floor_timestamp`` for AT_TIMESTAMP): the period's first batch starts there. ``since_ms``
    is that batch's time; a range recorded before it belongs to an earlier period. ``start``,
    when the planner knows it, is where the previous batch ended, and ``iterator`` the
    NextShardIterator that batch's read handed back (valid at ``start``). ``record_empty``
    records an empty read's range too, for callers that cannot tell a task which computation
    of the partition is the first.
    """

    stream_key: str
    shard_id: str
    batch_ms: int
    floor: ExtendedSequenceNumber
    floor_timestamp: float | None
    since_ms: int
    max_records: int
    time_budget_s: float
    start: ExtendedSequenceNumber | None = None
    start_timestamp: float | None = None
    owner: str | None = None  # the driver's worker id: read only while it holds the lease
    iterator: str | None = field(default=None, repr=False)
    record_empty: bool = False


@dataclass(frozen=True)
class ReadReport:
    """What a task tells the planner about one shard's read (small; no records)."""

    batch_range: BatchRange
    millis_behind_latest: int | None = None
    data_bytes: int = 0
    get_records_calls: int = 0
    get_records_ms: float = 0.0
    reader_pid: int = 0
    recorded: bool = True  # the range is in the batch-range table
    next_iterator: str | None = field(default=None, repr=False)  # valid at batch_range.next_start
    iterator_time: float = 0.0  # epoch seconds when Kinesis handed ``next_iterator`` out
    get_shard_iterator_calls: int = 0
    fresh: bool = True  # the computation was allowed to decide a new range
    throttled: int = 0  # reads (GetRecords, GetShardIterator) Kinesis refused for throughput
    faults: int = 0  # other transient failures the read waited out
    get_records_served: int = 0  # GetRecords calls answered (the KCL's getRecords.Success 1)
    # The read stopped at its time budget or record cap, not at the shard's tip: a backlog
    # waits, and the planner reads the next batch as soon as this one is read.
    more_left: bool = False


def start_after(previous: BatchRange | None, floor: ExtendedSequenceNumber,
                floor_timestamp: float | None) -> tuple[ExtendedSequenceNumber, float | None]:
    """Where a shard's next read starts: where its previous batch in this lease period ended,
    or the period's floor. The one rule, for the driver (from a read's report) and for a task
    that looks the previous batch up."""
    if previous is not None:
        return previous.next_start, previous.start_timestamp
    return floor, floor_timestamp


@dataclass
class _Clients:
    kinesis: KinesisClient
    ranges: BatchRangeTable
    leases: LeaseTable


_clients: dict[ConsumerConfig, _Clients] = {}
_clients_lock = threading.Lock()


# An executor's Python worker has no logging set up: without a handler Python prints bare
# messages, with no time, level or logger, into the executor's stderr log.
EXECUTOR_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s"


def log_to_stderr_unless_configured() -> None:
    """Give this package's executor-side lines a time, a level and a logger name, unless the
    process (a user's own setup, or a driver that reads in local mode) configured logging."""
    package = logging.getLogger("kinesis_dstream")
    if logging.getLogger().handlers or package.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(EXECUTOR_LOG_FORMAT))
    package.addHandler(handler)
    if package.level == logging.NOTSET:
        package.setLevel(logging.WARNING)  # faults and give-ups; not a line per read


def clients_for(config: ConsumerConfig) -> _Clients:
    """This process's clients for ``config`` (PySpark reuses its Python workers)."""
    with _clients_lock:
        clients = _clients.get(config)
        if clients is None:
            log_to_stderr_unless_configured()
            kinesis = KinesisClient(config, policy=reader_policy(config))
            clients = _clients[config] = _Clients(kinesis, BatchRangeTable(config),
                                                  LeaseTable(config))
            freeze_long_lived_objects()
        return clients


def reader_policy(config: ConsumerConfig) -> RetryPolicy:
    """The executors' Kinesis retry policy: the configured one, except that a throttle comes
    back at once, for ``_read`` to count and to pace (a retry 50 ms later would only be
    refused again, and spend the shard's calls)."""
    return replace(RetryPolicy.from_config(config), retry_throttling=False)


def freeze_long_lived_objects() -> None:
    """Keep PySpark's per-task full garbage collection off boto3's objects.

    A reused PySpark worker runs ``gc.collect()`` after every task (pyspark/daemon.py). Once
    botocore has loaded its service models that walks some 90,000 objects, 25 ms or more per
    task, and in a worker forked from PySpark's daemon it also copies every page it touches:
    bench_spark's latency run spent most of its executors' CPU there. The clients live as
    long as the process, so they move to the collector's permanent generation; reference
    counting still frees everything else, and later tasks' garbage is collected as before.
    """
    gc.collect()
    gc.freeze()


@dataclass
class _Reading:
    records: list[Record] = field(default_factory=list)
    millis_behind_latest: int | None = None
    calls: int = 0
    served: int = 0
    seconds: float = 0.0
    shard_end: bool = False
    child_shard_ids: tuple[str, ...] = ()
    iterator: str | None = None  # valid right after the last record read, if aligned
    iterator_time: float = 0.0
    shard_iterator_calls: int = 0
    throttled: int = 0
    faults: int = 0
    lost: TrimmedRange | None = None  # records trimmed by retention before this read's start
    more_left: bool = False  # stopped at the time budget or the record cap


_faults: dict[str, FaultLog] = {}  # per shard, in this Python worker process


def _fault_log(shard_id: str, what: str | None = None) -> FaultLog:
    """A transient fault is logged at most once a minute per shard (or other ``shard_id``
    key, saying ``what`` it is) and process, with a count."""
    fault = _faults.get(shard_id)
    if fault is None:
        fault = _faults.setdefault(shard_id, FaultLog(log, what or f"reading shard {shard_id}"))
    return fault


def waiting_out_dynamodb(config: ConsumerConfig, fn: Callable[[], T],
                         sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()`` (a call to the lease or batch-range table), a DynamoDB outage waited out as
    patiently as a Kinesis outage in a recorded range's read, logged once a minute per
    table pair and process."""
    key = range_table_name(config.application_name)
    fault = _fault_log(key, f"DynamoDB (tables {config.application_name} and {key})")
    return wait_out(fn, patience_s=EXACT_READ_PATIENCE_S, fault=fault,
                    backoff=Backoff.after_retries(config), sleep=sleep)


def _read(clients: _Clients, config: ConsumerConfig, shard_id: str,
          start: ExtendedSequenceNumber, timestamp: float | None, *,
          end: ExtendedSequenceNumber | None = None, iterator: str | None = None,
          max_records: int = 0, time_budget_s: float = 0.0,
          sleep: Callable[[float], None] = time.sleep) -> _Reading:
    """The one read loop of the executors, for a new range and for a recorded one.

    From ``start`` (exclusive), either exactly through ``end`` (a recorded range), or until
    ``max_records``, the shard's end, its tip or ``time_budget_s`` (a new range). The
    iterator the read ends with is kept when the read ended at a page boundary, so that the
    next read can go on with it.
    """
    exact = end is not None
    reading = _Reading()
    policy = RetryPolicy.from_config(config)
    deadline = time.monotonic() + (EXACT_READ_PATIENCE_S if exact else time_budget_s)
    failures = 0
    throttle_waited = 0.0
    fetcher: KinesisDataFetcher | None = None
    aligned = True
    while True:
        try:
            if fetcher is None:  # GetShardIterator meets an outage as a page would
                if start.sequence_number == AT_TIMESTAMP:
                    config = replace(config, initial_position_timestamp=timestamp)
                fetcher = KinesisDataFetcher(clients.kinesis, config, shard_id)
                if iterator is not None:
                    fetcher.resume(start, iterator)
                else:
                    fetcher.initialize(start)
            began = time.perf_counter()
            try:
                result = fetcher.get_records()
            finally:
                reading.calls += 1
                reading.seconds += time.perf_counter() - began
            reading.served += 1
        except KinesisDStreamError as exc:
            if not is_transient(exc):
                raise
            throttled = is_throttling(exc)
            if throttled:
                reading.throttled += 1
            else:
                reading.faults += 1
                failures += 1
            if time.monotonic() >= deadline:
                if exact:
                    raise
                _fault_log(shard_id).failed(exc)
                break  # a new range keeps what it read; the next batch goes on from there
            if not exact and reading.records:
                _fault_log(shard_id).failed(exc)
                break
            wait = (throttle_wait_s() if throttled
                    else policy.jittered_backoff_ms(failures) / 1000.0)
            if not exact and throttled:
                if throttle_waited + wait > NEW_READ_THROTTLE_PATIENCE_S:
                    _fault_log(shard_id).failed(exc)
                    break  # nothing read: the next batch tries the shard again
                throttle_waited += wait
            wait = min(wait, max(0.0, deadline - time.monotonic()))
            _fault_log(shard_id).failed(exc, wait)
            sleep(wait)
            continue
        failures = 0
        fault = _faults.get(shard_id)
        if fault is not None and fault.failing:
            fault.succeeded()
        reading.millis_behind_latest = result.millis_behind_latest
        if exact:
            assert end is not None
            aligned = False  # a recorded range's read hands no iterator on
            reading.records.extend(r for r in result.records
                                   if r.extended_sequence_number <= end)
            if reading.records and reading.records[-1].extended_sequence_number >= end:
                break
            if result.shard_end:
                # The recorded end lies beyond what the shard still holds (trimmed by retention?).
                got = reading.records[-1].extended_sequence_number if reading.records else start
                raise KinesisDStreamError(
                    f"shard {shard_id}: a recorded range ends at {end}, but the shard ended at "
                    f"{got}")
            continue
        reading.records.extend(result.records)
        if max_records and len(reading.records) >= max_records:
            aligned = len(reading.records) == max_records
            del reading.records[max_records:]
            reading.more_left = True
            break
        if result.shard_end:
            reading.shard_end, reading.child_shard_ids = True, tuple(result.child_shard_ids)
            break
        if result.at_tip(config.max_records):
            break
        if time.monotonic() >= deadline:
            reading.more_left = True
            break
    if fetcher is not None:
        reading.shard_iterator_calls = fetcher.shard_iterator_calls
        reading.lost = fetcher.data_lost
        if aligned and not reading.shard_end and fetcher.iterator is not None and reading.calls:
            reading.iterator, reading.iterator_time = fetcher.iterator, time.time()
    return reading


def _lease_moved(clients: _Clients, planned: ShardRange) -> bool:
    """Did the lease move to another worker between planning and this read?

    A batch planned just before the driver noticed a lost lease may be read a little later;
    its new owner reads from the last checkpoint, so handing these records out would count
    them twice. Asked only when there are records to hand out.
    """
    if planned.owner is None:
        return False
    lease = waiting_out_dynamodb(clients.leases.config,
                                 lambda: clients.leases.get_lease(planned.shard_id))
    if lease is None or lease.lease_owner == planned.owner:
        return False
    log.info("shard %s: its lease moved to %s before batch %d read it; the batch reads none "
             "of it", planned.shard_id, lease.lease_owner, planned.batch_ms)
    return True


def _report(batch_range: BatchRange, reading: _Reading, *, recorded: bool,
            fresh: bool) -> tuple[list[Record], ReadReport]:
    report = ReadReport(batch_range, reading.millis_behind_latest,
                        sum(len(r.binary_data) for r in reading.records), reading.calls,
                        reading.seconds * 1000.0, os.getpid(), recorded, reading.iterator,
                        reading.iterator_time, reading.shard_iterator_calls, fresh,
                        reading.throttled, reading.faults, reading.served,
                        reading.more_left)
    return reading.records, report


def _read_recorded(clients: _Clients, config: ConsumerConfig, stored: BatchRange,
                   sleep: Callable[[float], None], fresh: bool) -> tuple[list[Record], ReadReport]:
    """Exactly a recorded range: the records after its start through its end."""
    if stored.end is None:
        reading = _Reading(shard_end=stored.shard_end, child_shard_ids=stored.child_shard_ids)
    else:
        reading = _read(clients, config, stored.shard_id, stored.start, stored.start_timestamp,
                        end=stored.end, sleep=sleep)
        reading.shard_end, reading.child_shard_ids = stored.shard_end, stored.child_shard_ids
    return _report(stored, reading, recorded=True, fresh=fresh)


def _read_new(clients: _Clients, config: ConsumerConfig, planned: ShardRange,
              start: ExtendedSequenceNumber, timestamp: float | None, iterator: str | None,
              sleep: Callable[[float], None]) -> tuple[list[Record], ReadReport]:
    """Decide a new range: read, then record it (unless it is empty) before handing it out."""
    if start.sequence_number != AT_TIMESTAMP:
        timestamp = None
    reading = _read(clients, config, planned.shard_id, start, timestamp, iterator=iterator,
                    max_records=planned.max_records, time_budget_s=planned.time_budget_s,
                    sleep=sleep)
    if reading.lost is not None and config.fail_on_data_loss:
        report_data_loss(config, reading.lost)  # raises: no record leaves the task
    if reading.records and _lease_moved(clients, planned):
        reading = _Reading(calls=reading.calls, served=reading.served, seconds=reading.seconds,
                           throttled=reading.throttled, faults=reading.faults)
    records = reading.records
    candidate = BatchRange(
        planned.stream_key, planned.shard_id, planned.batch_ms, start, timestamp,
        records[-1].extended_sequence_number if records else None, len(records),
        reading.shard_end, reading.child_shard_ids, reading.iterator, reading.iterator_time,
        reading.millis_behind_latest)
    if not records and not reading.shard_end and not planned.record_empty:
        if reading.lost is not None:
            report_data_loss(config, reading.lost)
        return _report(candidate, reading, recorded=False, fresh=True)
    stored = waiting_out_dynamodb(config, lambda: clients.ranges.put_if_absent(candidate), sleep)
    if stored != candidate:
        log.info("shard %s batch %d: its range was recorded by an earlier computation; "
                 "reading that one", planned.shard_id, planned.batch_ms)
        return _read_recorded(clients, config, stored, sleep, fresh=True)
    if reading.lost is not None and stored is candidate:  # our write stands: we log it
        report_data_loss(config, reading.lost)
    return _report(stored, reading, recorded=True, fresh=True)


def read_shard_range(config: ConsumerConfig, planned: ShardRange, *, fresh: bool = True,
                     sleep: Callable[[float], None] = time.sleep) -> tuple[list[Record], ReadReport]:
    """The records of one (batch, shard) partition: the same ones every time it is computed.

    ``fresh``: this computation may decide a new range (the first computation of the
    partition, or a retry of it). Otherwise a partition with no recorded range is one whose
    first computation read nothing (an empty read records nothing), so it reads nothing.
    A partition with ``record_empty`` records empty reads, and is always fresh.

    When the planner knows where the batch starts, a fresh computation reads first and
    records its range conditionally; one that finds the range already recorded reads that
    one instead. Only a start the planner does not know costs a lookup first, and so does a
    ``record_empty`` partition: any of its computations may be a later one (a second output
    operation with ``storageLevel`` NONE), which would otherwise read a new range from
    Kinesis only to throw it away for the recorded one.
    """
    fresh = fresh or planned.record_empty
    clients = clients_for(config)
    if fresh and planned.start is not None and not planned.record_empty:
        return _read_new(clients, config, planned, planned.start, planned.start_timestamp,
                         planned.iterator, sleep)
    stored = waiting_out_dynamodb(config, lambda: clients.ranges.get(
        planned.stream_key, planned.shard_id, planned.batch_ms), sleep)
    if stored is not None:
        return _read_recorded(clients, config, stored, sleep, fresh)
    if not fresh:
        start, timestamp = planned.start or planned.floor, planned.start_timestamp
        empty = BatchRange(planned.stream_key, planned.shard_id, planned.batch_ms, start, timestamp)
        return _report(empty, _Reading(), recorded=False, fresh=False)
    if planned.start is not None:
        return _read_new(clients, config, planned, planned.start, planned.start_timestamp,
                         planned.iterator, sleep)
    previous = waiting_out_dynamodb(config, lambda: clients.ranges.latest_before(
        planned.stream_key, planned.shard_id, planned.batch_ms, planned.since_ms), sleep)
    start, timestamp = start_after(previous, planned.floor, planned.floor_timestamp)
    if previous is not None and previous.shard_end:
        ended = BatchRange(planned.stream_key, planned.shard_id, planned.batch_ms, start,
                           timestamp, None, 0, True, previous.child_shard_ids)
        stored = waiting_out_dynamodb(config, lambda: clients.ranges.put_if_absent(ended), sleep)
        return _read_recorded(clients, config, stored, sleep, fresh)
    return _read_new(clients, config, planned, start, timestamp, None, sleep)
