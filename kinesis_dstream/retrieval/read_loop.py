"""The executors' read loop: one shard from a start, for a new range or a recorded one.

A new range reads until a record cap, the shard's end, its tip or a time budget, and keeps
the iterator it ends with when it ended at a page boundary, so that the next batch's read
goes on with it (no GetShardIterator while a shard is read batch after batch, as a KCL shard
consumer keeps its iterator for the life of its lease). A recorded range reads exactly
through its end.

Throttling and an endpoint that does not answer never fail a new range: it keeps what it
read, or reads nothing, and the next batch goes on from there. A new range refused before
its first record waits one throttle pause at most, then hands out nothing, so a task does
not hold its executor core for seconds while the next batch could read the shard as well.
A recorded range must be read in full: its reads wait faults out, up to a patience. The
``Pacer`` makes every wait; every refusal is counted for the read's report.

Under enhanced fan-out a new range reads from the shard's subscription held in this process
between tasks (``subscriptions``), and hands it back with the position it read through; a
recorded range is read by GetRecords (rare, and exactly its records).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from ..aws.kinesis import KinesisClient
from ..config import ConsumerConfig
from ..errors import KinesisDStreamError
from ..records import AT_TIMESTAMP, ExtendedSequenceNumber, Record
from ..retry import Backoff, Deadline, is_transient
from .data_loss import TrimmedRange
from .executor_process import fault_log
from .fanout import FanOutRecordsPublisher
from .fetch_pace import FetchPace, ShardBudget
from .model import shard_name
from .pacer import Pacer
from .polling import KinesisDataFetcher
from .prefetch import PageAhead, prefetches
from .source import RecordSource, open_source
from .subscriptions import HeldSource, subscriptions

# A recorded range must be read whole: its reads wait a throttled or unreachable Kinesis out
# for up to this long before the task fails (and Spark retries it).
EXACT_READ_PATIENCE_S = 600.0
# A new range refused before its first record waits for at most this long in all (one
# ``throttle_wait_s`` pause), then hands out nothing: the next batch tries again.
NEW_READ_THROTTLE_PATIENCE_S = 1.0
# A pushed event at the tip (MillisBehindLatest 0) may be one of several already buffered: a
# new range under fan-out takes what its subscription buffered since the last task, and the
# events that follow (``subscriptions.IN_FLIGHT_WAIT_S`` apart at most), for this long at
# most: the events in flight when the read began are in it, while a shard pushed to all the
# time cannot hold its task. Longer buys no latency: a record the window takes in would
# otherwise be in the next batch, but every batch ends later by the window (0.1 s made the
# wide benchmark's batches 50-100 ms longer, docs/benchmarks.md).
PUSH_TIP_S = 0.03


@dataclass
class Reading:
    """What one read of one shard found, and what it cost."""

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
    more_left: bool = False  # stopped at the time budget, the record cap or the byte cap
    bytes_read: int = 0
    waited_s: float = 0.0  # slept between calls: throttle pauses, backoffs and pacing
    first_seen: str | None = None  # a recorded range's read: the first record Kinesis gave
    # Epoch s when the shard is expected to serve its next GetRecords (a new polling range's
    # pages spent its 2 MiB/s ahead until then; 0.0: at once). See ``fetch_pace.ShardBudget``.
    ready_at: float = 0.0
    # The process that made this reading reads the shard's next page ahead (``prefetch``).
    ahead: bool = False


def read(kinesis: KinesisClient, config: ConsumerConfig, shard_id: str,
         start: ExtendedSequenceNumber, timestamp: float | None, *,
         end: ExtendedSequenceNumber | None = None, iterator: str | None = None,
         max_records: int = 0, time_budget_s: float = 0.0, max_bytes: int = 0,
         pace: FetchPace | None = None, not_before: float = 0.0,
         sleep: Callable[[float], None] = time.sleep,
         at_tip_with_records: Callable[[], None] | None = None,
         ahead: str | None = None, ahead_records: int = 0) -> Reading:
    """From ``start`` (exclusive), either exactly through ``end`` (a recorded range), or until
    ``max_records``, ``max_bytes`` (reached, not bounded: a page is kept whole), the shard's
    end, its tip or ``time_budget_s`` (a new range). ``pace`` spaces the GetRecords calls; a
    new range whose next call would wait past its time budget stops there. A new polling
    range's GetRecords asks for no more records than its cap (a page beyond it would spend the
    shard's 2 MiB/s on records the next batch reads again). A new polling range makes no call
    before ``not_before`` (epoch s: the previous reading's ``ready_at``), and none at all when
    that is past its time budget. ``at_tip_with_records`` is
    called once when a pushed read has records at the tip and waits for the events that
    follow (the caller's lease check runs meanwhile). ``ahead`` (a new polling range's
    stream key) takes the page this process read ahead after ``start``, if any, and reads
    the next one ahead, of ``ahead_records`` at most (else the config's page), when this
    reading leaves the shard on a backlog (``prefetch``)."""
    exact = end is not None
    # A page read ahead for the next reading asks for this many records.
    page_limit = min(config.max_records, ahead_records or config.max_records)
    if max_records and not exact and max_records < config.max_records and \
            config.retrieval_mode != "FANOUT":
        config = replace(config, max_records=max_records)
    reading = Reading()
    began = last_call = time.monotonic()
    counting_bytes = bool(max_bytes) or (pace is not None and pace.max_bytes_per_s > 0)
    pacer = Pacer(Backoff(base_ms=config.retry_wait_time_ms),
                  fault_log(f"{config.stream_name}/{shard_id}",
                            f"reading {shard_name(config.stream_name, shard_id)}"),
                  deadline=Deadline(EXACT_READ_PATIENCE_S if exact else time_budget_s),
                  throttle_patience_s=None if exact else NEW_READ_THROTTLE_PATIENCE_S)
    source: RecordSource | None = None
    held: HeldSource | None = None
    aligned = True
    rest: list[Record] = []  # a reading cut inside a page: the page's records after the cut
    served_at, page_bytes = 0.0, 0  # the last page's: when it was served, its data
    done = False
    told = False  # at_tip_with_records was called
    polling_new = not exact and config.retrieval_mode != "FANOUT"
    page: PageAhead | None = None
    if ahead is not None and polling_new:
        page = prefetches().take((ahead, shard_id), start, time_budget_s)
        if page is not None and page.failed:
            # Refused ahead: the shard's budget is spent for now, so the first call waits.
            not_before, page = max(not_before, page.retry_at), None
    budget = ShardBudget(empty_at=not_before) if polling_new else None
    try:
        if page is not None and not page.done.is_set():
            # Read ahead here, due after this reading's time: the next reading takes it.
            reading.more_left, reading.ready_at, reading.ahead = True, page.due_at, True
            done = True
            return reading
        if page is not None:
            source, budget, not_before = page.fetcher, page.budget, 0.0
            page.fetcher.limit = config.max_records
        early = not_before - time.time() if budget is not None else 0.0
        if early > 0 and pacer.deadline is not None and early > pacer.deadline.remaining_s():
            # The shard would refuse every call this reading may make: leave it to the next.
            reading.more_left, reading.ready_at = True, not_before
            done = True
            return reading
        if early > 0:
            sleep(early)
            reading.waited_s += early
        while True:
            try:
                if source is None and not exact and config.retrieval_mode == "FANOUT" \
                        and config.consumer_arn is not None:
                    source = held = _checkout(kinesis, config, shard_id, start, timestamp)
                if source is None:  # GetShardIterator meets an outage as a page would
                    source = open_source(
                        kinesis, config, shard_id,
                        start_timestamp=timestamp if start.sequence_number == AT_TIMESTAMP
                        else None)
                    if iterator is not None:
                        source.resume(start, iterator)
                    else:
                        source.initialize(start)
                if budget is not None and reading.records and budget.ready_at > time.time():
                    # The shard would refuse the call: the next reading waits for it instead.
                    reading.more_left = True
                    break
                spent = False  # the page's bytes were counted by the reading before
                if page is not None and page.result is not None:  # its first page came ahead
                    result, served_at, spent = page.result, page.served_at, page.spent
                    page.result = None
                    if not spent:
                        reading.calls += 1
                        reading.seconds += page.seconds
                else:
                    # GetRecords calls are paced; a subscription's pushed events are not
                    # calls (fetchIntervalMs and the like would space each event's take).
                    if pace is not None and pace.paces and reading.calls and not source.pushes:
                        hold = pace.wait_s(began=began, bytes_read=reading.bytes_read,
                                           last_call=last_call, now=time.monotonic())
                        if not exact and pacer.deadline is not None and \
                                hold > pacer.deadline.remaining_s():
                            reading.more_left = True
                            break
                        if hold > 0:
                            sleep(hold)
                            reading.waited_s += hold
                    last_call = time.monotonic()
                    called = time.perf_counter()
                    try:
                        result = source.get_records()
                    finally:
                        reading.calls += 1
                        reading.seconds += time.perf_counter() - called
                    served_at = time.time()
                reading.served += not spent
            except KinesisDStreamError as exc:
                if not is_transient(exc):
                    raise
                # A new range that has records keeps them; the next batch goes on from there.
                wait = pacer.pause(exc, stop=not exact and bool(reading.records))
                if wait is None:
                    if exact:
                        raise
                    break
                sleep(wait)
                reading.waited_s += wait
                continue
            pacer.succeeded()
            reading.millis_behind_latest = result.millis_behind_latest
            if counting_bytes or budget is not None:  # a per-record sum: not under fan-out
                page_bytes = sum(len(r.binary_data) for r in result.records)
                reading.bytes_read += page_bytes
                if budget is not None and not spent:
                    budget.served(served_at, page_bytes)
            if exact:
                assert end is not None
                aligned = False  # a recorded range's read hands no iterator on
                if reading.first_seen is None and result.records:
                    reading.first_seen = result.records[0].sequence_number
                kept = [r for r in result.records if r.extended_sequence_number <= end]
                reading.records.extend(kept)
                if reading.records and reading.records[-1].extended_sequence_number >= end:
                    break
                if len(kept) < len(result.records) or result.shard_end \
                        or result.at_tip(config.max_records):
                    # Past the recorded end, at the tip or at the shard's end without the
                    # end's record: the shard no longer holds it (retention trimmed it).
                    # The caller finds fewer records than the range recorded.
                    break
                continue
            reading.records.extend(result.records)
            if max_records and len(reading.records) >= max_records:
                aligned = len(reading.records) == max_records
                rest = reading.records[max_records:]
                del reading.records[max_records:]
                reading.more_left = True
                break
            if result.shard_end:
                reading.shard_end, reading.child_shard_ids = True, tuple(result.child_shard_ids)
                break
            if result.at_tip(config.max_records):
                # At a pushed tip the window waits for the events in flight; what is
                # buffered already is taken however long the window took (on a loaded
                # machine taking a batch's events may outlast it, and the rest would fall
                # one batch behind, every batch).
                if not source.pushes or not result.records or (
                        time.monotonic() - began >= PUSH_TIP_S
                        and not (held is not None and held.queued)):
                    break
                if not told and at_tip_with_records is not None:
                    told = True
                    at_tip_with_records()
            if max_bytes and reading.bytes_read >= max_bytes:
                reading.more_left = True
                break
            if pacer.deadline is not None and pacer.deadline.expired:
                reading.more_left = True
                break
        if budget is not None:
            reading.ready_at = budget.ready_at
        if source is not None:
            reading.shard_iterator_calls = source.shard_iterator_calls
            reading.lost = source.data_lost
            if aligned and not reading.shard_end and source.iterator is not None \
                    and reading.calls:
                reading.iterator, reading.iterator_time = source.iterator, time.time()
        if ahead is not None and budget is not None and reading.more_left \
                and isinstance(source, KinesisDataFetcher):
            # On a backlog: what is left of the last page is kept here for the next reading,
            # or the shard's next page is read here once its budget allows.
            after = reading.records[-1].extended_sequence_number if reading.records else start
            source.limit = page_limit
            if rest:
                reading.ahead = prefetches().hold((ahead, shard_id), after, source, budget,
                                                  replace(result, records=rest,
                                                          kinesis_records=len(rest)))
            elif aligned and not reading.shard_end and source.iterator is not None:
                reading.ahead = prefetches().fetch_after(
                    (ahead, shard_id), after, source, budget,
                    pace.next_call_at(served_at, page_bytes) if pace is not None else 0.0)
        done = True
    finally:
        reading.throttled, reading.faults = pacer.throttled, pacer.faults
        if held is not None and done:
            subscriptions().checkin(held, reading.records[-1].extended_sequence_number
                                    if reading.records else start)
        elif held is not None:
            subscriptions().discard(held)
        elif source is not None and not reading.ahead:
            source.close()
    return reading


def _checkout(kinesis: KinesisClient, config: ConsumerConfig, shard_id: str,
              start: ExtendedSequenceNumber, timestamp: float | None) -> HeldSource:
    """The shard's subscription held in this process, reading after ``start``."""
    arn = config.consumer_arn
    assert arn is not None
    stamp = timestamp if start.sequence_number == AT_TIMESTAMP else None
    return subscriptions().checkout(
        (arn, shard_id), start,
        lambda: FanOutRecordsPublisher(kinesis, config, shard_id, arn, start_timestamp=stamp))
