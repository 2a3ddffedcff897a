"""A shard lease moving between two workers of one driver: no record counted twice, no
checkpoint lost or written beyond what the writing worker delivered. No Spark, no emulator:
the buffer and receiver are driven with fake peers, the forwarder with a fake channel and the
engine's real ShardCheckpointer."""
from __future__ import annotations

import logging
import threading
import time
from queue import Queue

import pytest

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.records import ExtendedSequenceNumber, Record
from kinesis_dstream.spark import channel, forwarder
from kinesis_dstream.spark.buffer import RecordBuffer
from kinesis_dstream.spark.receiver import KinesisReceiver, StreamSpec
from kinesis_dstream.worker.checkpoint import ShardCheckpointer
from kinesis_dstream.worker.processor import (
    InitializeInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)


def wire(first: int, last: int, sub: int = 0) -> list[tuple]:
    return [(f"r{i}".encode(), "pk", str(i), sub, 0) for i in range(first, last + 1)]


def pages(records: list[tuple], size: int) -> list[list[tuple]]:
    return [records[i:i + size] for i in range(0, len(records), size)]


def taken_sequence_numbers(buffer: RecordBuffer) -> list[int]:
    return [int(r[2]) for _, records in buffer.take() for r in records]


# --------------------------------------------------------------------------- buffer

def test_new_owner_rereading_51_to_150_after_1_to_100_gives_1_to_150_once() -> None:
    buffer = RecordBuffer(capacity=10_000)
    acks: list[str] = []
    for page in pages(wire(1, 100), 7):  # worker A
        buffer.put("s1", page, lambda: acks.append("A"))
    first = taken_sequence_numbers(buffer)  # a batch takes part of it before the move
    results = [buffer.put("s1", page, lambda: acks.append("B"))  # pages of 7 straddle 100
               for page in pages(wire(51, 150), 7)]
    assert first + taken_sequence_numbers(buffer) == list(range(1, 151))
    assert sum(r.dropped for r in results) == 50 and sum(r.accepted for r in results) == 50
    assert acks.count("B") == len(results)  # dropped pages are acked too: B keeps fetching
    assert buffer.highest("s1") == (150, 0)


def test_old_and_new_owner_delivering_at_once_still_give_each_record_once() -> None:
    buffer = RecordBuffer(capacity=10_000)
    a = pages(wire(1, 120), 10)
    for page in a[:4]:
        buffer.put("s1", page, lambda: None)
    # B steals with the lease at 30 (a checkpoint is never beyond what this driver received)
    # while A, not yet aware, goes on: their pages interleave as two reader threads may.
    a, b = a[4:], pages(wire(31, 160), 10)
    for i in range(max(len(a), len(b))):
        for worker in (a, b):
            if i < len(worker):
                buffer.put("s1", worker[i], lambda: None)
    assert taken_sequence_numbers(buffer) == list(range(1, 161))


def test_sub_sequences_of_an_aggregate_and_numeric_order() -> None:
    buffer = RecordBuffer(capacity=100)
    aggregate = [(b"x", "pk", "99", sub, 0) for sub in range(5)]
    buffer.put("s1", aggregate[:3], lambda: None)
    buffer.put("s1", aggregate, lambda: None)  # re-read from the aggregate's start
    buffer.put("s1", wire(100, 101), lambda: None)  # "100" < "99" as text, not as numbers
    assert [(r[2], r[3]) for _, rs in buffer.take() for r in rs] == \
        [("99", 0), ("99", 1), ("99", 2), ("99", 3), ("99", 4), ("100", 0), ("101", 0)]
    buffer.put("s2", wire(1, 3), lambda: None)  # shards are independent
    assert taken_sequence_numbers(buffer) == [1, 2, 3]


# --------------------------------------------------------------------------- receiver

class FakePeer:
    def __init__(self, worker_id: str):
        self.worker_id = worker_id
        self.closed = False
        self.sent: list[tuple] = []

    def send(self, message: tuple) -> bool:
        self.sent.append(message)
        return True

    def of_kind(self, kind: str) -> list[tuple]:
        return [m for m in self.sent if m[0] == kind]


@pytest.fixture
def receiver() -> KinesisReceiver:
    config = ConsumerConfig(application_name="app", stream_name="stream", region_name="us-east-1",
                            checkpoint_interval_ms=0)
    r = KinesisReceiver(StreamSpec(key="lease-move-unit", config=config.to_dict()))
    r.listening = True  # as if the StreamingListener were attached; no workers started
    return r


