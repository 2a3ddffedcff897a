"""The retrieval package's rules on their own: the pacer, the record source the read loop
goes through, and a refused start told apart by its error code (no emulator, no clock)."""
from __future__ import annotations

import logging
from typing import Any

import pytest

from kinesis_dstream.aws.clients import error_for_code
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import ConfigurationError, ThrottlingError, TransientServiceError
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.records import GetRecordsResult, Record
from kinesis_dstream.retrieval import KinesisDataFetcher, Pacer, read_loop
from kinesis_dstream.retrieval import pacer as pacer_module
from kinesis_dstream.retry import Backoff, Deadline, FaultLog

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

log = logging.getLogger(__name__)
CONFIG = ConsumerConfig(application_name="retrieval-unit", stream_name="s",
                        region_name="us-east-1", aws_access_key_id="AKIDEXAMPLE",
                        aws_secret_key="secret", kinesis_endpoint="http://127.0.0.1:9")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pacer(clock: Clock | None = None, timeout_s: float | None = None,
          patience_s: float | None = None) -> Pacer:
    deadline = None if timeout_s is None else Deadline(timeout_s, clock or Clock())
    return Pacer(Backoff(base_ms=100, rand=lambda: 1.0), FaultLog(log, "reading"),
                 deadline=deadline, throttle_patience_s=patience_s)


@pytest.fixture
def throttle_pause(monkeypatch) -> float:
    monkeypatch.setattr(pacer_module, "throttle_wait_s", lambda: 0.6)
    return 0.6


def test_a_throttle_waits_the_throttle_pause_and_other_faults_back_off(throttle_pause):
    p = pacer()
    assert p.pause(ThrottlingError("slow down")) == throttle_pause
    assert p.pause(TransientServiceError("500")) == 0.1
    assert p.pause(TransientServiceError("500")) == 0.2  # doubling while the fault lasts
    assert p.pause(ThrottlingError("slow down")) == throttle_pause
    p.succeeded()
    assert p.pause(TransientServiceError("500")) == 0.1  # a success starts the backoff again
    assert (p.throttled, p.faults) == (2, 3)


def test_no_wait_runs_past_the_deadline_and_a_fault_after_it_stops_the_loop(throttle_pause):
    clock = Clock()
    p = pacer(clock, timeout_s=1.0)
    clock.now = 0.7
    assert p.pause(ThrottlingError("slow down")) == pytest.approx(0.3)
    clock.now = 1.0
    assert p.pause(ThrottlingError("slow down")) is None
    assert p.throttled == 2  # counted all the same


def test_throttle_patience_and_a_stop_end_the_waits(throttle_pause):
    p = pacer(patience_s=1.0)
    assert p.pause(ThrottlingError("slow down")) == throttle_pause
    assert p.pause(ThrottlingError("slow down")) is None  # 1.2 s would pass the patience
    assert p.pause(TransientServiceError("500")) == 0.1  # patience is for throttles only
    assert p.pause(TransientServiceError("500"), stop=True) is None
    assert (p.throttled, p.faults) == (2, 2)


class PushLike:
    """A record source that is not polling: no iterator, no GetShardIterator; first
    refused for throughput, then two records and the shard's end."""

    pushes = True

    def __init__(self, answers: list[Any]) -> None:
        self.shard_id = "shardId-0"
        self.shard_iterator_calls = 0
        self.data_lost = None
        self.iterator = None
        self.started: ESN | None = None
        self.closed = False
        self._answers = answers

    def initialize(self, checkpoint: ESN) -> None:
        self.started = checkpoint

    def resume(self, start: ESN, iterator: str) -> None:
        raise AssertionError("no iterator was handed out")

    def get_records(self) -> GetRecordsResult:
        answer = self._answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True


def record(sequence_number: str) -> Record:
    return Record(b"x", "k", sequence_number, shard_id="shardId-0")


def test_the_read_loop_reads_any_record_source_and_paces_it(monkeypatch, throttle_pause):
    source = PushLike([ThrottlingError("slow down"),
                       GetRecordsResult([record("5"), record("6")], 1000),
                       GetRecordsResult([], 0, shard_end=True, child_shard_ids=["shardId-1"])])
    monkeypatch.setattr(read_loop, "open_source", lambda *a, **k: source)
    slept: list[float] = []
    reading = read_loop.read(None, CONFIG, "shardId-0", ESN("4"), None, max_records=10,
                             time_budget_s=30.0, sleep=slept.append)  # type: ignore[arg-type]
    assert source.started == ESN("4") and source.closed
    assert [r.sequence_number for r in reading.records] == ["5", "6"]
    assert reading.shard_end and reading.child_shard_ids == ("shardId-1",)
    assert slept == [throttle_pause] and reading.throttled == 1
    assert reading.iterator is None and reading.shard_iterator_calls == 0


