"""The executors' subscription registry on its own, fed through the fake event stream of
test_fanout_unit: the position rule (go on, or reopen at the start), the records a task left
inside an event, a shard's end, and the idle close (no emulator, no Spark)."""
from __future__ import annotations

import threading
import time

import pytest

from test_fanout_unit import ARN, CONFIG, FakeKinesis, FakeStream, event, record
from waiting import wait_for

from kinesis_dstream.aws.kinesis import KinesisClient
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.records import GetRecordsResult
from kinesis_dstream.retrieval.fanout import FanOutRecordsPublisher
from kinesis_dstream.retrieval.subscriptions import (
    IN_FLIGHT_WAIT_S,
    HeldSource,
    SubscriptionRegistry,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

KEY = (ARN, "shardId-0")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def opener(fake: FakeKinesis):
    def open_publisher() -> FanOutRecordsPublisher:
        return FanOutRecordsPublisher(KinesisClient(CONFIG, client=fake), CONFIG,  # type: ignore[arg-type]
                                      "shardId-0", ARN)
    return open_publisher


def take(source: HeldSource, count: int, limit: int = 20) -> list[str]:
    """Read ``count`` records as a task with that record cap would."""
    seen: list = []
    for _ in range(limit):
        result = source.get_records()
        seen += result.records
        if len(seen) >= count or result.shard_end:
            break
    return [str(r.extended_sequence_number) for r in seen[:count]]


def test_a_task_that_starts_where_the_last_ended_goes_on_with_its_subscription():
    fake = FakeKinesis(FakeStream([event([record(1), record(2)], "2"),
                                   event([record(3)], "3")], endless=True))
    registry = SubscriptionRegistry(sweep=False)
    source = registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake))
    assert take(source, 2) == ["1/0", "2/0"]
    registry.checkin(source, ESN("2"))
    again = registry.checkout(KEY, ESN("2"), opener(fake))
    assert again is source
    assert take(again, 1) == ["3/0"]
    assert len(fake.calls) == 1  # one SubscribeToShard for both tasks
    assert (registry.opened, registry.continued, registry.reopened) == (1, 1, 0)
    registry.close_all()


def test_the_records_a_task_left_inside_an_event_go_to_the_next_task_first():
    fake = FakeKinesis(FakeStream([event([record(1), record(2), record(3)], "3"),
                                   event([record(4)], "4")], endless=True))
    registry = SubscriptionRegistry(sweep=False)
    source = registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake))
    assert take(source, 1) == ["1/0"]  # a record cap of 1 stops inside the first event
    registry.checkin(source, ESN("1"))
    source = registry.checkout(KEY, ESN("1"), opener(fake))
    assert take(source, 3) == ["2/0", "3/0", "4/0"]
    assert len(fake.calls) == 1
    registry.close_all()


def test_a_start_elsewhere_reopens_at_the_start_and_reads_nothing_before_it():
    """A recomputation, or a task after a lease came back: the held position is not the
    start, so the subscription is opened again AT the start (its record dropped)."""
    fake = FakeKinesis(FakeStream([event([record(1), record(2), record(3)], "3")], endless=True),
                       FakeStream([event([record(2), record(3)], "3")], endless=True))
    registry = SubscriptionRegistry(sweep=False)
    source = registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake))
    assert take(source, 3) == ["1/0", "2/0", "3/0"]
    registry.checkin(source, ESN("3"))
    again = registry.checkout(KEY, ESN("2"), opener(fake))
    assert take(again, 1) == ["3/0"]
    assert fake.calls[1]["StartingPosition"] == {"Type": "AT_SEQUENCE_NUMBER",
                                                 "SequenceNumber": "2"}
    assert (registry.opened, registry.continued, registry.reopened) == (1, 0, 1)
    registry.close_all()


def test_a_failed_task_leaves_nothing_held_and_its_retry_reopens_at_the_start():
    fake = FakeKinesis(FakeStream([event([record(1)], "1")], endless=True),
                       FakeStream([event([record(1)], "1")], endless=True))
    registry = SubscriptionRegistry(sweep=False)
    source = registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake))
    take(source, 1)
    registry.discard(source)
    assert registry.held() == {}
    retry = registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake))
    assert take(retry, 1) == ["1/0"]
    assert len(fake.calls) == 2
    registry.close_all()


def test_a_shard_read_to_its_end_is_closed_not_held():
    fake = FakeKinesis(FakeStream([event([record(1)], None, children=("shardId-1",))]))
    registry = SubscriptionRegistry(sweep=False)
    source = registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake))
    assert take(source, 5) == ["1/0"]
    registry.checkin(source, ESN("1"))
    assert registry.held() == {}


