"""The push record source's rules on their own, fed through a fake of boto3's event stream:
where each subscription starts, the records dropped at a checkpoint, the shard's end, the
errors handed to the caller's pacer, and the bounded buffer (no emulator)."""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Iterator

import botocore.exceptions
import pytest

from waiting import wait_for

from kinesis_dstream.aws.kinesis import KinesisClient
from kinesis_dstream.aws.kpl import Aggregate
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import (
    ConsumerRegistrationError,
    ThrottlingError,
    TransientServiceError,
)
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.retrieval import fanout, open_source
from kinesis_dstream.retrieval.fanout import (
    BUFFER_BYTES,
    BUFFER_EVENTS,
    EventBuffer,
    FanOutRecordsPublisher,
)
from kinesis_dstream.retry import is_throttling

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

CONFIG = ConsumerConfig(application_name="fanout-unit", stream_name="s", region_name="us-east-1",
                        aws_access_key_id="AKIDEXAMPLE", aws_secret_key="secret",
                        kinesis_endpoint="http://127.0.0.1:9", retrieval_mode="FANOUT")
ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/fanout-unit:1"


def record(seq: int, data: bytes = b"x") -> dict:
    return {"SequenceNumber": str(seq), "Data": data, "PartitionKey": "k",
            "ApproximateArrivalTimestamp": 1700000000.0}


def event(records: list[dict], continuation: str | None, behind: int = 0,
          children: tuple[str, ...] = ()) -> dict:
    body: dict[str, Any] = {"Records": records, "MillisBehindLatest": behind,
                            "ContinuationSequenceNumber": continuation}
    if children:
        body["ChildShards"] = [{"ShardId": c, "ParentShards": ["shardId-0"],
                                "HashKeyRange": {}} for c in children]
    return {"SubscribeToShardEvent": body}


def client_error(code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": code}},
                                           "SubscribeToShard")


class FakeStream:
    """boto3's EventStream: iterates events, then ends (or raises ``error``)."""

    def __init__(self, events: list[dict], error: Exception | None = None,
                 endless: bool = False, ends_when: threading.Event | None = None,
                 endless_data: bytes = b"") -> None:
        self.events = events
        self.error = error
        self.endless = endless
        self.endless_data = endless_data  # each endless event: one record of this data
        self.ends_when = ends_when  # its events given, it ends only once this is set
        self.pulled = 0
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[dict]:
        self.reader = threading.current_thread()
        for item in self.events:
            self.pulled += 1
            yield item
        if self.ends_when is not None:
            assert self.ends_when.wait(30)
        while self.endless and not self.closed.is_set():
            self.pulled += 1
            records = [record(1000 + self.pulled, self.endless_data)] if self.endless_data else []
            yield event(records, str(1000 + self.pulled))
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.closed.set()


class FakeKinesis:
    """A boto3 client whose subscribe_to_shard answers from a script, recording the calls."""

    meta = None

    def __init__(self, *answers: FakeStream | Exception, consumer: str | None = "ACTIVE") -> None:
        self.answers = list(answers)
        self.calls: list[dict] = []
        self.threads: list[threading.Thread] = []  # the thread of each call
        self.consumer = consumer  # its status; None: deregistered

    def describe_stream_consumer(self, **kwargs: Any) -> dict:
        if self.consumer is None:
            raise client_error("ResourceNotFoundException")
        return {"ConsumerDescription": {"ConsumerARN": ARN, "ConsumerStatus": self.consumer}}

    def subscribe_to_shard(self, **kwargs: Any) -> dict:
        self.calls.append(kwargs)
        self.threads.append(threading.current_thread())
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return {"EventStream": answer}


def source(fake: FakeKinesis, start: ESN = ESN.TRIM_HORIZON) -> FanOutRecordsPublisher:
    publisher = open_source(KinesisClient(CONFIG, client=fake), CONFIG, "shardId-0",  # type: ignore[arg-type]
                            consumer_arn=ARN)
    assert isinstance(publisher, FanOutRecordsPublisher)
    publisher.initialize(start)
    return publisher


