"""KinesisDataFetcher against kinesis-local: positions, aggregates, shard end, failures.

Expected records are computed from what the producer helpers report (shard, sequence number,
user records inside each aggregate), so every assertion is on keys and numbers, not counts.
"""
from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from emulators import client as boto_client
from emulators import wait_stream_active

from kinesis_dstream.aws.kinesis import KinesisClient
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import (
    ConfigurationError,
    EndpointUnreachableError,
    ExpiredIteratorError,
    RetriesExhaustedError,
    StreamNotFoundError,
)
from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY
from kinesis_dstream.records import ExtendedSequenceNumber, Record
from kinesis_dstream.retrieval import KinesisDataFetcher

pytestmark = pytest.mark.timeout(120)

UNUSED_ENDPOINT = "http://127.0.0.1:9"
Key = tuple  # (sequence_number, sub_sequence_number, partition_key, data, aggregated)


def config_for(endpoint: str, stream: str, **overrides: Any) -> ConsumerConfig:
    settings: dict[str, Any] = dict(
        application_name="fetcher-tests", stream_name=stream, region_name=DUMMY_REGION,
        kinesis_endpoint=endpoint, aws_access_key_id=DUMMY_ACCESS_KEY_ID,
        aws_secret_key=DUMMY_SECRET_ACCESS_KEY, initial_position="TRIM_HORIZON")
    settings.update(overrides)
    return ConsumerConfig(**settings)


def only_shard(kinesis: KinesisClient) -> str:
    shards = [s.shard_id for s in kinesis.list_shards()]
    assert len(shards) == 1, shards
    return shards[0]


def key(record: Record) -> Key:
    return (record.sequence_number, record.sub_sequence_number, record.partition_key,
            record.binary_data, record.aggregated)


def drain(fetcher: KinesisDataFetcher, max_calls: int = 200) -> list[Record]:
    """Records until the fetcher is at the tip (empty answer, 0 ms behind) or the shard ends."""
    out: list[Record] = []
    for _ in range(max_calls):
        result = fetcher.get_records()
        out += result.records
        if result.shard_end:
            return out
        if not result.records and result.millis_behind_latest == 0:
            return out
    raise AssertionError(f"shard {fetcher.shard_id} not drained in {max_calls} calls")


@pytest.fixture
def shard_with_mixed_records(make_stream, put_records, put_aggregated, kinesis_local):
    """A 1-shard stream holding plain, aggregated, plain, aggregated records; expected keys."""
    stream = make_stream(1)
    expected: list[Key] = []
    for round_ in range(2):
        plain = put_records(stream, [(f"plain-{round_}-{i}", f"p{round_}-{i}".encode())
                                     for i in range(5)])
        expected += [(p.sequence_number, 0, p.partition_key, p.data, False) for p in plain]
        users = [(f"user-{round_}-{i % 7}", f"u{round_}-{i}".encode()) for i in range(45)]
        for agg in put_aggregated(stream, users, per_aggregate=20):
            expected += [(agg.sequence_number, sub, pk, data, True)
                         for sub, (pk, data) in enumerate(agg.user_records)]
    return stream, expected


@pytest.mark.emulator
def test_trim_horizon_reads_plain_and_aggregated_records_with_keys_and_numbers(
        kinesis_local, shard_with_mixed_records):
    stream, expected = shard_with_mixed_records
    kinesis = KinesisClient(config_for(kinesis_local, stream))
    shard_id = only_shard(kinesis)
    fetcher = KinesisDataFetcher(kinesis, config_for(kinesis_local, stream, max_records=3),
                                 shard_id)
    fetcher.initialize(ExtendedSequenceNumber.TRIM_HORIZON)
    records = drain(fetcher)
    assert [key(r) for r in records] == expected
    assert {r.shard_id for r in records} == {shard_id}
    assert all(r.approximate_arrival_timestamp > 1_600_000_000_000 for r in records)
    assert fetcher.last_delivered == records[-1].extended_sequence_number
    assert fetcher.millis_behind_latest == 0


@pytest.mark.emulator
def test_restart_inside_an_aggregate_delivers_exactly_the_rest(kinesis_local,
                                                              shard_with_mixed_records):
    stream, expected = shard_with_mixed_records
    config = config_for(kinesis_local, stream)
    kinesis = KinesisClient(config)
    shard_id = only_shard(kinesis)
    aggregated_at = [i for i, e in enumerate(expected) if e[4] and e[1] == 7]
    plain_at = [i for i, e in enumerate(expected) if not e[4]]
    for index in (aggregated_at[0], plain_at[2], plain_at[-1], len(expected) - 1):
        seq, sub = expected[index][0], expected[index][1]
        fetcher = KinesisDataFetcher(kinesis, config, shard_id)
        fetcher.initialize(ExtendedSequenceNumber(seq, sub))
        assert [key(r) for r in drain(fetcher)] == expected[index + 1:], (seq, sub)


