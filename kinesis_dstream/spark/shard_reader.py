"""Runs on executors: a Spark task reads one shard's records for one batch.

The driver plans a ``ShardRange`` per leased shard and batch; the task that computes that
partition calls ``read_shard_range``. The first computation decides where the batch ends
(a record cap, shard end, caught up, or a time budget) and records the range in the
batch-range table *before* any record leaves the task; every later computation (a task
retry, a lost block, a second output operation, a re-run after recovery) finds the range
and reads exactly it. Where the batch starts is the end of the shard's previous batch in
this lease period, which the driver passes when it already knows it and the task looks up
when it does not; the lease's checkpoint is the floor.

Throttling never fails a batch: a task that is throttled keeps what it read, or reads
nothing, and records that range; the next batch goes on from there. Only a range that was
already recorded must be read in full, and its reads are retried until they succeed or the
retry policy gives up.

Nothing here imports pyspark: the task's glue is in ``planner.py``. Clients are cached per
Python worker process (PySpark reuses them), so a task does not pay for boto3's set-up.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..aws.kinesis import KinesisClient
from ..aws.lease_table import LeaseTable
from ..aws.range_table import BatchRange, BatchRangeTable
from ..config import ConsumerConfig
from ..errors import (
    EndpointUnreachableError,
    KinesisDStreamError,
    RetriesExhaustedError,
    ThrottlingError,
    TransientServiceError,
)
from ..records import AT_TIMESTAMP, ExtendedSequenceNumber, Record
from ..retry import FaultLog, RetryPolicy
from ..worker.fetcher import KinesisDataFetcher

log = logging.getLogger(__name__)

# How long one task may read one shard for one batch. Only a backlog reaches it: a shard that
# is caught up stops at its tip. A batch that reads a backlog is late anyway, and bigger reads
# spread each batch's fixed cost (tasks, DynamoDB calls, a GetShardIterator) over more
# records: bench_spark's drain of 4 x 100k records took a fifth less time with 5 s than with
# 0.8 s. The record caps (maxRate, backpressure, max records per shard) bound the batch's size.
MAX_FETCH_TIME_PER_SHARD_S = 5.0


@dataclass(frozen=True)
class ShardRange:
    """One partition of one batch: which shard, and what bounds its start.

    ``floor`` is the lease's checkpoint when this driver took it (or a sentinel, with
    ``floor_timestamp`` for AT_TIMESTAMP): the first batch of a lease period starts there.
    ``since_ms`` is that first batch's time; a range recorded before it belongs to an
    earlier period and is never continued. ``start``, when the driver knows it, is the end of
    the previous batch; otherwise the task finds it in the batch-range table.
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


@dataclass(frozen=True)
class ReadReport:
    """What a task tells the driver about its partition (through an accumulator)."""

    batch_range: BatchRange
    millis_behind_latest: int | None = None
    data_bytes: int = 0
    get_records_calls: int = 0
    get_records_ms: float = 0.0
    reader_pid: int = 0


class RangeReports:
    """Accumulator parameter: {(stream key, shard id, batch ms): ReadReport}, merged by key.

    A partition computed twice reports the same range twice; merging by key keeps one.
    """

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:  # noqa: N802 - PySpark's name
        value1.update(value2)
        return value1


@dataclass
class _Clients:
    kinesis: KinesisClient
    ranges: BatchRangeTable
    leases: LeaseTable


_clients: dict[ConsumerConfig, _Clients] = {}
_clients_lock = threading.Lock()


def _clients_for(config: ConsumerConfig) -> _Clients:
    with _clients_lock:
        clients = _clients.get(config)
        if clients is None:
            clients = _clients[config] = _Clients(KinesisClient(config), BatchRangeTable(config),
                                                  LeaseTable(config))
            _freeze_long_lived_objects()
        return clients


def _freeze_long_lived_objects() -> None:
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
    seconds: float = 0.0
    shard_end: bool = False
    child_shard_ids: list[str] = field(default_factory=list)