def read_until(publisher: FanOutRecordsPublisher, count: int, limit: int = 20) -> list[str]:
    seen: list[str] = []
    for _ in range(limit):
        result = publisher.get_records()
        seen += [str(r.extended_sequence_number) for r in result.records]
        if len(seen) >= count or result.shard_end:
            break
    return seen


def test_open_source_polls_without_a_consumer_and_pushes_with_one():
    polling = open_source(KinesisClient(CONFIG, client=FakeKinesis()), CONFIG, "shardId-0")  # type: ignore[arg-type]
    assert polling.pushes is False
    assert source(FakeKinesis()).pushes is True


def test_a_subscription_that_ends_is_followed_after_its_last_continuation():
    fake = FakeKinesis(FakeStream([event([record(1), record(2)], "2"), event([], "5")]),
                       FakeStream([event([record(7)], "7")]))
    publisher = source(fake)
    assert read_until(publisher, 3) == ["1/0", "2/0", "7/0"]
    assert [c["StartingPosition"] for c in fake.calls] == [
        {"Type": "TRIM_HORIZON"}, {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "5"}]
    assert fake.calls[0]["ConsumerARN"] == ARN and fake.calls[0]["ShardId"] == "shardId-0"
    assert (publisher.subscriptions, publisher.resubscriptions) == (2, 1)
    publisher.close()


@pytest.mark.parametrize("start, position", [
    (ESN.LATEST, {"Type": "LATEST"}),
    (ESN("49000000000000000000000000000000000000000000000000000042"),
     {"Type": "AT_SEQUENCE_NUMBER",
      "SequenceNumber": "49000000000000000000000000000000000000000000000000000042"}),
])
def test_the_first_subscription_starts_at_the_checkpoint_or_the_initial_position(start, position):
    fake = FakeKinesis(FakeStream([]))
    source(fake, start).get_records()
    assert fake.calls[0]["StartingPosition"] == position


def test_at_timestamp_subscribes_at_the_configured_time():
    fake = FakeKinesis(FakeStream([]))
    publisher = FanOutRecordsPublisher(KinesisClient(CONFIG, client=fake), CONFIG,  # type: ignore[arg-type]
                                       "shardId-0", ARN, start_timestamp=1700000000.0)
    publisher.initialize(ESN.AT_TIMESTAMP)
    publisher.get_records()
    position = fake.calls[0]["StartingPosition"]
    assert position["Type"] == "AT_TIMESTAMP" and position["Timestamp"].timestamp() == 1700000000.0


def test_records_at_or_before_the_checkpoint_are_dropped_aggregates_included():
    aggregate = Aggregate("shardId-0")
    for index in range(4):
        aggregate.try_add("k", b"k", None, f"user-{index}".encode(), 0, 1 << 20)
    aggregated = record(10, aggregate.encode())
    fake = FakeKinesis(FakeStream([event([aggregated, record(11)], "11")]))
    publisher = source(fake, ESN("10", 1))  # the processor checkpointed mid-aggregate
    assert read_until(publisher, 3) == ["10/2", "10/3", "11/0"]
    assert fake.calls[0]["StartingPosition"] == {"Type": "AT_SEQUENCE_NUMBER",
                                                 "SequenceNumber": "10"}


def test_a_null_continuation_is_the_shard_end_with_its_children():
    fake = FakeKinesis(FakeStream([event([record(3)], "3"),
                                   event([record(4)], None, children=("shardId-1", "shardId-2"))]))
    publisher = source(fake)
    results = [publisher.get_records() for _ in range(2)]
    assert results[1].shard_end and results[1].child_shard_ids == ["shardId-1", "shardId-2"]
    assert [str(r.extended_sequence_number) for r in results[1].records] == ["4/0"]
    again = publisher.get_records()  # no more subscriptions once the shard is read
    assert again.shard_end and again.child_shard_ids == ["shardId-1", "shardId-2"]
    assert len(fake.calls) == 1


def test_a_null_continuation_without_children_is_invalid_and_read_again():
    fake = FakeKinesis(FakeStream([event([record(3)], "3"), event([record(4)], None)]),
                       FakeStream([event([record(4)], None, children=("shardId-1",))]))
    publisher = source(fake)
    assert read_until(publisher, 1) == ["3/0"]
    with pytest.raises(TransientServiceError):
        publisher.get_records()
    result = publisher.get_records()
    assert result.shard_end and [str(r.extended_sequence_number) for r in result.records] == ["4/0"]
    assert fake.calls[1]["StartingPosition"] == {"Type": "AFTER_SEQUENCE_NUMBER",
                                                 "SequenceNumber": "3"}