@pytest.mark.emulator
def test_latest_and_at_timestamp(kinesis_local, make_stream, put_records):
    stream = make_stream(1)
    before = put_records(stream, [("k", b"before")])
    config = config_for(kinesis_local, stream)
    kinesis = KinesisClient(config)
    shard_id = only_shard(kinesis)
    latest = KinesisDataFetcher(kinesis, config, shard_id)
    latest.initialize(ExtendedSequenceNumber.LATEST)
    time.sleep(1.2)  # arrival timestamps have a resolution; keep the two batches apart
    boundary = time.time()
    time.sleep(0.3)
    after = put_records(stream, [("k", b"after-1"), ("k", b"after-2")])
    assert [r.binary_data for r in drain(latest)] == [b"after-1", b"after-2"]

    at_ts_config = config_for(kinesis_local, stream, initial_position="AT_TIMESTAMP",
                              initial_position_timestamp=boundary)
    at_ts = KinesisDataFetcher(kinesis, at_ts_config, shard_id)
    at_ts.initialize(ExtendedSequenceNumber.AT_TIMESTAMP)
    assert [r.sequence_number for r in drain(at_ts)] == [a.sequence_number for a in after]
    assert before[0].sequence_number not in {a.sequence_number for a in after}


class NoCalls:
    """A Kinesis client that must not be called."""

    def __getattr__(self, name):
        raise AssertionError(f"unexpected Kinesis call {name}")


@pytest.mark.unit
def test_shard_end_checkpoint_reports_shard_end_without_reading():
    fetcher = KinesisDataFetcher(NoCalls(), config_for(UNUSED_ENDPOINT, "unused"), "shardId-1")
    fetcher.initialize(ExtendedSequenceNumber.SHARD_END)
    result = fetcher.get_records()
    assert result.shard_end and result.records == []


@pytest.mark.emulator
def test_split_parent_reaches_shard_end_with_child_ids(kinesis_local, make_stream, put_records,
                                                      put_aggregated):
    stream = make_stream(1)
    config = config_for(kinesis_local, stream, max_records=4)
    kinesis = KinesisClient(config)
    parent = only_shard(kinesis)
    plain = put_records(stream, [(f"k{i}", f"v{i}".encode()) for i in range(10)])
    aggs = put_aggregated(stream, [(f"a{i}", f"w{i}".encode()) for i in range(30)],
                          per_aggregate=10)
    fetcher = KinesisDataFetcher(kinesis, config, parent)
    fetcher.initialize(ExtendedSequenceNumber.TRIM_HORIZON)
    first = fetcher.get_records()  # read part of it before the split
    assert not first.shard_end

    raw = boto_client("kinesis", kinesis_local)
    raw.split_shard(StreamName=stream, ShardToSplit=parent, NewStartingHashKey=str(2**127))
    wait_stream_active(raw, stream)

    records = list(first.records)
    result = None
    for _ in range(50):
        result = fetcher.get_records()
        records += result.records
        if result.shard_end:
            break
    assert result is not None and result.shard_end
    expected = ([(p.sequence_number, 0) for p in plain]
                + [(a.sequence_number, sub) for a in aggs for sub in range(len(a.user_records))])
    assert [(r.sequence_number, r.sub_sequence_number) for r in records] == expected

    shards = kinesis.list_shards()
    children = sorted(s.shard_id for s in shards if parent in s.parent_shard_ids)
    assert len(children) == 2
    assert sorted(result.child_shard_ids) == children
    assert sorted(fetcher.child_shard_ids) == children
    closed = [s for s in shards if s.shard_id == parent][0]
    assert closed.is_closed
    # Once at the end, it stays there without calling Kinesis again.
    again = fetcher.get_records()
    assert again.shard_end and again.records == [] and sorted(again.child_shard_ids) == children


@pytest.mark.emulator
def test_wrong_stream_name_fails_at_once_naming_it(kinesis_local):
    name = "no-such-stream-fetcher-test"
    kinesis = KinesisClient(config_for(kinesis_local, name))
    with pytest.raises(StreamNotFoundError) as info:
        kinesis.describe_stream_summary()
    assert name in str(info.value) and kinesis_local in str(info.value)
    fetcher = KinesisDataFetcher(kinesis, config_for(kinesis_local, name), "shardId-000000000000")
    with pytest.raises(StreamNotFoundError):
        fetcher.initialize(ExtendedSequenceNumber.TRIM_HORIZON)


