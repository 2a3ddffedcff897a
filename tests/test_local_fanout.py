"""The fan-out front (kinesis_dstream.fanout_front): SubscribeToShard served to boto3 as
Kinesis serves it, its rules, and the tests' fan-out faults (tests/fanout_faults.py).

The emulator tests drive boto3's own ``subscribe_to_shard`` through ``make_fanout_front``;
the unit tests decode the front's frames with botocore's own event-stream decoder.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import ClientError, EventStreamError

import emulators
from waiting import wait_for

from kinesis_dstream.fanout_front import ReadPacer, Refused, SubscribeRules, frames
from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY, Emulator

SHARD0 = "shardId-000000000000"


# ---- unit: frames and rules ------------------------------------------------------------------

def _decode(data: bytes) -> list[Any]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return list(buffer)


@pytest.mark.unit
def test_botocore_decodes_the_frames():
    body = {"Records": [{"SequenceNumber": "1", "Data": "YQ==", "PartitionKey": "k",
                         "ApproximateArrivalTimestamp": 1.5}],
            "ContinuationSequenceNumber": "1", "MillisBehindLatest": 0}
    messages = _decode(frames.event("initial-response", {})
                       + frames.event("SubscribeToShardEvent", body)
                       + frames.exception("ResourceInUseException", "taken over"))
    assert [m.headers for m in messages] == [
        {":message-type": "event", ":event-type": "initial-response",
         ":content-type": "application/json"},
        {":message-type": "event", ":event-type": "SubscribeToShardEvent",
         ":content-type": "application/json"},
        {":message-type": "exception", ":exception-type": "ResourceInUseException",
         ":content-type": "application/json"}]
    assert [json.loads(m.payload) for m in messages] == [{}, body, {"message": "taken over"}]


@pytest.mark.unit
def test_frames_split_across_reads_and_unicode_headers_decode():
    message = frames.encode_message({"é": "ü" * 300}, b"x" * 70000)
    buffer = EventStreamBuffer()
    decoded = []
    for start in range(0, len(message), 4096):  # as chunks arrive from the socket
        buffer.add_data(message[start:start + 4096])
        decoded += list(buffer)
    assert len(decoded) == 1
    assert decoded[0].headers == {"é": "ü" * 300} and decoded[0].payload == b"x" * 70000


@pytest.mark.unit
def test_a_corrupted_frame_fails_botocore_checksums():
    message = bytearray(frames.event("SubscribeToShardEvent", {"Records": []}))
    message[-6] ^= 0xFF  # a payload byte
    with pytest.raises(Exception, match="(?i)checksum|crc"):
        _decode(bytes(message))


@pytest.mark.unit
def test_chunks_are_http_chunked_encoding():
    assert frames.chunk(b"abc") == b"3\r\nabc\r\n"
    assert frames.chunk(b"x" * 26) == b"1A\r\n" + b"x" * 26 + b"\r\n"
    assert frames.chunk(b"") == b"0\r\n\r\n"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.unit
def test_subscribe_rules_one_call_a_second_and_five_seconds_to_take_over():
    clock = _Clock()
    rules: SubscribeRules[str] = SubscribeRules(clock=clock)
    rules.admit("c", "s")
    assert rules.succeeded("c", "s", "first") is None
    rules.admit("c", "other-shard")  # the rules are per (consumer, shard)
    rules.admit("other-consumer", "s")
    clock.now += 0.5
    with pytest.raises(Refused) as limit:
        rules.admit("c", "s")
    assert limit.value.code == "LimitExceededException"
    clock.now += 0.6  # 1.1 s after the first call: the refused one did not count
    with pytest.raises(Refused) as in_use:
        rules.admit("c", "s")
    assert in_use.value.code == "ResourceInUseException"
    clock.now += 3.9  # 5.0 s after the success
    rules.admit("c", "s")
    assert rules.succeeded("c", "s", "second") == "first"
    assert rules.current() == ["second"]
    rules.ended("c", "s", "first")  # the old one ending does not drop the new one
    assert rules.current() == ["second"]
    rules.ended("c", "s", "second")
    assert rules.current() == []


@pytest.mark.unit
def test_read_pacer_holds_a_consumer_to_its_rate():
    clock = _Clock()
    pacer = ReadPacer(1000, clock=clock)
    key = ("c", "s")
    assert pacer.wait_s(key) == 0
    pacer.charge(key, 3000)  # a big event goes, and puts the budget 2 s in debt
    assert pacer.wait_s(key) == pytest.approx(2.0, abs=0.01)
    assert pacer.wait_s(("c", "other")) == 0  # per shard
    clock.now += 2.01
    assert pacer.wait_s(key) == 0
    clock.now += 60  # idle time refills one second's worth, no more
    pacer.charge(key, 1500)
    assert pacer.wait_s(key) == pytest.approx(0.5, abs=0.01)


# ---- emulator: boto3's subscribe_to_shard through the front ----------------------------------

def _client(endpoint: str, read_timeout: float = 15) -> Any:
    return boto3.client(
        "kinesis", endpoint_url=endpoint, region_name=DUMMY_REGION,
        aws_access_key_id=DUMMY_ACCESS_KEY_ID, aws_secret_access_key=DUMMY_SECRET_ACCESS_KEY,
        config=botocore.config.Config(read_timeout=read_timeout,
                                      retries={"total_max_attempts": 1}))


class Reader:
    """Reads one subscription's events on a thread: ``events`` as they come, then ``end``
    ("ended" when the body ended, else the exception that ended the iteration)."""

    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response
        self.events: list[dict[str, Any]] = []
        self.arrived: list[float] = []
        self.end: Any = None
        self.ended_at = 0.0  # time.monotonic() as the stream ended
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for event in self.response["EventStream"]:
                self.events.append(event["SubscribeToShardEvent"])
                self.arrived.append(time.monotonic())
            self.end = "ended"
        except Exception as exc:  # noqa: BLE001 - what ended the stream is the result
            self.end = exc
        finally:
            self.ended_at = time.monotonic()
            self.done.set()

    @property
    def records(self) -> list[dict[str, Any]]:
        return [r for event in self.events for r in event["Records"]]

    def data(self) -> list[bytes]:
        return [r["Data"] for r in self.records]

    def wait(self, condition: Any, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; events {self.events}, end {self.end!r}")
            time.sleep(0.02)


def _subscribe(kinesis: Any, consumer: str, shard: str = SHARD0, **position: Any) -> Reader:
    position.setdefault("Type", "TRIM_HORIZON")
    return Reader(kinesis.subscribe_to_shard(ConsumerARN=consumer, ShardId=shard,
                                             StartingPosition=position))


def _code(exc_info: pytest.ExceptionInfo) -> str:
    return str(exc_info.value.response["Error"]["Code"])


def _consumer_status(kinesis: Any, consumer: str) -> str:
    """The consumer's status on the emulator, or "gone"."""
    try:
        return str(kinesis.describe_stream_consumer(ConsumerARN=consumer)[
            "ConsumerDescription"]["ConsumerStatus"])
    except ClientError:
        return "gone"