def test_resource_not_found_on_subscribe_ends_the_shard_as_the_kcl_does():
    publisher = source(FakeKinesis(client_error("ResourceNotFoundException")))
    result = publisher.get_records()
    assert result.shard_end and result.child_shard_ids == []


def test_a_deregistered_consumer_is_an_error_to_wait_out_never_a_shard_end():
    fake = FakeKinesis(client_error("ResourceNotFoundException"),
                       FakeStream([event([record(1)], "1")]), consumer=None)
    publisher = source(fake)
    with pytest.raises(ConsumerRegistrationError, match="deregistered"):
        publisher.get_records()
    fake.consumer = "ACTIVE"  # registered again (by the same ARN, in this fake)
    assert read_until(publisher, 1) == ["1/0"]


def test_errors_reach_the_caller_as_ours_and_the_next_read_resubscribes():
    fake = FakeKinesis(client_error("ResourceInUseException"),
                       FakeStream([event([record(1)], "1")],
                                  error=client_error("InternalFailure")),
                       client_error("LimitExceededException"),
                       FakeStream([event([record(2)], "2")]))
    publisher = source(fake)
    with pytest.raises(ThrottlingError) as in_use:  # the 5 s rule: waited out, not fatal
        publisher.get_records()
    assert in_use.value.code == "ResourceInUseException" and is_throttling(in_use.value)
    assert read_until(publisher, 1) == ["1/0"]
    with pytest.raises(TransientServiceError):  # the subscription failed mid-stream
        publisher.get_records()
    with pytest.raises(ThrottlingError):
        publisher.get_records()
    assert read_until(publisher, 1) == ["2/0"]
    assert fake.calls[-1]["StartingPosition"] == {"Type": "AFTER_SEQUENCE_NUMBER",
                                                  "SequenceNumber": "1"}
    assert (publisher.subscriptions, publisher.resubscriptions) == (2, 1)


def test_a_subscription_that_ends_while_read_is_renewed_by_its_reader_at_once(monkeypatch):
    """Its lifetime up, a subscription a caller is reading is renewed by the reader thread,
    after the last event's continuation and once Kinesis' 1 s and 5 s rules allow (shortened
    here): the next records are queued before the caller asks again."""
    monkeypatch.setattr(fanout, "CALL_INTERVAL_S", 0.1)
    monkeypatch.setattr(fanout, "TAKEOVER_AFTER_S", 0.3)
    up = threading.Event()
    fake = FakeKinesis(FakeStream([event([record(1)], "1"), event([], "4")], ends_when=up),
                       FakeStream([event([record(5)], "5")], endless=True))
    publisher = source(fake)
    assert read_until(publisher, 1) == ["1/0"]
    subscribed = time.monotonic()
    publisher.get_records()  # the caller reads on: this subscription is in use
    up.set()
    wait_for(lambda: len(fake.calls) == 2, 10, "the renewal", interval=0.01)
    assert time.monotonic() - subscribed >= 0.3 - 0.05  # the 5 s rule (here 0.3 s) waited out
    assert fake.threads[1] is not threading.current_thread()  # the reader's, not the caller's
    assert fake.calls[1]["StartingPosition"] == {"Type": "AFTER_SEQUENCE_NUMBER",
                                                 "SequenceNumber": "4"}
    assert read_until(publisher, 1) == ["5/0"]
    assert (publisher.subscriptions, publisher.resubscriptions) == (2, 1)
    publisher.close()