def _fetcher(clients: _Clients, config: ConsumerConfig, shard_id: str,
             start: ExtendedSequenceNumber, timestamp: float | None) -> KinesisDataFetcher:
    if start.sequence_number == AT_TIMESTAMP:
        config = replace(config, initial_position_timestamp=timestamp)
    fetcher = KinesisDataFetcher(clients.kinesis, config, shard_id)
    fetcher.initialize(start)
    return fetcher


def _page(fetcher: KinesisDataFetcher, reading: _Reading) -> Any:
    began = time.perf_counter()
    try:
        return fetcher.get_records()
    finally:
        reading.calls += 1
        reading.seconds += time.perf_counter() - began


def _transient(exc: BaseException) -> bool:
    """Throttling and an endpoint that does not answer pass; nothing else is waited out."""
    if isinstance(exc, RetriesExhaustedError) and exc.last_error is not None:
        exc = exc.last_error
    return isinstance(exc, (ThrottlingError, EndpointUnreachableError, TransientServiceError))


_faults: dict[str, FaultLog] = {}  # per shard, in this Python worker process


def _fault_log(shard_id: str) -> FaultLog:
    """A transient fault is logged at most once a minute per shard and process, with a count."""
    fault = _faults.get(shard_id)
    if fault is None:
        fault = _faults[shard_id] = FaultLog(log, f"reading shard {shard_id}")
    return fault


def _read_new(clients: _Clients, config: ConsumerConfig, planned: ShardRange,
              start: ExtendedSequenceNumber, timestamp: float | None,
              sleep: Callable[[float], None]) -> _Reading:
    """Read from ``start`` until the cap, the shard's end, caught up, or the time budget."""
    reading = _Reading()
    deadline = time.monotonic() + planned.time_budget_s
    policy = RetryPolicy.from_config(config)
    throttled = 0
    fetcher = None
    while True:
        try:
            if fetcher is None:  # its GetShardIterator meets an outage as a page would
                fetcher = _fetcher(clients, config, planned.shard_id, start, timestamp)
            result = _page(fetcher, reading)
        except (ThrottlingError, RetriesExhaustedError, EndpointUnreachableError,
                TransientServiceError) as exc:
            if not _transient(exc):
                raise
            throttled += 1
            if reading.records or time.monotonic() >= deadline:
                # The batch keeps what it read; the next batch goes on from there.
                _fault_log(planned.shard_id).failed(exc, 0.0)
                break
            sleep(min(policy.jittered_backoff_ms(throttled) / 1000.0, max(0.0, deadline - time.monotonic())))
            continue
        throttled = 0
        fault = _faults.get(planned.shard_id)
        if fault is not None and fault.failing:
            fault.succeeded()
        reading.records.extend(result.records)
        reading.millis_behind_latest = result.millis_behind_latest
        if len(reading.records) >= planned.max_records:
            del reading.records[planned.max_records:]
            break
        if result.shard_end:
            reading.shard_end, reading.child_shard_ids = True, list(result.child_shard_ids)
            break
        caught_up = result.millis_behind_latest in (0, None)
        if not result.records and caught_up:
            break
        if caught_up and not result.is_full_page(config.max_records):
            break  # a short page at the tip: nothing more now
        if time.monotonic() >= deadline:
            break
    return reading