@pytest.fixture
def fanout(make_fanout_front, make_stream):
    """(front, client, stream, consumer ARN): a one-shard stream with an ACTIVE consumer."""

    def make(shards: int = 1, **settings: Any) -> tuple[Any, Any, str, str]:
        front = make_fanout_front(**settings)
        stream = make_stream(shards)
        consumer = emulators.register_consumer(front.endpoint, stream, "app")
        return front, _client(front.endpoint), stream, consumer

    return make


@pytest.fixture
def slow_consumers() -> Any:
    """A kinesis-local whose registered consumers stay CREATING for 5 s."""
    with Emulator("kinesis-local",
                  extra_env={"REGISTER_STREAM_CONSUMER_DURATION": "5s"}) as emulator:
        yield emulator.endpoint


@pytest.mark.emulator
def test_a_creating_consumer_is_refused_then_served_once_active(slow_consumers, make_fanout_front,
                                                               make_stream):
    # A kinesis-local of its own whose consumers stay CREATING for 5 s: with the shared one's
    # 0.5 s, a loaded machine could see the consumer ACTIVE before the first subscription.
    front = make_fanout_front(upstream=slow_consumers)
    stream = make_stream(1, endpoint=slow_consumers)
    kinesis = _client(front.endpoint)
    consumer = emulators.register_consumer(front.endpoint, stream, "app", active=False)
    with pytest.raises(ClientError) as creating:
        kinesis.subscribe_to_shard(ConsumerARN=consumer, ShardId=SHARD0,
                                   StartingPosition={"Type": "TRIM_HORIZON"})
    assert _code(creating) == "ResourceInUseException"
    assert creating.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    deadline = time.monotonic() + 30
    while kinesis.describe_stream_consumer(ConsumerARN=consumer)[
            "ConsumerDescription"]["ConsumerStatus"] != "ACTIVE":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    emulators.put_records(front.endpoint, stream, [b"a", b"b", b"c"])
    # the 5 s rule counts from a successful call: the refused one does not block this one
    response = kinesis.subscribe_to_shard(ConsumerARN=consumer, ShardId=SHARD0,
                                          StartingPosition={"Type": "TRIM_HORIZON"})
    headers = response["ResponseMetadata"]["HTTPHeaders"]
    assert headers["content-type"] == "application/vnd.amazon.eventstream"
    assert headers["transfer-encoding"] == "chunked"
    reader = Reader(response)
    reader.wait(lambda: len(reader.records) == 3)
    assert reader.data() == [b"a", b"b", b"c"]
    record = reader.records[0]
    assert set(record) >= {"SequenceNumber", "ApproximateArrivalTimestamp", "Data",
                           "PartitionKey"}
    assert reader.events[-1]["ContinuationSequenceNumber"] == reader.records[-1]["SequenceNumber"]
    assert front.count("GetRecords") == 0 and front.count("SubscribeToShard", SHARD0) == 2


