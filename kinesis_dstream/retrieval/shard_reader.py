"""One shard's read for one batch, the same records every time: the range decision.

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
when there are records to hand out (under fan-out, while the read waits at the tip). A
read that found nothing because it was refused looks for a recorded range first: it may be
the retry of a computation that recorded one.

The DynamoDB calls (the range written, looked up, the lease read) wait an outage out: it
holds the task's records back until their range is recorded, and batches go on from what
was recorded. Every refusal is counted in the read's report (``throttled``), for
``KinesisUtils.metrics()`` and the KCL's CloudWatch metrics.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from typing import Any, Callable, TypeVar

from ..aws.range_store import range_store_name
from ..aws.range_table import BatchRange, range_table_name, start_after
from ..config import ConsumerConfig
from ..records import AT_TIMESTAMP, ExtendedSequenceNumber, Record
from ..retry import Backoff, wait_out
from .data_loss import TrimmedRange, report_data_loss
from .executor_process import ReaderClients, clients_for, fault_log
from .fetch_pace import FetchPace
from .model import ReadReport, ShardRange, shard_name
from .read_loop import EXACT_READ_PATIENCE_S, Reading, read
from .subscription_peers import read_at, serve

log = logging.getLogger(__name__)
T = TypeVar("T")


def waiting_out_dynamodb(config: ConsumerConfig, fn: Callable[[], T],
                         sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()`` (a call to the lease table or the batch-range store), an outage of DynamoDB
    (or of the file system the ranges are on) waited out as patiently as a Kinesis outage
    in a recorded range's read, logged once a minute per store and process."""
    key = config.range_path or range_table_name(config.application_name)
    fault = fault_log(key, range_store_name(config))
    return wait_out(fn, patience_s=EXACT_READ_PATIENCE_S, fault=fault,
                    backoff=Backoff.after_retries(config), sleep=sleep)


def _lease_moved(clients: ReaderClients, planned: ShardRange) -> bool:
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
    log.info("%s: its lease moved to %s before batch %d read it; the batch reads none of it",
             shard_name(clients.leases.config.stream_name, planned.shard_id),
             lease.lease_owner, planned.batch_ms)
    return True


class _LeaseCheck:
    """``_lease_moved`` of one read with records: asked at the read's end, or started on a
    thread of its own while a pushed read at the shard's tip waits for the events that
    follow (``start``), so that the DynamoDB call costs the task no time of its own."""

    def __init__(self, clients: ReaderClients, planned: ShardRange) -> None:
        self._clients, self._planned = clients, planned
        self._thread: threading.Thread | None = None
        self._answer: bool | BaseException = False

    def start(self) -> None:
        if self._thread is None and self._planned.owner is not None:
            self._thread = threading.Thread(target=self._ask, daemon=True,
                                            name=f"lease-check-{self._planned.shard_id}")
            self._thread.start()

    def _ask(self) -> None:
        try:
            self._answer = _lease_moved(self._clients, self._planned)
        except BaseException as exc:  # noqa: BLE001 - raised in the reading thread
            self._answer = exc

    def moved(self) -> bool:
        if self._thread is None:
            return _lease_moved(self._clients, self._planned)
        self._thread.join()
        if isinstance(self._answer, BaseException):
            raise self._answer
        return self._answer


# What a partition's records (of the stream a config reads) become before they leave the
# task (the SQL source's Arrow batches); None hands out the records themselves.
Convert = Callable[[list[Record], ConsumerConfig], Any] | None


def _converted(convert: Convert, records: list[Record],
               config: ConsumerConfig) -> tuple[Any, float]:
    """``records`` as ``convert`` makes them, and the milliseconds it took."""
    if convert is None:
        return records, 0.0
    began = time.perf_counter()
    out = convert(records, config)
    return out, (time.perf_counter() - began) * 1000.0


