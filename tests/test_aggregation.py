"""KPL de-aggregation: keys and numbers kept, malformed aggregates delivered whole, never dropped."""
from __future__ import annotations

import datetime as dt
import hashlib
import logging

import pytest
from aws_kinesis_agg import MAGIC
from aws_kinesis_agg.aggregator import RecordAggregator

from kinesis_dstream.aws.kpl import deaggregate, epoch_ms, messages_pb2

pytestmark = pytest.mark.unit

ARRIVAL = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.timezone.utc)
ARRIVAL_MS = 1714979289123


def kinesis_record(data: bytes,
                   sequence_number: str = "49650000000000000000000000000000000000000000000000000001",
                   partition_key: str = "outer-key") -> dict:
    return {"Data": data, "PartitionKey": partition_key, "SequenceNumber": sequence_number,
            "ApproximateArrivalTimestamp": ARRIVAL}


def aggregate(users: list[tuple[str, bytes]], explicit_hash_keys: dict[int, str] | None = None
              ) -> tuple[str, bytes]:
    """(outer partition key, blob) of one KPL aggregate built by aws-kinesis-agg."""
    aggregator = RecordAggregator()
    for index, (key, data) in enumerate(users):
        ehk = (explicit_hash_keys or {}).get(index)
        assert aggregator.add_user_record(key, data, ehk) is None
    pk, _ehk, blob = aggregator.clear_and_get().get_contents()
    return pk, blob


def framed(message: messages_pb2.AggregatedRecord) -> bytes:
    body = message.SerializeToString()
    return MAGIC + body + hashlib.md5(body).digest()


def test_plain_records_pass_through_with_their_numbers():
    records = deaggregate([kinesis_record(b"hello", "101", "k1"),
                           kinesis_record(b"", "102", "k2")], "shardId-000000000003")
    assert [(r.binary_data, r.partition_key, r.sequence_number, r.sub_sequence_number,
             r.aggregated, r.shard_id, r.explicit_hash_key) for r in records] == [
        (b"hello", "k1", "101", 0, False, "shardId-000000000003", None),
        (b"", "k2", "102", 0, False, "shardId-000000000003", None),
    ]
    assert records[0].approximate_arrival_timestamp == ARRIVAL_MS


def test_aggregate_yields_user_records_with_their_own_keys_and_sub_sequence_numbers():
    users = [("alpha", b"a" * 10), ("beta", b"b"), ("alpha", b"c" * 300), ("gamma", b"")]
    outer_key, blob = aggregate(users, explicit_hash_keys={1: "12345678901234567890"})
    assert outer_key == "alpha"
    records = deaggregate([kinesis_record(blob, "555", outer_key)], "shardId-0")
    assert [(r.partition_key, r.binary_data, r.sub_sequence_number) for r in records] == [
        (key, data, index) for index, (key, data) in enumerate(users)]
    assert all(r.sequence_number == "555" and r.aggregated for r in records)
    assert all(r.approximate_arrival_timestamp == ARRIVAL_MS for r in records)
    assert records[1].explicit_hash_key == "12345678901234567890"
    assert records[0].explicit_hash_key is None


def test_mixed_batch_keeps_shard_order():
    _, blob = aggregate([("x", b"1"), ("y", b"2")])
    records = deaggregate([kinesis_record(b"p1", "1"), kinesis_record(blob, "2"),
                           kinesis_record(b"p3", "3")], "s")
    assert [(r.sequence_number, r.sub_sequence_number, r.binary_data) for r in records] == [
        ("1", 0, b"p1"), ("2", 0, b"1"), ("2", 1, b"2"), ("3", 0, b"p3")]


def _assert_delivered_whole(blob: bytes, caplog: pytest.LogCaptureFixture, reason: str) -> None:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.aws.kpl"):
        records = deaggregate([kinesis_record(b"before", "10"), kinesis_record(blob, "11", "pk"),
                               kinesis_record(b"after", "12")], "shardId-000000000007")
    assert [r.binary_data for r in records] == [b"before", blob, b"after"]
    bad = records[1]
    assert (bad.partition_key, bad.sequence_number, bad.sub_sequence_number, bad.aggregated) == (
        "pk", "11", 0, False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "shardId-000000000007" in warnings[0] and "11" in warnings[0]
    assert reason in warnings[0]


def test_bad_checksum_is_delivered_as_one_plain_record(caplog):
    _, blob = aggregate([("a", b"one"), ("b", b"two")])
    corrupt = blob[:-1] + bytes([blob[-1] ^ 0xFF])
    _assert_delivered_whole(corrupt, caplog, "checksum")


def test_truncated_aggregate_is_delivered_as_one_plain_record(caplog):
    _, blob = aggregate([("a", b"one" * 50), ("b", b"two" * 50)])
    _assert_delivered_whole(blob[: len(blob) // 2], caplog, "checksum")
    _assert_delivered_whole(MAGIC + b"\x00" * 5, caplog, "truncated")
    _assert_delivered_whole(MAGIC, caplog, "truncated")


def test_garbage_after_magic_with_valid_checksum_is_delivered_whole(caplog):
    garbage = b"\xff\xfe\xfd not a protobuf"
    _assert_delivered_whole(MAGIC + garbage + hashlib.md5(garbage).digest(), caplog, "protobuf")


def test_out_of_range_key_index_is_delivered_whole(caplog):
    message = messages_pb2.AggregatedRecord()
    message.partition_key_table.append("only")
    message.records.add(partition_key_index=0, data=b"fine")
    message.records.add(partition_key_index=3, data=b"bad index")
    _assert_delivered_whole(framed(message), caplog, "partition key index")

    message = messages_pb2.AggregatedRecord()
    message.partition_key_table.append("only")
    message.records.add(partition_key_index=0, explicit_hash_key_index=1, data=b"x")
    _assert_delivered_whole(framed(message), caplog, "explicit hash key index")


def test_aggregate_without_user_records_is_delivered_whole(caplog):
    message = messages_pb2.AggregatedRecord()
    message.partition_key_table.append("k")
    _assert_delivered_whole(framed(message), caplog, "no user records")


def test_nothing_is_printed_to_stderr(capsys):
    _, blob = aggregate([("a", b"one")])
    deaggregate([kinesis_record(blob[:-3]), kinesis_record(MAGIC + b"junk" * 10)], "s")
    assert capsys.readouterr().err == ""


def test_epoch_ms_accepts_datetimes_and_epoch_seconds():
    assert epoch_ms(ARRIVAL) == ARRIVAL_MS
    assert epoch_ms(ARRIVAL.replace(tzinfo=None)) == ARRIVAL_MS
    assert epoch_ms(1714979289.123) == ARRIVAL_MS
    assert epoch_ms(None) == 0


def test_many_aggregates_round_trip():
    users = [(f"key-{i % 37}", f"payload-{i}".encode()) for i in range(5000)]
    batch, sequence = [], 1000
    for start in range(0, len(users), 250):
        _, blob = aggregate(users[start:start + 250])
        batch.append(kinesis_record(blob, str(sequence)))
        sequence += 1
    records = deaggregate(batch, "s")
    assert [(r.partition_key, r.binary_data) for r in records] == users
    assert [r.sub_sequence_number for r in records[:251]] == list(range(250)) + [0]