def run_batch(receiver: KinesisReceiver, time_ms: int) -> list[int]:
    runs = receiver.next_batch(time_ms)
    receiver.batch_completed(time_ms, succeeded=True, processing_delay_ms=1,
                             scheduling_delay_ms=0)
    return [int(r[2]) for _, records in runs for r in records]


def test_lease_move_between_two_workers_counts_once_and_checkpoints_via_the_new_owner(
        receiver, caplog) -> None:
    a, b = FakePeer("wA"), FakePeer("wB")
    caplog.set_level(logging.INFO, logger="kinesis_dstream.spark.receiver")
    receiver._on_message(a, (channel.INIT, "s1", "TRIM_HORIZON", 0))
    for page in pages(wire(1, 100), 10):
        receiver._on_message(a, (channel.RECORDS, "s1", page, 0))
    counted = run_batch(receiver, 1000)  # 1..100 processed
    assert a.of_kind(channel.CHECKPOINT) == [(channel.CHECKPOINT, "s1", "100", 0)]

    # B steals before A wrote it: the lease says 50. B's INIT comes before A's LOST.
    receiver._on_message(b, (channel.INIT, "s1", "50", 0))
    receiver._on_message(a, (channel.CHECKPOINTED, "s1", "100", 0, "ShutdownException"))
    receiver._on_message(a, (channel.LOST, "s1"))
    receiver._send_due_checkpoints(None)
    # Completed under A, B's to write now (B waits until it re-read that far).
    assert b.of_kind(channel.CHECKPOINT) == [(channel.CHECKPOINT, "s1", "100", 0)]
    for page in pages(wire(51, 150), 10):
        receiver._on_message(b, (channel.RECORDS, "s1", page, 0))
    counted += run_batch(receiver, 2000)
    assert counted == list(range(1, 151))
    assert b.of_kind(channel.CHECKPOINT)[-1] == (channel.CHECKPOINT, "s1", "150", 0)
    assert len(b.of_kind(channel.ACK)) == 10  # every page acked, dropped or not
    metrics = receiver.metrics()["s1"]
    assert (metrics["records"], metrics["duplicates_dropped"]) == (150, 50)
    assert (metrics["owner"], metrics["state"]) == ("wB", "processing")
    moves = [r.getMessage() for r in caplog.records if "re-read" in r.getMessage()]
    assert len(moves) == 1 and "wB re-read 50 record(s) of shard s1" in moves[0], moves

    # Shard end at B: confirmed at once (nothing of s1 is buffered or running), complete.
    receiver._on_message(b, (channel.DRAIN, "s1", "shard_end"))
    assert b.of_kind(channel.DRAINED) == [(channel.DRAINED, "s1", "150", 0, True)]
    assert a.of_kind(channel.DRAINED) == []


def test_shard_end_waits_for_the_old_owners_buffered_records(receiver) -> None:
    a, b = FakePeer("wA"), FakePeer("wB")
    receiver._on_message(a, (channel.INIT, "s1", None, None))
    receiver._on_message(a, (channel.RECORDS, "s1", wire(1, 30), 0))
    receiver._on_message(a, (channel.LOST, "s1"))
    receiver._on_message(b, (channel.INIT, "s1", "TRIM_HORIZON", 0))
    receiver._on_message(b, (channel.RECORDS, "s1", wire(1, 30), 0))  # all dropped
    receiver._on_message(b, (channel.DRAIN, "s1", "shard_end"))
    assert b.of_kind(channel.DRAINED) == []  # A's 30 records are still buffered
    assert run_batch(receiver, 1000) == list(range(1, 31))
    assert b.of_kind(channel.DRAINED) == [(channel.DRAINED, "s1", "30", 0, True)]


# --------------------------------------------------------------------------- forwarder

class FakeConnection:
    """The worker's end of the channel: records are acked, drains answered with ``drained``."""

    def __init__(self):
        self.sent: list[tuple] = []
        self.incoming: Queue = Queue()
        self.drained: tuple | None = None

    def send(self, message: tuple) -> None:
        self.sent.append(message)
        if message[0] == channel.RECORDS:
            self.incoming.put((channel.ACK, message[1]))
        elif message[0] == channel.DRAIN:
            self.incoming.put(self.drained)

    def recv(self) -> tuple:
        return self.incoming.get()  # the reader thread (a daemon) waits here at the end