def test_a_subscription_nobody_read_while_it_lasted_is_not_renewed(monkeypatch):
    """A held source whose shard is read elsewhere now must not take the subscription
    over every time it ends: unread through a whole subscription, it lets go, and the
    caller, if it comes back, subscribes itself."""
    monkeypatch.setattr(fanout, "TAKEOVER_AFTER_S", 0.0)
    up = threading.Event()
    first = FakeStream([event([record(1)], "1")], ends_when=up)
    fake = FakeKinesis(first, FakeStream([event([record(2)], "2")]))
    publisher = source(fake)
    assert read_until(publisher, 1) == ["1/0"]
    up.set()
    wait_for(lambda: not first.reader.is_alive(), 10, "the reader's end", interval=0.01)
    assert len(fake.calls) == 1
    assert read_until(publisher, 1) == ["2/0"]
    assert fake.threads[1] is threading.current_thread()
    assert fake.calls[1]["StartingPosition"] == {"Type": "AFTER_SEQUENCE_NUMBER",
                                                 "SequenceNumber": "1"}


def test_the_buffer_is_bounded_by_bytes_and_events_and_always_takes_the_end():
    never = threading.Event()
    buffer = EventBuffer(max_bytes=100, max_events=3)
    sixty = ("event", event([record(1, b"x" * 60)], "1")["SubscribeToShardEvent"])
    assert buffer.put(sixty, never) and not buffer.full
    assert buffer.put(sixty, never) and buffer.full  # 120 bytes: let in, and now full
    assert buffer.put(("end", None), never)  # the end is never held back
    assert buffer.get(0) == sixty and not buffer.full
    small = ("event", event([record(2)], "2")["SubscribeToShardEvent"])
    counted = EventBuffer(max_bytes=100, max_events=3)
    assert counted.put(small, never) and counted.put(small, never) and not counted.full
    assert counted.put(small, never) and counted.full  # three events, whatever their size
    closed = threading.Event()
    closed.set()
    assert not counted.put(small, closed)  # full, and its subscription closed: not added
    assert len(counted) == 3


def _waiting_for_room(thread: threading.Thread) -> bool:
    """``thread`` is inside ``EventBuffer.put`` (with the buffer full: waiting for room), seen
    in its stack: the condition a fixed sleep stood in for."""
    frame = sys._current_frames().get(thread.ident or -1)  # noqa: SLF001 - a thread's stack
    while frame is not None:
        if frame.f_code is EventBuffer.put.__code__:
            return True
        frame = frame.f_back
    return False


def test_a_batch_of_small_events_waits_in_the_buffer_for_the_next_task():
    """A Spark task takes a busy shard's events once a batch: the buffer holds many small
    events, where the KCL's 10 would stop the reading between tasks."""
    stream = FakeStream([], endless=True, endless_data=b"x" * 100)
    publisher = source(FakeKinesis(stream))
    publisher.get_records()
    buffered = publisher._subscription.events  # type: ignore[union-attr]
    wait_for(lambda: len(buffered) >= 500, 10, "a second's small events of 500 puts buffered",
             interval=0.01)
    publisher.close()


def test_large_events_stop_the_reading_at_the_byte_bound():
    stream = FakeStream([], endless=True, endless_data=b"x" * (1024 * 1024))
    publisher = source(FakeKinesis(stream))
    publisher.get_records()  # subscribes and takes the first event; the reader fills the buffer
    buffered = publisher._subscription.events  # type: ignore[union-attr]
    wait_for(lambda: buffered.full and _waiting_for_room(stream.reader),
             10, "the reader held at the byte bound", interval=0.01)
    # exact: the event taken, the bound's 4 events of 1 MiB, and the one the reader holds
    assert len(buffered) == BUFFER_BYTES // (1024 * 1024)
    assert stream.pulled == 1 + len(buffered) + 1
    publisher.close()
    assert stream.closed.wait(5)


def test_a_slow_reader_stops_the_reading_and_close_ends_it():
    stream = FakeStream([], endless=True, endless_data=b"x")  # events with records: none passed over
    publisher = source(FakeKinesis(stream))
    publisher.get_records()  # subscribes and takes the first event; the reader fills the buffer
    buffered = publisher._subscription.events  # type: ignore[union-attr]
    wait_for(lambda: buffered.full and _waiting_for_room(stream.reader),
             10, "the reader held at the event bound", interval=0.01)
    # exact: the event taken, BUFFER_EVENTS held, and the one the reader holds
    assert len(buffered) == BUFFER_EVENTS
    assert stream.pulled == 1 + BUFFER_EVENTS + 1
    publisher.close()
    assert stream.closed.wait(5)