def _read_exact(clients: _Clients, config: ConsumerConfig, stored: BatchRange,
                sleep: Callable[[float], None]) -> _Reading:
    """Read exactly a recorded range: the records after its start through its end."""
    reading = _Reading(shard_end=stored.shard_end, child_shard_ids=list(stored.child_shard_ids))
    if stored.end is None:
        return reading
    policy = RetryPolicy.from_config(config)
    fetcher = _fetcher(clients, config, stored.shard_id, stored.start, stored.start_timestamp)
    throttled = 0
    while True:
        try:
            result = _page(fetcher, reading)
        except ThrottlingError:
            throttled += 1
            if throttled > 10 * policy.max_attempts:
                raise
            sleep(policy.jittered_backoff_ms(throttled) / 1000.0)
            continue
        throttled = 0
        reading.millis_behind_latest = result.millis_behind_latest
        for record in result.records:
            if record.extended_sequence_number > stored.end:
                return reading
            reading.records.append(record)
        if reading.records and reading.records[-1].extended_sequence_number >= stored.end:
            return reading
        if result.shard_end:
            # The recorded end lies beyond what the shard still holds (trimmed by retention?).
            raise KinesisDStreamError(
                f"shard {stored.shard_id}: the range of batch {stored.batch_ms} ends at "
                f"{stored.end}, but the shard ended at {reading.records[-1].extended_sequence_number if reading.records else stored.start}")


def _lease_moved(clients: _Clients, planned: ShardRange) -> bool:
    """Did the lease move to another worker between planning and this read?

    A batch planned just before the driver noticed a lost lease may be read a little later;
    its new owner reads from the last checkpoint, so reading on here would count twice.
    """
    if planned.owner is None:
        return False
    lease = clients.leases.get_lease(planned.shard_id)
    if lease is None or lease.lease_owner == planned.owner:
        return False
    log.info("shard %s: its lease moved to %s before batch %d read it; the batch reads none "
             "of it", planned.shard_id, lease.lease_owner, planned.batch_ms)
    return True


def read_shard_range(config: ConsumerConfig, planned: ShardRange,
                     sleep: Callable[[float], None] = time.sleep) -> tuple[list[Record], ReadReport]:
    """The records of one (batch, shard) partition: the same ones every time it is computed.

    When the driver knows where the batch starts, the task reads first and records its range
    conditionally; a recomputation finds its range already recorded at that point and reads
    exactly that one instead. The common first computation so saves a DynamoDB read per task
    and batch; the rare recomputation pays one wasted read from Kinesis.
    """
    clients = _clients_for(config)
    stored = None
    start, timestamp = planned.start, planned.start_timestamp
    if start is None:
        stored = clients.ranges.get(planned.stream_key, planned.shard_id, planned.batch_ms)
        if stored is None:
            previous = clients.ranges.latest_before(planned.stream_key, planned.shard_id,
                                                    planned.batch_ms, planned.since_ms)
            if previous is not None and previous.shard_end:
                start, timestamp = previous.next_start, previous.start_timestamp
                candidate = BatchRange(planned.stream_key, planned.shard_id, planned.batch_ms,
                                       start, timestamp, None, 0, True, previous.child_shard_ids)
                stored = clients.ranges.put_if_absent(candidate)
            elif previous is not None:
                start, timestamp = previous.next_start, previous.start_timestamp
            else:
                start, timestamp = planned.floor, planned.floor_timestamp
    if stored is None:
        if start.sequence_number != AT_TIMESTAMP:
            timestamp = None
        if _lease_moved(clients, planned):
            reading = _Reading()  # an empty range: the new owner reads these records
        else:
            reading = _read_new(clients, config, planned, start, timestamp, sleep)
        records = reading.records
        candidate = BatchRange(
            planned.stream_key, planned.shard_id, planned.batch_ms, start, timestamp,
            records[-1].extended_sequence_number if records else None, len(records),
            reading.shard_end, tuple(reading.child_shard_ids))
        stored = clients.ranges.put_if_absent(candidate)
        if stored != candidate:
            log.info("shard %s batch %d: its range was recorded by an earlier computation; "
                     "reading that one", planned.shard_id, planned.batch_ms)
            reading = _read_exact(clients, config, stored, sleep)
    else:
        reading = _read_exact(clients, config, stored, sleep)
    report = ReadReport(stored, reading.millis_behind_latest,
                        sum(len(r.binary_data) for r in reading.records), reading.calls,
                        reading.seconds * 1000.0, os.getpid())
    return reading.records, report