def test_a_source_no_task_checked_out_for_the_idle_time_is_closed():
    fake = FakeKinesis(FakeStream([], endless=True))
    clock = Clock()
    registry = SubscriptionRegistry(idle_close_s=30.0, clock=clock, sweep=False)
    source = registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake))
    take(source, 1, limit=2)
    stream = fake.calls and source.publisher._subscription.stream  # noqa: SLF001
    registry.checkin(source, ESN.TRIM_HORIZON)
    clock.now += 29.0
    assert registry.close_idle() == 0 and KEY in registry.held()
    clock.now += 1.0
    assert registry.close_idle() == 1
    assert registry.held() == {}
    assert stream.closed.is_set()  # the subscription was cancelled


def test_two_tasks_of_one_shard_at_once_hold_the_last_checked_in():
    fake = FakeKinesis(FakeStream([], endless=True), FakeStream([], endless=True))
    registry = SubscriptionRegistry(sweep=False)
    first = registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake))
    second = registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake))
    assert first is not second
    take(first, 1, limit=1), take(second, 1, limit=1)
    registry.checkin(first, ESN.TRIM_HORIZON)
    registry.checkin(second, ESN.TRIM_HORIZON)
    assert fake.answers == [] and registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake)) is second
    assert first.publisher._subscription is None  # noqa: SLF001 - closed
    registry.close_all()



def test_a_task_takes_what_its_flowing_subscription_pushed_and_waits_only_for_a_first_event():
    """An idle shard among a task's many must not hold the task for the source's wait every
    batch: once its subscription has pushed an event, the next task's first read takes what
    is queued and returns. A new subscription's first event is still waited for (here up to 30 s: the
    test's bound would fail if the idle read waited as long)."""
    up = threading.Event()
    fake = FakeKinesis(FakeStream([event([record(1)], "1")], ends_when=up))
    registry = SubscriptionRegistry(sweep=False)
    source = registry.checkout(KEY, ESN.TRIM_HORIZON, lambda: FanOutRecordsPublisher(
        KinesisClient(CONFIG, client=fake), CONFIG, "shardId-0", ARN, wait_s=30.0))  # type: ignore[arg-type]
    assert take(source, 1) == ["1/0"]  # the first event, waited for
    registry.checkin(source, ESN("1"))
    source = registry.checkout(KEY, ESN("1"), lambda: None)  # type: ignore[arg-type,return-value]
    began = time.monotonic()
    assert source.get_records().records == []  # nothing queued: at once, not in 30 s
    assert time.monotonic() - began < 10.0
    up.set()
    registry.close_all()


class RecordingPublisher:
    """Says how each read would wait: the caller's choice, not a timing."""

    def __init__(self, flowing: bool, millis_behind_latest: int | None,
                 arriving: bool = False) -> None:
        self.flowing, self.millis_behind_latest = flowing, millis_behind_latest
        self.arriving = arriving  # an event's bytes are in the socket, not yet queued
        self.waits: list[float | None] = []

    def get_records(self, wait_s: float | None = None) -> GetRecordsResult:
        self.waits.append(wait_s)
        return GetRecordsResult(millis_behind_latest=self.millis_behind_latest)


@pytest.mark.parametrize("flowing, behind, first, later", [
    (True, 0, 0.0, IN_FLIGHT_WAIT_S),  # at the tip: what is queued, at once; then what is
    (True, None, 0.0, IN_FLIGHT_WAIT_S),  # in flight behind it
    (True, 4000, None, None),  # behind its tip: the next event is coming; wait, not spin
    (False, 0, None, None),  # a new subscription: its first event
])
def test_how_long_a_task_waits_for_its_subscription(flowing, behind, first, later):
    """Only a task's first look at a flowing subscription at its tip skips the wait: a
    busy shard's events in flight behind the ones just taken are waited for (the shard
    may say 0 ms behind while they are on their way), and so is the next task's."""
    publisher = RecordingPublisher(flowing, behind)
    source = HeldSource(KEY, publisher)  # type: ignore[arg-type]
    source.get_records()
    source.get_records()
    source.hand_out_through(ESN("5"))  # the task is done; the next one looks
    source.get_records()
    assert publisher.waits == [first, later, first]


def test_a_first_look_that_finds_an_event_arriving_waits_for_it():
    """The first look at an idle subscription does not wait, unless an event's bytes have
    reached its socket and are not queued yet: then it waits the in-flight time for them
    (on a loaded machine the reader thread may queue them only after the look, and the
    records would go to the next batch)."""
    publisher = RecordingPublisher(True, 0, arriving=True)
    source = HeldSource(KEY, publisher)  # type: ignore[arg-type]
    source.get_records()
    assert publisher.waits == [0.0, IN_FLIGHT_WAIT_S]