def test_a_new_range_refused_before_its_first_record_hands_out_nothing(monkeypatch,
                                                                       throttle_pause):
    source = PushLike([ThrottlingError("slow down")] * 5)
    monkeypatch.setattr(read_loop, "open_source", lambda *a, **k: source)
    slept: list[float] = []
    reading = read_loop.read(None, CONFIG, "shardId-0", ESN("4"), None, max_records=10,
                             time_budget_s=30.0, sleep=slept.append)  # type: ignore[arg-type]
    assert reading.records == [] and slept == [throttle_pause] and reading.throttled == 2


class RefusingKinesis:
    """Refuses AT_SEQUENCE_NUMBER with ``error``; TRIM_HORIZON holds ``held``."""

    def __init__(self, error: Exception, held: list[str]) -> None:
        self.error = error
        self.held = held

    def get_shard_iterator(self, shard_id: str, iterator_type: str, **kwargs: Any) -> str:
        if iterator_type == "AT_SEQUENCE_NUMBER":
            raise self.error
        return "it-0"

    def get_records(self, iterator: str, limit: int, *, shard_id: str = "") -> dict:
        return {"Records": [{"Data": b"x", "PartitionKey": "k", "SequenceNumber": s}
                            for s in self.held],
                "NextShardIterator": "it-1", "MillisBehindLatest": 0}


def refusal(message: str) -> ConfigurationError:
    error = error_for_code("InvalidArgumentException", message)
    assert isinstance(error, ConfigurationError) and error.code == "InvalidArgumentException"
    return error


def test_a_refused_start_older_than_what_the_shard_holds_was_trimmed():
    kinesis = RefusingKinesis(refusal("whatever Kinesis says"), held=["7", "8"])
    fetcher = KinesisDataFetcher(kinesis, CONFIG, "shardId-0")  # type: ignore[arg-type]
    fetcher.initialize(ESN("4"))
    assert [r.sequence_number for r in fetcher.get_records().records] == ["7", "8"]
    assert fetcher.data_lost is not None and fetcher.data_lost.first == "7"


def test_a_refused_start_the_shard_still_holds_is_raised_as_it_came():
    """The refusal's text is not read: Kinesis holding the start says it was not trimmed
    (a sequence number of another shard, say)."""
    error = refusal("StartingSequenceNumber 4 used in GetShardIterator is invalid")
    kinesis = RefusingKinesis(error, held=["2", "4", "8"])
    fetcher = KinesisDataFetcher(kinesis, CONFIG, "shardId-0")  # type: ignore[arg-type]
    fetcher.initialize(ESN("4"))
    with pytest.raises(ConfigurationError) as raised:
        fetcher.get_records()
    assert raised.value is error and fetcher.data_lost is None


def test_another_error_of_the_same_class_is_not_taken_for_a_refused_start():
    error = error_for_code("ValidationException", "StartingSequenceNumber is invalid")
    fetcher = KinesisDataFetcher(RefusingKinesis(error, held=["7"]),  # type: ignore[arg-type]
                                 CONFIG, "shardId-0")
    with pytest.raises(ConfigurationError) as raised:
        fetcher.initialize(ESN("4"))
    assert raised.value is error


def test_a_new_range_asks_for_no_more_records_than_its_cap_and_counts_its_waits(
        monkeypatch, throttle_pause):
    """A GetRecords page beyond the cap would spend the shard's 2 MiB/s on records the next
    batch reads again (a 10 MB page puts a shard 4 s into debt)."""
    source = PushLike([ThrottlingError("slow down"),
                       GetRecordsResult([record(str(i)) for i in range(5, 15)], 1000)])
    asked: list[int] = []
    monkeypatch.setattr(read_loop, "open_source",
                        lambda kinesis, config, *a, **k: asked.append(config.max_records) or source)
    slept: list[float] = []
    reading = read_loop.read(None, CONFIG, "shardId-0", ESN("4"), None, max_records=10,
                             time_budget_s=30.0, sleep=slept.append)  # type: ignore[arg-type]
    assert asked == [10] and CONFIG.max_records > 10
    assert len(reading.records) == 10 and reading.more_left
    assert reading.waited_s == pytest.approx(throttle_pause) and slept == [throttle_pause]


# -- the shard's read budget: when the next read is served (fetch_pace.ShardBudget) -----------
MiB = 1024 * 1024


def test_a_page_beyond_a_seconds_worth_puts_the_shard_in_debt_until_it_is_paid():
    from kinesis_dstream.retrieval.fetch_pace import ShardBudget

    budget = ShardBudget()
    budget.served(100.0, 1 * MiB)  # within the second's burst: served again at once
    assert budget.ready_at == 0.0
    budget.served(100.5, 7 * MiB)  # refilled to 2 MiB, then 5 MiB in debt: 2.5 s
    assert budget.ready_at == pytest.approx(103.0)
    later = ShardBudget()
    later.served(200.0, 2 * MiB)  # exactly the burst: ready as it refills
    later.served(203.0, 6 * MiB)  # 3 s refilled a full bucket only: 4 MiB due, 2 s
    assert later.ready_at == pytest.approx(205.0)
    # A reading that waited for the previous one's debt finds the bucket empty, not full:
    after_debt = ShardBudget(empty_at=300.0)
    after_debt.served(300.5, 3 * MiB)  # 0.5 s refilled 1 MiB: 2 MiB due, 1 s
    assert after_debt.ready_at == pytest.approx(301.5)