@pytest.mark.emulator
def test_records_in_order_exactly_once_across_the_lifetime_and_a_resubscription(fanout):
    front, kinesis, stream, consumer = fanout(lifetime_s=6.0)
    emulators.put_records(front.endpoint, stream, [f"r{i}" for i in range(40)])
    started = time.monotonic()
    first = _subscribe(kinesis, consumer)
    with emulators.Producer(front.endpoint, stream, "p", batch=5, interval_s=0.3) as producer:
        first.wait(lambda: first.done.is_set(), timeout=15)
        assert first.end == "ended"  # the lifetime's end: the body just ends, no error
        # it lasted its lifetime (6 s from its start, after ``started``): not cut short, and
        # ended by the front (a producer's last record may come a little before the end)
        assert 5.9 < first.ended_at - started < 12, first.ended_at - started
        continuation = first.events[-1]["ContinuationSequenceNumber"]
        assert continuation == first.records[-1]["SequenceNumber"]
        second = _subscribe(kinesis, consumer, Type="AFTER_SEQUENCE_NUMBER",
                            SequenceNumber=continuation)
    put = [f"r{i}".encode() for i in range(40)] + sorted(
        (d.encode() for d in producer.sent), key=lambda d: (int(d[1:].split(b"-")[0]),
                                                            int(d.split(b"-")[1])))
    second.wait(lambda: len(first.records) + len(second.records) >= len(put))
    assert first.data() + second.data() == put  # in order, none twice, none lost
    sequence = [int(r["SequenceNumber"]) for r in first.records + second.records]
    assert sequence == sorted(sequence)
    assert front.count("GetRecords") == 0 and front.count("SubscribeToShard") == 2


@pytest.mark.emulator
def test_every_starting_position(fanout):
    front, kinesis, stream, consumer = fanout(lifetime_s=30.0)
    emulators.put_records(front.endpoint, stream, [b"a"])
    time.sleep(0.1)  # b's arrival timestamp after a's: one PutRecords stamps them all alike
    middle = emulators.put_records(front.endpoint, stream, [b"b", b"c"])[0]
    record = kinesis.get_records(ShardIterator=kinesis.get_shard_iterator(
        StreamName=stream, ShardId=SHARD0, ShardIteratorType="AT_SEQUENCE_NUMBER",
        StartingSequenceNumber=middle.sequence_number)["ShardIterator"])["Records"][0]
    positions = {
        "TRIM_HORIZON": ({"Type": "TRIM_HORIZON"}, [b"a", b"b", b"c"]),
        "AT_SEQUENCE_NUMBER": ({"Type": "AT_SEQUENCE_NUMBER",
                                "SequenceNumber": middle.sequence_number}, [b"b", b"c"]),
        "AFTER_SEQUENCE_NUMBER": ({"Type": "AFTER_SEQUENCE_NUMBER",
                                   "SequenceNumber": middle.sequence_number}, [b"c"]),
        "AT_TIMESTAMP": ({"Type": "AT_TIMESTAMP",
                          "Timestamp": record["ApproximateArrivalTimestamp"]}, [b"b", b"c"]),
    }
    readers = {}
    for shard_consumer, (name, (position, _)) in enumerate(positions.items()):
        arn = emulators.register_consumer(front.endpoint, stream, f"c{shard_consumer}")
        readers[name] = _subscribe(kinesis, arn, **position)
    latest = _subscribe(kinesis, consumer, Type="LATEST")
    emulators.put_records(front.endpoint, stream, [b"d"])
    for name, (_, expected) in positions.items():
        reader = readers[name]
        reader.wait(lambda r=reader: r.data()[-1:] == [b"d"])
        assert reader.data() == expected + [b"d"], name
    latest.wait(lambda: latest.data() == [b"d"])