def test_a_subscription_knows_when_bytes_wait_in_its_socket():
    """``arriving``: readable bytes on the socket under boto3's stream (urllib3's response
    connection), none once read or once the subscription is closed."""
    import os
    import socket
    from types import SimpleNamespace

    from kinesis_dstream.retrieval.fanout import _Subscription

    pusher, ours = socket.socketpair()
    try:
        stream = SimpleNamespace(_raw_stream=SimpleNamespace(_connection=SimpleNamespace(
            sock=ours)), close=lambda: None)
        subscription = _Subscription(1, stream)
        assert not subscription.arriving()
        pusher.sendall(b"event")
        assert subscription.arriving()
        ours.recv(16)
        assert not subscription.arriving()
        pusher.sendall(b"event")
        subscription.closed.set()
        assert not subscription.arriving()
        assert not _Subscription(2, SimpleNamespace()).arriving()  # no socket to look at
        # a process holding hundreds of subscriptions has sockets past select()'s fd 1024
        high = socket.socket(fileno=os.dup2(ours.fileno(), 1500))
        try:
            subscription = _Subscription(3, SimpleNamespace(_raw_stream=SimpleNamespace(
                _connection=SimpleNamespace(sock=high))))
            assert subscription.arriving()
        finally:
            high.detach()
            os.close(1500)
    finally:
        pusher.close()
        ours.close()


def test_a_pushed_read_at_the_tip_takes_the_next_events_and_says_so_once(monkeypatch):
    """A fresh range's read at the shard's tip under fan-out takes the events that follow
    within the push window (not a batch later), and tells its caller once, when it starts
    to wait, so the lease check runs meanwhile; a read that found nothing never tells.

    The windows are widened from their 30 ms: what is shown is that the read waits for the
    events behind the first, not how long (on a loaded machine the fake's reader thread may
    queue the second event later than 30 ms; CI saw it once)."""
    from dataclasses import replace

    from kinesis_dstream.retrieval import read_loop
    from kinesis_dstream.retrieval import subscriptions as held
    from kinesis_dstream.retrieval.read_loop import read
    from kinesis_dstream.retrieval.subscriptions import subscriptions

    monkeypatch.setattr(read_loop, "PUSH_TIP_S", 2.0)
    monkeypatch.setattr(held, "IN_FLIGHT_WAIT_S", 2.0)

    config = replace(CONFIG, consumer_arn=ARN)
    up = threading.Event()
    fake = FakeKinesis(FakeStream([event([record(1)], "1"), event([record(2)], "2")],
                                  ends_when=up))
    told: list[float] = []
    try:
        reading = read(KinesisClient(config, client=fake), config, "shardId-0",  # type: ignore[arg-type]
                       ESN.TRIM_HORIZON, None, time_budget_s=5.0,
                       at_tip_with_records=lambda: told.append(time.monotonic()))
        assert [r.sequence_number for r in reading.records] == ["1", "2"]
        assert len(told) == 1
        nothing = read(KinesisClient(config, client=fake), config, "shardId-0",  # type: ignore[arg-type]
                       ESN("2"), None, time_budget_s=5.0,
                       at_tip_with_records=lambda: told.append(time.monotonic()))
        assert nothing.records == [] and len(told) == 1
    finally:
        up.set()
        subscriptions().close_all()


def test_the_lease_check_runs_on_its_own_thread_once_started_and_raises_where_asked(
        monkeypatch):
    from kinesis_dstream.retrieval import shard_reader

    threads: list[threading.Thread] = []
    answers: list[bool | Exception] = [True, RuntimeError("DynamoDB down")]

    def lease_moved(clients, planned) -> bool:
        threads.append(threading.current_thread())
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(shard_reader, "_lease_moved", lease_moved)

    class Planned:
        owner, shard_id = "worker-1", "shardId-0"

    started = shard_reader._LeaseCheck(None, Planned())  # type: ignore[arg-type]
    started.start()
    assert started.moved() is True
    assert threads[-1] is not threading.current_thread()
    failing = shard_reader._LeaseCheck(None, Planned())  # type: ignore[arg-type]
    failing.start()
    with pytest.raises(RuntimeError, match="DynamoDB down"):
        failing.moved()
    answers.append(False)
    asked_at_the_end = shard_reader._LeaseCheck(None, Planned())  # type: ignore[arg-type]
    assert asked_at_the_end.moved() is False
    assert threads[-1] is threading.current_thread()