class PagedSource(PushLike):
    """A polling-like source (it does not push) whose pages are given."""

    pushes = False


def big_record(sequence_number: str, size: int) -> Record:
    return Record(b"x" * size, "k", sequence_number, shard_id="shardId-0")


def read_pages(monkeypatch, answers: list[Any], **bounds: Any
               ) -> tuple[read_loop.Reading, list[float], PagedSource]:
    """A new range over a source answering ``answers``: the reading, its sleeps, the source."""
    source = PagedSource(answers)
    monkeypatch.setattr(read_loop, "open_source", lambda *a, **k: source)
    slept: list[float] = []
    reading = read_loop.read(None, CONFIG, "shardId-0", ESN("4"), None, time_budget_s=5.0,
                             sleep=slept.append, **bounds)  # type: ignore[arg-type]
    return reading, slept, source


def test_a_new_range_waits_for_its_shards_ready_time_then_says_its_own(monkeypatch):
    """The previous reading left the shard in debt until ``not_before``: the first call waits
    for it (within the time budget), and the reading hands on when its own pages are paid."""
    import time

    reading, slept, _ = read_pages(
        monkeypatch, [GetRecordsResult([big_record("5", 4 * MiB)], 1000),
                      GetRecordsResult([], 0, shard_end=True)],
        max_records=1, not_before=time.time() + 2.0)
    assert len(slept) == 1 and 1.5 < slept[0] <= 2.0 and reading.waited_s == slept[0]
    assert [r.sequence_number for r in reading.records] == ["5"] and reading.throttled == 0
    # its 4 MiB page, served as the shard's bucket was empty (the debt just paid): 2 s
    assert time.time() + 1.5 < reading.ready_at <= time.time() + 2.0


def test_a_new_range_whose_shard_is_in_debt_past_its_time_budget_makes_no_call(monkeypatch):
    import time

    not_before = time.time() + 10.0
    reading, slept, source = read_pages(monkeypatch, [AssertionError("no call may be made")],
                                        max_records=10, not_before=not_before)
    assert reading.records == [] and reading.calls == 0 and slept == []
    assert reading.more_left and reading.ready_at == not_before and source.started is None


def test_a_new_range_with_records_stops_before_a_call_its_shard_would_refuse(monkeypatch):
    """After a page that spent the shard's budget ahead, a reading that has records hands
    them out rather than call and be refused (the next reading waits for ``ready_at``)."""
    reading, _, _ = read_pages(monkeypatch, [GetRecordsResult([big_record("5", 5 * MiB)], 1000),
                                             AssertionError("the shard would refuse this call")],
                               max_records=10)
    assert [r.sequence_number for r in reading.records] == ["5"]
    assert reading.calls == 1 and reading.throttled == 0 and reading.more_left
    assert reading.ready_at > 0


def test_pushed_events_are_taken_unpaced_where_getrecords_calls_are_paced(monkeypatch):
    """fetchIntervalMs (200 ms by default) and minFetchPeriod space a reading's GetRecords
    calls; a subscription's events, already pushed, are taken without waiting between them
    (a restarted fan-out query catching up would otherwise wait 0.2 s an event)."""
    from kinesis_dstream.retrieval.fetch_pace import FetchPace

    events = [GetRecordsResult([record(str(i))], 1000) for i in range(5, 10)]
    pushed = PushLike([*events, GetRecordsResult([], 0, shard_end=True)])
    monkeypatch.setattr(read_loop, "open_source", lambda *a, **k: pushed)
    slept: list[float] = []
    reading = read_loop.read(None, CONFIG, "shardId-0", ESN("4"), None, max_records=100,
                             time_budget_s=30.0, sleep=slept.append,  # type: ignore[arg-type]
                             pace=FetchPace(0.0, 0.2))
    assert len(reading.records) == 5 and slept == []
    polled = PagedSource([GetRecordsResult([record("5")], 1000),
                          GetRecordsResult([record("6")], 1000),
                          GetRecordsResult([], 0, shard_end=True)])
    monkeypatch.setattr(read_loop, "open_source", lambda *a, **k: polled)
    reading = read_loop.read(None, CONFIG, "shardId-0", ESN("4"), None, max_records=100,
                             time_budget_s=30.0, sleep=slept.append,  # type: ignore[arg-type]
                             pace=FetchPace(0.0, 0.2))
    assert len(reading.records) == 2 and len(slept) == 2 and all(0 < s <= 0.2 for s in slept)