@pytest.mark.unit
@pytest.mark.timeout(20)
def test_unreachable_endpoint_fails_naming_it():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = config_for(endpoint, "any-stream", connect_timeout_s=1.0)
    fetcher = KinesisDataFetcher(KinesisClient(config), config, "shardId-000000000000")
    with pytest.raises(EndpointUnreachableError) as info:
        fetcher.initialize(ExtendedSequenceNumber.TRIM_HORIZON)
    assert endpoint in str(info.value)


class ExpiringKinesis:
    """A real KinesisClient whose GetRecords raises ExpiredIteratorError on chosen calls."""

    def __init__(self, inner: KinesisClient, expire_on_calls: set[int]) -> None:
        self._inner = inner
        self._expire_on = expire_on_calls
        self.calls = 0
        self.iterator_requests: list[tuple] = []

    def get_records(self, iterator: str, limit: int, *, shard_id: str = "") -> dict:
        self.calls += 1
        if self.calls in self._expire_on:
            raise ExpiredIteratorError("injected: iterator expired")
        return self._inner.get_records(iterator, limit, shard_id=shard_id)

    def get_shard_iterator(self, shard_id: str, iterator_type: str, **kwargs: Any) -> str:
        self.iterator_requests.append((iterator_type, kwargs.get("sequence_number")))
        return self._inner.get_shard_iterator(shard_id, iterator_type, **kwargs)


@pytest.mark.emulator
def test_expired_iterator_resumes_after_the_last_delivered_record(kinesis_local,
                                                                  shard_with_mixed_records):
    stream, expected = shard_with_mixed_records
    config = config_for(kinesis_local, stream, max_records=4)
    inner = KinesisClient(config)
    shard_id = only_shard(inner)
    # Expire before anything was delivered (call 1), mid-way (3 and 5) and twice in a row.
    kinesis = ExpiringKinesis(inner, {1, 3, 5, 6})
    fetcher = KinesisDataFetcher(kinesis, config, shard_id)
    fetcher.initialize(ExtendedSequenceNumber.TRIM_HORIZON)
    records: list[Record] = []
    for _ in range(100):
        try:
            result = fetcher.get_records()
        except ExpiredIteratorError:
            continue  # expired twice in a row: the caller just calls again
        records += result.records
        if not result.records and result.millis_behind_latest == 0:
            break
    assert [key(r) for r in records] == expected
    assert kinesis.iterator_requests[:2] == [("TRIM_HORIZON", None), ("TRIM_HORIZON", None)]
    assert all(kind == "AT_SEQUENCE_NUMBER" for kind, _ in kinesis.iterator_requests[2:])


@pytest.mark.emulator
def test_expired_iterator_from_a_checkpoint_inside_an_aggregate(kinesis_local,
                                                                shard_with_mixed_records):
    stream, expected = shard_with_mixed_records
    config = config_for(kinesis_local, stream)
    inner = KinesisClient(config)
    index = [i for i, e in enumerate(expected) if e[4] and e[1] == 3][1]
    kinesis = ExpiringKinesis(inner, {1})
    fetcher = KinesisDataFetcher(kinesis, config, only_shard(inner))
    fetcher.initialize(ExtendedSequenceNumber(expected[index][0], 3))
    assert [key(r) for r in drain(fetcher)] == expected[index + 1:]


@pytest.mark.emulator
def test_throttling_past_the_retries_loses_nothing(kinesis_local, shard_with_mixed_records,
                                                   make_fault_proxy):
    stream, expected = shard_with_mixed_records
    proxy = make_fault_proxy(share=0.6, seed=7)
    config = config_for(proxy.endpoint, stream, max_records=2, retry_max_attempts=2,
                        retry_wait_time_ms=1)
    kinesis = KinesisClient(config)
    fetcher = KinesisDataFetcher(kinesis, config, only_shard(kinesis))
    fetcher.initialize(ExtendedSequenceNumber.TRIM_HORIZON)
    records: list[Record] = []
    exhausted = 0
    for _ in range(500):
        try:
            result = fetcher.get_records()
        except RetriesExhaustedError:
            exhausted += 1  # the shard consumer would wait here, then call again
            continue
        records += result.records
        if not result.records and result.millis_behind_latest == 0:
            break
    assert [key(r) for r in records] == expected
    assert exhausted > 0 and proxy.injected > exhausted


@pytest.mark.unit
def test_at_timestamp_checkpoint_without_a_timestamp_is_a_clear_configuration_error():
    fetcher = KinesisDataFetcher(NoCalls(), config_for(UNUSED_ENDPOINT, "unused"), "shardId-9")
    with pytest.raises(ConfigurationError, match="shardId-9.*initial_position_timestamp"):
        fetcher.initialize(ExtendedSequenceNumber.AT_TIMESTAMP)