def test_the_sweeper_thread_ends_when_nothing_is_held_and_the_next_checkin_starts_another():
    fake = FakeKinesis(FakeStream([event([record(1), record(2)], "2")], endless=True))
    registry = SubscriptionRegistry(idle_close_s=1.0)
    source = registry.checkout(KEY, ESN.TRIM_HORIZON, opener(fake))
    assert take(source, 2) == ["1/0", "2/0"]
    registry.checkin(source, ESN("2"))
    first = registry._sweeper
    assert first is not None and first.is_alive()
    wait_for(lambda: not first.is_alive(), 10, "the sweeper ending once the idle source closed")
    assert registry.held() == {} and registry._sweeper is None
    again = registry.checkout(KEY, ESN("2"), opener(fake))
    registry.checkin(again, ESN("2"))
    second = registry._sweeper
    assert second is not None and second is not first and second.is_alive()
    registry.close_all()
    wait_for(lambda: not second.is_alive(), 10, "the second sweeper ending")


def test_a_task_takes_the_records_behind_the_heartbeats_queued_since_the_last_task():
    """Kinesis pushes an empty event (a heartbeat) at least every 5 s to an idle
    subscription; a task comes once a batch, so with batches longer than that, heartbeats
    queue between two tasks. A task at the tip must read past all those queued, not take
    one event a batch: with 5 s batches and 1 s heartbeats the queue grew by four a batch,
    the records put behind it reached a task later and later, and once it held 1,000
    events the subscription stopped (a fan-out DStream read nothing more, test_pauses)."""
    from dataclasses import replace

    from kinesis_dstream.retrieval.read_loop import read
    from kinesis_dstream.retrieval.subscriptions import subscriptions

    class Pushes(FakeStream):
        """A heartbeat, then (once ``more`` is set) 60 more, a record, 3 more."""

        def __iter__(self):
            yield event([], "0")
            assert more.wait(30)
            yield from [event([], "0") for _ in range(60)]
            yield event([record(1)], "1")
            yield from [event([], "1") for _ in range(3)]
            assert up.wait(30)

    config = replace(CONFIG, consumer_arn=ARN)
    more, up = threading.Event(), threading.Event()
    kinesis = KinesisClient(config, client=FakeKinesis(Pushes([])))  # type: ignore[arg-type]
    try:
        first = read(kinesis, config, "shardId-0", ESN.TRIM_HORIZON, None, time_budget_s=5.0)
        assert first.records == []  # the first event: a heartbeat
        more.set()
        held = subscriptions()._held[(ARN, "shardId-0")].source.publisher
        wait_for(lambda: held._subscription is not None
                 and len(held._subscription.events) == 64, 10, "the events queued")
        second = read(kinesis, config, "shardId-0", ESN.TRIM_HORIZON, None, time_budget_s=5.0)
        assert [r.sequence_number for r in second.records] == ["1"]
        assert len(held._subscription.events) == 0  # the heartbeats behind it, taken too
    finally:
        up.set()
        subscriptions().close_all()


def test_a_task_at_the_tip_takes_every_event_buffered_however_long_its_window(monkeypatch):
    """The push window at the tip (``PUSH_TIP_S``) bounds the wait for events in flight,
    not the taking of those already buffered: on a loaded machine taking a batch's events
    may outlast it, and the rest would fall one batch behind, every batch. Here the window
    is 0 (already over at the first event): the read still takes all 50 buffered."""
    from dataclasses import replace

    from kinesis_dstream.retrieval import read_loop
    from kinesis_dstream.retrieval.read_loop import read
    from kinesis_dstream.retrieval.subscriptions import subscriptions

    monkeypatch.setattr(read_loop, "PUSH_TIP_S", 0.0)
    config = replace(CONFIG, consumer_arn=ARN)
    more, up = threading.Event(), threading.Event()

    class Pushes(FakeStream):
        def __iter__(self):
            yield event([], "0")
            assert more.wait(30)
            yield from [event([record(n)], str(n)) for n in range(1, 51)]
            assert up.wait(30)

    kinesis = KinesisClient(config, client=FakeKinesis(Pushes([])))  # type: ignore[arg-type]
    try:
        assert read(kinesis, config, "shardId-0", ESN.TRIM_HORIZON, None,
                    time_budget_s=5.0).records == []
        more.set()
        held = subscriptions()._held[(ARN, "shardId-0")].source.publisher
        wait_for(lambda: held._subscription is not None
                 and len(held._subscription.events) == 50, 10, "the events queued")
        reading = read(kinesis, config, "shardId-0", ESN.TRIM_HORIZON, None, time_budget_s=5.0)
        assert [r.sequence_number for r in reading.records] == [str(n) for n in range(1, 51)]
    finally:
        up.set()
        subscriptions().close_all()