def _report(batch_range: BatchRange, reading: Reading, *, recorded: bool,
            fresh: bool, out: Any = None) -> tuple[Any, ReadReport]:
    report = ReadReport(batch_range, reading.millis_behind_latest,
                        sum(len(r.binary_data) for r in reading.records), reading.calls,
                        reading.seconds * 1000.0, os.getpid(), recorded, reading.iterator,
                        reading.iterator_time, reading.shard_iterator_calls, fresh,
                        reading.throttled, reading.faults, reading.served,
                        reading.more_left)
    return (reading.records if out is None else out), report


def _read_recorded(clients: ReaderClients, config: ConsumerConfig, stored: BatchRange,
                   sleep: Callable[[float], None], fresh: bool,
                   convert: Convert = None) -> tuple[Any, ReadReport]:
    """Exactly a recorded range: the records after its start through its end."""
    if stored.end is None:
        reading = Reading(shard_end=stored.shard_end, child_shard_ids=stored.child_shard_ids)
    else:
        reading = read(clients.kinesis, config, stored.shard_id, stored.start,
                       stored.start_timestamp, end=stored.end, sleep=sleep)
        reading.shard_end, reading.child_shard_ids = stored.shard_end, stored.child_shard_ids
        if len(reading.records) < stored.records:
            # Trimmed by retention since it was recorded: what is left, as failOnDataLoss says.
            report_data_loss(config, TrimmedRange(stored.shard_id, stored.start,
                                                  reading.first_seen))
    return _report(stored, reading, recorded=True, fresh=fresh,
                   out=_converted(convert, reading.records, config)[0])


def _read_new(clients: ReaderClients, config: ConsumerConfig, planned: ShardRange,
              start: ExtendedSequenceNumber, timestamp: float | None, iterator: str | None,
              sleep: Callable[[float], None], convert: Convert = None) -> tuple[Any, ReadReport]:
    """Decide a new range: read, convert, then record it (unless it is empty, with what the
    read and the conversion cost where the caller converts) before handing it out."""
    if start.sequence_number != AT_TIMESTAMP:
        timestamp = None
    bounds: dict[str, Any] = {"max_records": planned.max_records, "time_budget_s": planned.time_budget_s,
              "max_bytes": planned.max_bytes,
              "pace": FetchPace(planned.max_bytes_per_s, planned.min_fetch_period_s)}
    reading, subscriber, ahead = None, None, None
    if planned.peer_key is not None:
        # Fan-out: the process holding the shard's subscription reads it. Polling: the one
        # that read its next page ahead (``prefetch``) hands it over, if any did.
        fan_out = config.retrieval_mode == "FANOUT"
        ahead = planned.stream_key if not fan_out and planned.ahead_records else None
        if fan_out or planned.subscriber is not None:
            subscriber = serve(planned.peer_key, planned.stream_key, config)
        if planned.subscriber not in (None, subscriber):  # another process holds it: ask it
            reading = read_at(planned.subscriber, planned.peer_key, planned.stream_key,
                              config.stream_name, planned.shard_id, start, timestamp, **bounds)
            if reading is not None:
                subscriber = planned.subscriber
    lease_check = _LeaseCheck(clients, planned)
    if reading is None:
        reading = read(clients.kinesis, config, planned.shard_id, start, timestamp,
                       iterator=iterator, sleep=sleep, at_tip_with_records=lease_check.start,
                       not_before=planned.not_before, ahead=ahead,
                       ahead_records=planned.ahead_records, **bounds)
    if ahead is not None and planned.peer_key is not None:  # named while it holds a page
        subscriber = (subscriber or serve(planned.peer_key, planned.stream_key, config)) \
            if reading.ahead else None
    if reading.lost is not None and config.fail_on_data_loss:
        report_data_loss(config, reading.lost)  # raises: no record leaves the task
    if reading.records and lease_check.moved():
        reading = Reading(calls=reading.calls, served=reading.served, seconds=reading.seconds,
                          throttled=reading.throttled, faults=reading.faults)
    records = reading.records
    out, convert_ms = _converted(convert, records, config)
    costs = {} if convert is None else {"read_ms": reading.seconds * 1000.0,
                                        "wait_ms": reading.waited_s * 1000.0,
                                        "convert_ms": convert_ms}
    candidate = BatchRange(
        planned.stream_key, planned.shard_id, planned.batch_ms, start, timestamp,
        records[-1].extended_sequence_number if records else None, len(records),
        reading.shard_end, reading.child_shard_ids, reading.iterator, reading.iterator_time,
        reading.millis_behind_latest, subscriber, **costs, ready_at=reading.ready_at)
    if not records and not reading.shard_end and not planned.record_empty:
        if reading.throttled or reading.faults:
            # Refused, not empty: this may be a retry of a computation that recorded its
            # range (under fan-out a retry's subscribe is refused for 5 s), which it must
            # read, not hand out nothing. One lookup, only for a refused empty read.
            stored = waiting_out_dynamodb(config, lambda: clients.ranges.get(
                planned.stream_key, planned.shard_id, planned.batch_ms), sleep)
            if stored is not None:
                return _read_recorded(clients, config, stored, sleep, True, convert)
        if reading.lost is not None:
            report_data_loss(config, reading.lost)
        return _report(candidate, reading, recorded=False, fresh=True, out=out)
    stored = waiting_out_dynamodb(config, lambda: clients.ranges.put_if_absent(candidate), sleep)
    if stored != candidate:
        log.info("%s batch %d: its range was recorded by an earlier computation; "
                 "reading that one", shard_name(config.stream_name, planned.shard_id),
                 planned.batch_ms)
        return _read_recorded(clients, config, stored, sleep, True, convert)
    if reading.lost is not None and stored is candidate:  # our write stands: we log it
        report_data_loss(config, reading.lost)
    return _report(stored, reading, recorded=True, fresh=True, out=out)