def records(first: int, last: int) -> list[Record]:
    return [Record(f"r{i}".encode(), "pk", str(i), 0, 0) for i in range(first, last + 1)]


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + 5
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_checkpoint_beyond_what_was_delivered_waits_then_is_written(monkeypatch) -> None:
    conn = FakeConnection()
    monkeypatch.setattr(forwarder.channel, "connect", lambda address, key: conn)
    link = forwarder.DriverLink(("127.0.0.1", 1), "unused", "wB")
    processor = forwarder.ForwardingProcessor(link, "s1", drain_timeout_s=5)
    written: list[str] = []
    lock = threading.Lock()

    def writer(shard_id: str, position: ExtendedSequenceNumber) -> None:
        with lock:
            written.append(position.sequence_number)

    checkpointer = ShardCheckpointer("s1", writer, ExtendedSequenceNumber("50", 0))

    def deliver(first: int, last: int) -> None:
        batch = records(first, last)
        checkpointer.delivered(batch)  # as the engine does before process_records
        processor.process_records(ProcessRecordsInput(batch, checkpointer, 0))

    processor.initialize(InitializeInput("s1", "50", 0))
    # The driver asks for 150 (read by the previous owner) before B delivered anything.
    conn.incoming.put((channel.CHECKPOINT, "s1", "150", 0))
    wait_for(lambda: "s1" in link._pending, "the checkpoint to wait")
    deliver(51, 100)
    assert written == []
    deliver(101, 150)
    assert written == ["150"]
    assert (channel.CHECKPOINTED, "s1", "150", 0, None) in conn.sent

    # A later command not re-read yet, then shutdown: cut back to what B delivered (170).
    conn.incoming.put((channel.CHECKPOINT, "s1", "250", 0))
    wait_for(lambda: "s1" in link._pending, "the second checkpoint to wait")
    deliver(151, 170)
    conn.drained = (channel.DRAINED, "s1", "250", 0, True)
    processor.shutdown_requested(ShutdownRequestedInput(checkpointer))
    assert written == ["150", "170"]
    refused = [m for m in conn.sent if m[0] == channel.CHECKPOINTED and m[4] is not None]
    assert refused == []  # nothing was ever sent to the engine beyond what it delivered


def test_a_lost_lease_refuses_so_the_driver_sends_again(monkeypatch) -> None:
    conn = FakeConnection()
    monkeypatch.setattr(forwarder.channel, "connect", lambda address, key: conn)
    link = forwarder.DriverLink(("127.0.0.1", 1), "unused", "wA")
    processor = forwarder.ForwardingProcessor(link, "s1", drain_timeout_s=5)
    processor.initialize(InitializeInput("s1", "TRIM_HORIZON", 0))
    processor.lease_lost(None)
    conn.incoming.put((channel.CHECKPOINT, "s1", "10", 0))
    wait_for(lambda: (channel.CHECKPOINTED, "s1", "10", 0, "ShutdownException") in conn.sent,
             "the refusal")
    assert "s1" not in link._pending


def test_shard_end_after_a_move_writes_shard_end(monkeypatch) -> None:
    conn = FakeConnection()
    monkeypatch.setattr(forwarder.channel, "connect", lambda address, key: conn)
    link = forwarder.DriverLink(("127.0.0.1", 1), "unused", "wB")
    processor = forwarder.ForwardingProcessor(link, "s1", drain_timeout_s=5)
    written: list[str] = []
    checkpointer = ShardCheckpointer("s1", lambda s, p: written.append(p.sequence_number),
                                     ExtendedSequenceNumber("TRIM_HORIZON"))
    processor.initialize(InitializeInput("s1", "TRIM_HORIZON", 0))
    conn.incoming.put((channel.CHECKPOINT, "s1", "500", 0))  # beyond anything B will read
    wait_for(lambda: "s1" in link._pending, "the checkpoint to wait")
    batch = records(1, 20)
    checkpointer.delivered(batch)
    processor.process_records(ProcessRecordsInput(batch, checkpointer, 0))
    checkpointer.reached_shard_end()
    conn.drained = (channel.DRAINED, "s1", "20", 0, True)
    processor.shard_ended(ShardEndedInput(checkpointer))
    assert written == ["SHARD_END"]
    assert "s1" not in link._pending