@pytest.mark.emulator
def test_heartbeats_on_an_idle_shard_and_a_latest_continuation_that_skips_nothing(fanout):
    front, kinesis, stream, consumer = fanout(lifetime_s=15.0, heartbeat_s=0.5)
    old = emulators.put_records(front.endpoint, stream, [b"old-1", b"old-2"])
    reader = _subscribe(kinesis, consumer, Type="LATEST")
    reader.wait(lambda: len(reader.events) >= 6)
    assert all(e["Records"] == [] for e in reader.events)
    # Measured where the front sends them: a heartbeat goes once heartbeat_s has passed since
    # the last event, never sooner (exact, the rule; a loaded machine only delays), and they
    # keep that pace: six in a row average under 1.5 heartbeats apart (one every other
    # heartbeat would be 2).
    sent = [at for at, _, _ in front.events_sent_at[:6]]
    gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert min(gaps) >= 0.5, gaps
    assert sum(gaps) / len(gaps) < 0.75, gaps
    # a heartbeat's continuation is the record before the LATEST start: resubscribing
    # AFTER it reads exactly what came after the start
    assert {e["ContinuationSequenceNumber"] for e in reader.events} == {old[-1].sequence_number}
    emulators.put_records(front.endpoint, stream, [b"new"])
    # (how soon it comes is test_a_put_through_the_front_is_pushed_at_once's: here a poll
    # is due at every heartbeat, so a push and a poll would both bring it within 0.5 s)
    reader.wait(lambda: reader.data() == [b"new"])


@pytest.mark.emulator
def test_a_publisher_sees_an_event_in_its_socket_before_its_reader_queues_it(fanout):
    """``FanOutRecordsPublisher.arriving`` looks at the socket under boto3's real event
    stream: with the reader held (its buffer full), the next heartbeat waits in the socket
    and is seen there; once the buffer has room the reader takes it."""
    from kinesis_dstream.aws.kinesis import KinesisClient
    from kinesis_dstream.config import ConsumerConfig
    from kinesis_dstream.records import ExtendedSequenceNumber
    from kinesis_dstream.retrieval.fanout import FanOutRecordsPublisher

    front, _, stream, consumer = fanout(lifetime_s=30.0, heartbeat_s=0.3)
    config = ConsumerConfig(application_name="app", stream_name=stream,
                            region_name=DUMMY_REGION, aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                            aws_secret_key=DUMMY_SECRET_ACCESS_KEY,
                            kinesis_endpoint=front.endpoint, retrieval_mode="FANOUT")
    publisher = FanOutRecordsPublisher(KinesisClient(config), config, SHARD0, consumer,
                                       wait_s=5.0)
    publisher.initialize(ExtendedSequenceNumber.LATEST)
    try:
        publisher.get_records()  # subscribes; the first heartbeat
        assert publisher.flowing
        publisher._subscription.events.max_events = 1  # noqa: SLF001 - hold the reader
        _wait_for(lambda: publisher.arriving, 5.0)
        publisher._subscription.events.max_events = 1000  # noqa: SLF001
        publisher.get_records(0.0)  # room: the reader takes what waited
        _wait_for(lambda: not publisher.arriving, 5.0)
    finally:
        publisher.close()