def read_shard_range(config: ConsumerConfig, planned: ShardRange, *, fresh: bool = True,
                     sleep: Callable[[float], None] = time.sleep,
                     convert: Convert = None) -> tuple[Any, ReadReport]:
    """The records of one (batch, shard) partition: the same ones every time it is computed
    (as ``convert`` makes them, if given: a new range then records what its read and the
    conversion cost).

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
                         planned.iterator, sleep, convert)
    stored = waiting_out_dynamodb(config, lambda: clients.ranges.get(
        planned.stream_key, planned.shard_id, planned.batch_ms), sleep)
    if stored is not None:
        return _read_recorded(clients, config, stored, sleep, fresh, convert)
    if not fresh:
        start, timestamp = planned.start or planned.floor, planned.start_timestamp
        empty = BatchRange(planned.stream_key, planned.shard_id, planned.batch_ms, start, timestamp)
        return _report(empty, Reading(), recorded=False, fresh=False,
                       out=_converted(convert, [], config)[0])
    if planned.start is not None:
        return _read_new(clients, config, planned, planned.start, planned.start_timestamp,
                         planned.iterator, sleep, convert)
    previous = waiting_out_dynamodb(config, lambda: clients.ranges.latest_before(
        planned.stream_key, planned.shard_id, planned.batch_ms, planned.since_ms), sleep)
    start, timestamp = start_after(previous, planned.floor, planned.floor_timestamp)
    if previous is not None and planned.subscriber is None:  # who holds it, if anyone
        planned = replace(planned, subscriber=previous.subscriber)
    if previous is not None and previous.shard_end:
        ended = BatchRange(planned.stream_key, planned.shard_id, planned.batch_ms, start,
                           timestamp, None, 0, True, previous.child_shard_ids)
        stored = waiting_out_dynamodb(config, lambda: clients.ranges.put_if_absent(ended), sleep)
        return _read_recorded(clients, config, stored, sleep, fresh, convert)
    return _read_new(clients, config, planned, start, timestamp, None, sleep, convert)