def _wait_for(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.emulator
def test_an_idle_subscription_polls_the_emulator_less_often(fanout):
    front, kinesis, stream, consumer = fanout(lifetime_s=30.0, heartbeat_s=10.0,
                                              poll_interval_s=0.1, idle_poll_interval_s=0.5)
    reader = _subscribe(kinesis, consumer, Type="LATEST")
    # The idle time is what is measured, counted in the front's polls of the emulator: the
    # waits between them double from 0.1 s to the idle interval, 0.5 s (never sooner: exact,
    # the rule; a loaded machine only delays), and polling goes on at that pace (the four
    # after the doubling average under 1.5 idle intervals apart; doubling on would be 0.8,
    # 1.6, 3.2 and 6.4 s).
    wait_for(lambda: front.upstream_calls["GetRecords"] >= 8, 20, "8 polls of the idle shard")
    polls = front.began("GetRecords")[:8]
    gaps = [b - a for a, b in zip(polls, polls[1:], strict=False)]
    assert all(gap >= least for gap, least in zip(
        gaps, [0.1, 0.2, 0.4, 0.5, 0.5, 0.5, 0.5], strict=True)), gaps
    assert sum(gaps[3:]) / 4 < 0.75, gaps
    emulators.put_records(front.endpoint, stream, [b"after-idle"])
    # (pushed by the put's wake, which test_a_put_through_the_front_is_pushed_at_once shows
    # where no poll is due; here one is due within 0.5 s)
    reader.wait(lambda: reader.data() == [b"after-idle"])


@pytest.mark.emulator
def test_a_put_through_the_front_is_pushed_at_once(fanout):
    # No poll and no heartbeat is due for 60 s (beyond the waits below): a record read here
    # was read because the put woke the subscription.
    front, kinesis, stream, consumer = fanout(lifetime_s=60.0, heartbeat_s=60.0,
                                              poll_interval_s=60.0, idle_poll_interval_s=60.0)
    reader = _subscribe(kinesis, consumer, Type="LATEST")
    wait_for(lambda: front.upstream_answered["GetRecords"] == 1, 10, "the first poll answered")
    emulators.put_records(front.endpoint, stream, [b"through-the-front"])
    reader.wait(lambda: reader.data() == [b"through-the-front"])
    assert front.upstream_calls["GetRecords"] == 2  # the first poll, and the one the put woke


@pytest.mark.emulator
def test_a_put_on_the_emulator_itself_is_found_by_the_next_poll(fanout):
    front, kinesis, stream, consumer = fanout(lifetime_s=30.0, heartbeat_s=10.0,
                                              poll_interval_s=3.0, idle_poll_interval_s=3.0)
    reader = _subscribe(kinesis, consumer, Type="LATEST")
    wait_for(lambda: front.upstream_answered["GetRecords"] == 1, 10, "the first poll answered")
    # put on the emulator itself: the front does not see it, its next poll finds it
    direct = f"http://{front.upstream.host}:{front.upstream.port}"
    emulators.put_records(direct, stream, [b"direct"])
    reader.wait(lambda: reader.data() == [b"direct"])
    assert front.upstream_calls["GetRecords"] >= 2


@pytest.mark.emulator
def test_a_shard_read_to_its_tip_is_not_polled_again_at_once(fanout):
    front, kinesis, stream, consumer = fanout(lifetime_s=30.0, heartbeat_s=10.0,
                                              poll_interval_s=3.0, idle_poll_interval_s=3.0)
    reader = _subscribe(kinesis, consumer, Type="LATEST")
    wait_for(lambda: front.upstream_answered["GetRecords"] == 1, 10, "the first poll answered")
    emulators.put_records(front.endpoint, stream, [b"one", b"two"])
    reader.wait(lambda: reader.data() == [b"one", b"two"])
    wait_for(lambda: front.upstream_calls["GetRecords"] >= 3, 15, "the poll after the interval")
    # the page that brought them (the second poll) reached the tip: the third waited the
    # interval after it (exact: never sooner; a loaded machine only delays)
    polls = front.began("GetRecords")
    assert polls[2] - polls[1] >= 3.0, polls


@pytest.mark.emulator
def test_wake_only_reads_a_shard_only_when_a_put_wakes_it(fanout):
    front, kinesis, stream, consumer = fanout(lifetime_s=30.0, heartbeat_s=0.5,
                                              poll_interval_s=0.1, wake_only=True)
    emulators.put_records(front.endpoint, stream, [b"before"])
    reader = _subscribe(kinesis, consumer)  # TRIM_HORIZON: what is there is read at once
    reader.wait(lambda: reader.data() == [b"before"])
    polled = front.upstream_calls["GetRecords"]
    reader.wait(lambda: len(reader.events) >= 5)  # heartbeats, every 0.5 s
    assert front.upstream_calls["GetRecords"] == polled
    assert {e["ContinuationSequenceNumber"] for e in reader.events} == {
        reader.records[-1]["SequenceNumber"]}
    emulators.put_records(front.endpoint, stream, [b"woken"])
    # wake_only: nothing reads the shard but a put's wake (the heartbeats above polled
    # nothing), so its arrival is the put's doing
    reader.wait(lambda: reader.data() == [b"before", b"woken"])
    # pushed from the put the front relayed, not read back from the emulator
    assert front.upstream_calls["GetRecords"] == polled
    record = reader.records[-1]
    assert set(record) >= {"SequenceNumber", "ApproximateArrivalTimestamp", "PartitionKey"}
    assert int(record["SequenceNumber"]) > int(reader.records[0]["SequenceNumber"])
    for chunk in ([b"c1", b"c2"], [b"c3"], [b"c4", b"c5", b"c6"]):
        emulators.put_records(front.endpoint, stream, chunk)
    reader.wait(lambda: len(reader.records) == 8)
    assert reader.data() == [b"before", b"woken", b"c1", b"c2", b"c3", b"c4", b"c5", b"c6"]
    assert front.upstream_calls["GetRecords"] == polled
    # records the log no longer holds (it keeps 1 to 2 a shard here) are read from the
    # emulator, after the last one pushed
    front.put_log.per_shard = 1
    emulators.put_records(front.endpoint, stream, [b"d1", b"d2", b"d3"])
    reader.wait(lambda: len(reader.records) == 11)
    assert reader.data()[8:] == [b"d1", b"d2", b"d3"]
    assert front.upstream_calls["GetRecords"] == polled + 1
    sequences = [int(r["SequenceNumber"]) for r in reader.records]
    assert sequences == sorted(set(sequences))


@pytest.mark.emulator
def test_the_one_second_and_five_second_rules_and_the_takeover(fanout):
    front, kinesis, stream, consumer = fanout(lifetime_s=30.0)
    first = _subscribe(kinesis, consumer)
    # the rules' windows are what is measured: each wait below is for the front's own clock
    # to pass a window from the success it noted (noted after the rules counted it)
    ((succeeded, _, _),) = front.succeeded
    with pytest.raises(ClientError) as limit:
        _subscribe(kinesis, consumer)
    assert _code(limit) == "LimitExceededException"
    wait_for(lambda: time.time() >= succeeded + 1.0, 5, "a second since the first call",
             interval=0.01)
    with pytest.raises(ClientError) as in_use:
        _subscribe(kinesis, consumer)
    assert _code(in_use) == "ResourceInUseException"
    wait_for(lambda: time.time() >= succeeded + 5.0, 10, "five seconds since the success",
             interval=0.01)
    emulators.put_records(front.endpoint, stream, [b"x"])
    second = _subscribe(kinesis, consumer)
    first.wait(lambda: first.done.is_set(), timeout=5)
    assert isinstance(first.end, EventStreamError)
    assert first.end.response["Error"]["Code"] == "ResourceInUseException"
    second.wait(lambda: second.data() == [b"x"])
    assert not second.done.is_set()


@pytest.mark.emulator
def test_unknown_and_deregistered_consumers_and_unknown_shards(fanout, make_fanout_front,
                                                              make_stream):
    # No heartbeat's consumer check is due for 30 s (beyond the waits below): a subscription
    # that ends here was ended by the deregistration the front relayed.
    front, kinesis, stream, consumer = fanout(lifetime_s=60.0, heartbeat_s=30.0)
    emulators.put_records(front.endpoint, stream, [b"a"])  # a first event at once
    unknown = consumer.replace("/consumer/app:", "/consumer/nobody:")
    for arn, shard in ((unknown, SHARD0), (consumer, "shardId-000000000009")):
        with pytest.raises(ClientError) as missing:
            _subscribe(kinesis, arn, shard=shard)
        assert _code(missing) == "ResourceNotFoundException"
        assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400

    # deregistered through the endpoint: its subscription ends at once
    reader = _subscribe(kinesis, consumer)
    reader.wait(lambda: len(reader.events) >= 1)
    kinesis.deregister_stream_consumer(ConsumerARN=consumer)
    reader.wait(lambda: reader.done.is_set())  # not at a heartbeat's check: none is due
    assert isinstance(reader.end, EventStreamError)
    assert reader.end.response["Error"]["Code"] == "ResourceNotFoundException"
    # once the emulator no longer has it ACTIVE, a call is refused for the consumer (not by
    # the one-second rule, which the front asks only of a consumer it finds)
    wait_for(lambda: _consumer_status(kinesis, consumer) != "ACTIVE", 10,
             "the emulator to see the consumer deregistered")
    with pytest.raises(ClientError) as gone:
        _subscribe(kinesis, consumer)
    assert _code(gone) == "ResourceNotFoundException"

    # deregistered elsewhere (on the emulator itself): noticed by a heartbeat's check, which
    # asks the emulator about the consumer
    front = make_fanout_front(lifetime_s=30.0, heartbeat_s=2.0)
    stream, kinesis = make_stream(1), _client(front.endpoint)
    other = emulators.register_consumer(front.endpoint, stream, "other")
    emulators.put_records(front.endpoint, stream, [b"a"])
    behind = _subscribe(kinesis, other)
    behind.wait(lambda: len(behind.events) >= 1)
    front.deregister_behind(other)
    asked = front.upstream_calls["DescribeStreamConsumer"]
    behind.wait(lambda: behind.done.is_set(), timeout=20)
    assert behind.end.response["Error"]["Code"] == "ResourceNotFoundException"
    assert front.upstream_calls["DescribeStreamConsumer"] > asked


@pytest.mark.emulator
def test_a_split_parent_ends_with_no_continuation_and_its_child_shards(fanout):
    front, kinesis, stream, consumer = fanout(lifetime_s=30.0)
    emulators.put_records(front.endpoint, stream, [b"before-1", b"before-2"])
    reader = _subscribe(kinesis, consumer)
    reader.wait(lambda: len(reader.records) == 2)
    kinesis.split_shard(StreamName=stream, ShardToSplit=SHARD0,
                        NewStartingHashKey=str(2**127))
    reader.wait(lambda: reader.done.is_set(), timeout=10)
    emulators.wait_stream_active(kinesis, stream)
    assert reader.end == "ended"
    last = reader.events[-1]
    assert last.get("ContinuationSequenceNumber") is None and last["Records"] == []
    assert sorted(c["ShardId"] for c in last["ChildShards"]) == [
        "shardId-000000000001", "shardId-000000000002"]
    assert all(c["ParentShards"] == [SHARD0] for c in last["ChildShards"])
    assert all(e.get("ContinuationSequenceNumber") for e in reader.events[:-1])
    # a child is read like any shard
    emulators.put_records(front.endpoint, stream, [(f"k{i}", f"child-{i}") for i in range(20)])
    children = [_subscribe(kinesis, consumer, shard=c["ShardId"]) for c in last["ChildShards"]]
    for child in children:
        child.wait(lambda c=child: len(children[0].records) + len(children[1].records) == 20)
    assert front.count("GetRecords") == 0


@pytest.mark.emulator
def test_a_subscription_cut_mid_stream(fanout):
    front, kinesis, stream, consumer = fanout(lifetime_s=30.0, heartbeat_s=0.3)
    emulators.put_records(front.endpoint, stream, [b"a"])
    front.cut_after(2)
    reader = _subscribe(kinesis, consumer)
    reader.wait(lambda: reader.done.is_set(), timeout=5)
    assert front.cuts == 1 and len(reader.events) == 2
    assert reader.end != "ended" and not isinstance(reader.end, EventStreamError)  # a broken body
    assert reader.data() == [b"a"]


@pytest.mark.emulator
@pytest.mark.parametrize("code", ["ResourceInUseException", "LimitExceededException"])
def test_the_next_subscribe_refused(fanout, code):
    front, kinesis, stream, consumer = fanout(lifetime_s=30.0)
    front.refuse_next(code)
    with pytest.raises(ClientError) as refused:
        _subscribe(kinesis, consumer)
    assert _code(refused) == code and front.refused[code] == 1
    reader = _subscribe(kinesis, consumer)  # only the next one
    reader.wait(lambda: len(reader.events) >= 1)
    assert front.count("SubscribeToShard", SHARD0) == 2


@pytest.mark.emulator
def test_calls_are_counted_by_operation_and_shard(fanout):
    front, kinesis, stream, consumer = fanout(shards=2, lifetime_s=30.0)
    emulators.put_records(front.endpoint, stream, [(f"k{i}", f"d{i}") for i in range(20)])
    readers = [_subscribe(kinesis, consumer, shard=s) for s in (SHARD0, "shardId-000000000001")]
    for reader in readers:
        reader.wait(lambda: sum(len(r.records) for r in readers) == 20)
    assert front.count("GetRecords") == 0
    assert front.count("SubscribeToShard", SHARD0) == 1
    assert front.count("SubscribeToShard", "shardId-000000000001") == 1
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=SHARD0,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    page = kinesis.get_records(ShardIterator=iterator)
    kinesis.get_records(ShardIterator=page["NextShardIterator"])
    assert front.count("GetShardIterator", SHARD0) == 1
    assert front.count("GetRecords", SHARD0) == 2  # attributed through the iterators
    assert front.count("GetRecords", "shardId-000000000001") == 0


@pytest.mark.emulator
def test_each_consumer_reads_a_shard_at_its_own_read_limit(fanout):
    rate = 64 * 1024  # a small limit keeps the test short; the rule is the same at 2 MiB/s
    front, kinesis, stream, consumer = fanout(lifetime_s=60.0, read_bytes_per_s=rate)
    others = [emulators.register_consumer(front.endpoint, stream, f"c{i}") for i in (1, 2)]
    emulators.put_records(front.endpoint, stream, [("k", b"x" * 25_000)] * 21)  # ~0.5 MiB
    readers = [_subscribe(kinesis, arn) for arn in (consumer, *others)]
    for reader in readers:
        reader.wait(lambda r=reader: len(r.records) == 21, timeout=40)
    # One second's worth goes at once, the rest at the rate (the last event as soon as the
    # budget allows): 6.6 s for each consumer. A limit the three shared would take 21.9 s for
    # them all; a loaded machine adds seconds to the time, not a factor, so the bound between
    # the two is halfway.
    own = (20 * 25_001 - rate) / rate
    shared = (3 * 20 * 25_001 - rate) / rate
    for reader in readers:
        assert reader.arrived[-1] - reader.arrived[0] > own - 0.3  # the limit holds
        assert max(len(e["Records"]) for e in reader.events) <= 2  # a fifth of a second's worth
    first = min(r.arrived[0] for r in readers)
    last = max(r.arrived[-1] for r in readers)
    assert last - first < (own + shared) / 2, (own, shared, last - first)


@pytest.mark.emulator
def test_http2_connections_are_relayed_to_the_emulator(make_fanout_front):
    """The Java SDK (so the Java KCL) speaks HTTP/2 with prior knowledge: kinesis-local
    answers it through the front, as without it."""
    import socket
    import struct

    front = make_fanout_front()
    port = int(front.endpoint.rpartition(":")[2])
    settings = struct.pack(">I", 0)[1:] + b"\x04\x00" + struct.pack(">I", 0)  # empty SETTINGS
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings)
        frame = conn.recv(9, socket.MSG_WAITALL)
    assert len(frame) == 9 and frame[3] == 0x4  # the emulator's SETTINGS frame
    assert _client(front.endpoint).list_streams()["StreamNames"] is not None  # HTTP/1.1 still


@pytest.mark.emulator
@pytest.mark.parametrize("flags", [(), ("--no-fanout",)])
def test_kinesis_dstream_local_prints_the_fanout_endpoint(flags):
    import os
    import subprocess
    import sys

    from processes import reap

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    cli = subprocess.Popen([sys.executable, "-m", "kinesis_dstream", "local",
                            "--fanout-lifetime", "7", *flags], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    try:
        exports = {}
        while len(exports) < 7:
            line = cli.stdout.readline()
            assert line, cli.stderr.read()
            name, _, value = line.removeprefix("export ").strip().partition("=")
            exports[name] = value
        endpoint = exports["AWS_ENDPOINT_URL_KINESIS"]
        kinesis = _client(endpoint)
        stream = emulators.unique_name("cli-fanout")
        emulators.create_stream(endpoint, stream, 1)
        consumer = emulators.register_consumer(endpoint, stream, "app")
        emulators.put_records(endpoint, stream, [b"a"])
        if flags:  # kinesis-local's own SubscribeToShard: botocore cannot read its answer
            with pytest.raises(Exception, match="initial-response"):
                _subscribe(kinesis, consumer)
        else:
            started = time.monotonic()
            reader = _subscribe(kinesis, consumer)
            reader.wait(lambda: reader.done.is_set(), timeout=12)
            assert reader.end == "ended" and reader.data() == [b"a"]
            assert 6.5 < time.monotonic() - started < 10  # --fanout-lifetime
        cli.terminate()
        assert cli.wait(timeout=20) == 0
    finally:
        reap(cli)


@pytest.mark.emulator
def test_an_unreachable_emulator_is_an_internal_failure():
    from kinesis_dstream.fanout_front import FanOutFront
    from kinesis_dstream.local import free_port

    with FanOutFront(f"http://127.0.0.1:{free_port()}") as front:
        kinesis = _client(front.endpoint)
        with pytest.raises(ClientError) as failed:
            kinesis.subscribe_to_shard(
                ConsumerARN="arn:aws:kinesis:us-east-1:000000000000:stream/s/consumer/c:1",
                ShardId=SHARD0, StartingPosition={"Type": "LATEST"})
        assert _code(failed) == "InternalFailureException"
        assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        with pytest.raises(ClientError) as passed_through:
            kinesis.list_streams()
        assert passed_through.value.response["ResponseMetadata"]["HTTPStatusCode"] == 502


@pytest.mark.unit
def test_the_fanout_endpoint_needs_kinesis_local():
    from kinesis_dstream.local import LocalStack

    with pytest.raises(ValueError, match="kinesis-local"):
        LocalStack("kinesalite", fanout=True)
    assert LocalStack("kinesalite").fanout is None
