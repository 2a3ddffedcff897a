"""KinesisProducer against kinesis-local: KPL aggregates land on the right shards, limits hold,
failed PutRecords entries are retried, and a give-up names the stream and the count."""
from __future__ import annotations

import hashlib
import random
from collections import Counter
from typing import Any

import pytest

from emulators import client, list_shard_ids, read_all
from fault_proxy import FaultProxy

from kinesis_dstream.aws.clients import error_for_code
from kinesis_dstream.aws.kpl import deaggregate
from kinesis_dstream.aws.producer import (
    MAX_RECORD_BYTES,
    PUT_RECORDS_RETRY,
    KinesisProducer,
)
from kinesis_dstream.aws.shard_map import hash_key_of
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import ConfigurationError, PutRecordsFailedError, ThrottlingError
from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY
from kinesis_dstream.retry import RetryPolicy, classify

pytestmark = pytest.mark.timeout(240)


def producer_config(stream: str, endpoint: str) -> ConsumerConfig:
    return ConsumerConfig(application_name="producer-test", stream_name=stream,
                          region_name=DUMMY_REGION, kinesis_endpoint=endpoint,
                          aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                          aws_secret_key=DUMMY_SECRET_ACCESS_KEY)


def shard_ranges(endpoint: str, stream: str) -> dict[str, tuple[int, int]]:
    shards = client("kinesis", endpoint).list_shards(StreamName=stream)["Shards"]
    return {s["ShardId"]: (int(s["HashKeyRange"]["StartingHashKey"]),
                           int(s["HashKeyRange"]["EndingHashKey"])) for s in shards}


def read_back(endpoint: str, stream: str) -> tuple[list[dict[str, Any]], list[Any]]:
    """Kinesis records and the user records de-aggregated from them, shard by shard."""
    raw = read_all(endpoint, stream, timeout=120)
    users = []
    for shard_id in list_shard_ids(endpoint, stream):
        users.extend(deaggregate([r for r in raw if r["ShardId"] == shard_id], shard_id))
    return raw, users


def assert_on_own_shards(users: list[Any], ranges: dict[str, tuple[int, int]]) -> None:
    misplaced = []
    for user in users:
        start, end = ranges[user.shard_id]
        key = hash_key_of(user.partition_key, user.explicit_hash_key)
        if not start <= key <= end:
            misplaced.append((user.partition_key, user.shard_id))
    assert not misplaced, f"{len(misplaced)} records on a shard not holding their key: " \
                          f"{misplaced[:5]}"


@pytest.mark.emulator
def test_ten_thousand_aggregated_records_land_once_each_on_their_own_shard(
        kinesis_local, make_stream):
    stream = make_stream(4)
    ehk_records = {f"ehk-{i}": str(random.Random(i).randrange(2**128)) for i in range(50)}
    with KinesisProducer(producer_config(stream, kinesis_local)) as producer:
        for i in range(10_000):
            producer.put(f"record-{i}".encode(), f"key-{i % 997}")
        for data, ehk in ehk_records.items():
            producer.put(data, "same-key-for-all", explicit_hash_key=ehk)
    raw, users = read_back(kinesis_local, stream)

    counts = Counter(u.binary_data for u in users)
    expected = {f"record-{i}".encode() for i in range(10_000)} | {d.encode() for d in ehk_records}
    assert set(counts) == expected
    assert max(counts.values()) == 1, "a record came back twice"
    assert_on_own_shards(users, shard_ranges(kinesis_local, stream))
    by_data = {u.binary_data: u for u in users}
    assert all(by_data[d.encode()].explicit_hash_key == ehk for d, ehk in ehk_records.items())
    assert len({u.shard_id for u in users}) == 4
    assert len(raw) < 10_050 / 50, f"{len(raw)} Kinesis records for 10,050 user records"
    assert producer.stats.kinesis_records == len(raw)


@pytest.mark.emulator
def test_plain_mode_puts_one_kinesis_record_per_user_record(kinesis_local, make_stream):
    stream = make_stream(2)
    with KinesisProducer(producer_config(stream, kinesis_local), aggregation=False) as producer:
        producer.put_many((f"plain-{i}", f"k{i}") for i in range(300))
    raw, users = read_back(kinesis_local, stream)
    assert len(raw) == 300
    assert not any(u.aggregated for u in users)
    assert sorted(u.binary_data for u in users) == sorted(f"plain-{i}".encode() for i in range(300))
    assert_on_own_shards(users, shard_ranges(kinesis_local, stream))


@pytest.mark.emulator
def test_aggregates_respect_the_size_limit_and_big_records_go_plain(kinesis_local, make_stream):
    stream = make_stream(2)
    big = b"B" * (MAX_RECORD_BYTES - 100)
    with KinesisProducer(producer_config(stream, kinesis_local),
                         aggregation_max_bytes=4000) as producer:
        for i in range(400):
            producer.put(b"x" * 90 + str(i).encode(), f"k{i}")
        producer.put(big, "big-one")
    raw, users = read_back(kinesis_local, stream)
    assert all(len(r["Data"]) + len(r["PartitionKey"].encode()) <= 4000
               for r in raw if len(r["Data"]) < 10_000)
    assert len(users) == 401
    big_ones = [u for u in users if u.binary_data == big]
    assert len(big_ones) == 1 and not big_ones[0].aggregated
    assert_on_own_shards(users, shard_ranges(kinesis_local, stream))
    with pytest.raises(ConfigurationError, match="record limit"):
        KinesisProducer(producer_config(stream, kinesis_local)).put(b"x" * MAX_RECORD_BYTES, "k")


@pytest.mark.emulator
def test_failed_entries_are_sent_again_until_written(kinesis_local, make_stream):
    stream = make_stream(2)
    with FaultProxy(kinesis_local, share=0.0, seed=7, put_failure_share=0.3) as proxy:
        producer = KinesisProducer(producer_config(stream, proxy.endpoint), aggregation=False,
                                   retry=RetryPolicy(wait_time_ms=1, max_attempts=10),
                                   sleep=lambda s: None)
        producer.put_many((f"r-{i}", f"k{i}") for i in range(400))
        producer.close()
    assert proxy.put_entries_failed > 50
    assert producer.stats.entries_retried == proxy.put_entries_failed
    _, users = read_back(kinesis_local, stream)
    assert Counter(u.binary_data for u in users) == Counter(f"r-{i}".encode() for i in range(400))


@pytest.mark.emulator
def test_gives_up_naming_the_stream_and_the_count(kinesis_local, make_stream):
    stream = make_stream(1)
    waits: list[float] = []
    with FaultProxy(kinesis_local, share=0.0, seed=1, put_failure_share=1.0) as proxy:
        producer = KinesisProducer(producer_config(stream, proxy.endpoint), aggregation=False,
                                   retry=RetryPolicy(wait_time_ms=10, max_attempts=4),
                                   sleep=waits.append, rand=lambda: 0.5)
        producer.put_many((f"r-{i}", f"k{i}") for i in range(30))
        with pytest.raises(PutRecordsFailedError) as failure:
            producer.flush()
    assert failure.value.not_written == 30
    assert str(failure.value) == (
        f"30 records not written to stream {stream!r}: Gave up after 4 attempts while putting "
        "records: error codes {'ProvisionedThroughputExceededException': 30}")
    assert isinstance(failure.value.last_error, ThrottlingError)
    assert proxy.put_entries_failed == 4 * 30
    assert producer.stats.entries_retried == 3 * 30
    # 10 ms doubling, each wait between half and all of it (rand 0.5: three quarters).
    assert waits == pytest.approx([0.0075, 0.015, 0.03])
    assert producer.buffered_records() == 0


@pytest.mark.emulator
def test_failed_entries_stop_at_the_deadline_on_the_producers_clock(kinesis_local, make_stream):
    stream = make_stream(1)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with FaultProxy(kinesis_local, share=0.0, seed=1, put_failure_share=1.0) as proxy:
        producer = KinesisProducer(producer_config(stream, proxy.endpoint), aggregation=False,
                                   retry=RetryPolicy(wait_time_ms=1000, max_attempts=10,
                                                     max_wait_ms=5000, deadline_ms=10_000),
                                   sleep=sleep, clock=lambda: now[0], rand=lambda: 1.0)
        producer.put("r", "k")
        with pytest.raises(PutRecordsFailedError, match="Gave up after 4 attempts within 10 s"):
            producer.flush()
    assert now[0] == pytest.approx(1 + 2 + 4)   # the next wait (5 s) would end past 10 s
    assert proxy.put_entries_failed == 4


@pytest.mark.emulator
@pytest.mark.parametrize("code,retried", [("InternalFailure", True),
                                           ("KMSDisabledException", False)])
def test_entries_are_sent_again_only_for_codes_worth_retrying(kinesis_local, make_stream,
                                                              code, retried):
    stream = make_stream(1)
    with FaultProxy(kinesis_local, share=0.0, seed=3, put_failure_share=1.0,
                    max_put_failures=5, put_failure_code=code) as proxy:
        producer = KinesisProducer(producer_config(stream, proxy.endpoint), aggregation=False,
                                   sleep=lambda s: None)
        producer.put_many((f"r-{i}", f"k{i}") for i in range(5))
        if retried:
            producer.flush()
        else:
            with pytest.raises(PutRecordsFailedError, match=rf"not retryable: \['{code}'\]"):
                producer.flush()
    assert proxy.put_entries_failed == 5
    assert producer.stats.entries_retried == (5 if retried else 0)
    assert producer.stats.put_records_calls == (2 if retried else 1)


@pytest.mark.unit
def test_the_default_entry_retry_is_ten_tries_within_two_minutes_up_to_five_seconds_apart():
    assert (PUT_RECORDS_RETRY.max_attempts, PUT_RECORDS_RETRY.deadline_ms,
            PUT_RECORDS_RETRY.wait_time_ms, PUT_RECORDS_RETRY.max_wait_ms) == (10, 120_000, 100, 5000)


@pytest.mark.unit
@pytest.mark.parametrize("code,kind", [
    ("ProvisionedThroughputExceededException", "throttling"),
    ("InternalFailure", "transient"), ("ServiceUnavailable", "transient"),
    ("KMSThrottlingException", "transient"),
    ("KMSDisabledException", "permanent"), ("KMSNotFoundException", "permanent"),
    ("KMSAccessDeniedException", "permanent"), ("AccessDeniedException", "permanent"),
])
def test_put_records_entry_codes_are_read_by_the_one_table(code, kind):
    """The codes PutRecords puts on an entry: retried exactly when they were before."""
    assert classify(error_for_code(code, "entry")) == kind


@pytest.mark.emulator
def test_explicit_hash_key_decides_the_shard_not_the_partition_key(kinesis_local, make_stream):
    stream = make_stream(4)
    ranges = shard_ranges(kinesis_local, stream)
    with KinesisProducer(producer_config(stream, kinesis_local)) as producer:
        for shard_id, (start, _end) in ranges.items():
            for i in range(5):
                producer.put(f"{shard_id}-{i}", "one-key", explicit_hash_key=str(start + i))
    _, users = read_back(kinesis_local, stream)
    assert len(users) == 20
    assert all(u.binary_data.decode().startswith(u.shard_id) for u in users)
    md5_shard = [s for s, (a, b) in ranges.items()
                 if a <= int.from_bytes(hashlib.md5(b"one-key").digest(), "big") <= b]
    assert len(md5_shard) == 1  # so three of the four groups prove the hash key won


@pytest.mark.emulator
def test_a_reshard_reloads_the_shard_map(kinesis_local, make_stream):
    """After a split the first aggregate may land on one child (KPL behaviour too); the answer's
    ShardId tells the producer, which reloads the map, so later records are placed right."""
    stream = make_stream(1)
    kinesis = client("kinesis", kinesis_local)
    producer = KinesisProducer(producer_config(stream, kinesis_local))
    producer.put_many((f"before-{i}", f"k{i}") for i in range(100))
    producer.flush()
    parent = list_shard_ids(kinesis_local, stream)[0]
    kinesis.split_shard(StreamName=stream, ShardToSplit=parent,
                        NewStartingHashKey=str(2**127))
    from emulators import wait_stream_active
    wait_stream_active(kinesis, stream)
    producer.put_many((f"during-{i}", f"k{i}") for i in range(100))
    producer.flush()   # grouped with the old map: all for the parent, lands on one child
    producer.put_many((f"after-{i}", f"k{i}") for i in range(100))
    producer.close()
    assert producer.stats.shard_map_refreshes == 2
    _, users = read_back(kinesis_local, stream)
    assert Counter(u.binary_data.decode().split("-")[0] for u in users) == \
        {"before": 100, "during": 100, "after": 100}
    after = [u for u in users if u.binary_data.startswith(b"after-")]
    assert_on_own_shards(after, shard_ranges(kinesis_local, stream))
    assert len({u.shard_id for u in after}) == 2


@pytest.mark.unit
def test_computed_aggregate_size_is_the_encoded_size():
    """The limits are checked on a computed size; it must be the real one, byte for byte."""
    from kinesis_dstream.aws.kpl import Aggregate

    rng = random.Random(3)
    for trial in range(200):
        aggregate = Aggregate("shard")
        for _ in range(rng.randrange(1, 60)):
            key = "k" * rng.choice((1, 5, 127, 128, 200)) + str(rng.randrange(4))
            ehk = str(rng.randrange(2**128)) if rng.random() < 0.3 else None
            data = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 127, 128, 300))))
            assert aggregate.try_add(key, key.encode(), ehk, data, hash_key_of(key, ehk),
                                     MAX_RECORD_BYTES)
        encoded = aggregate.encode()
        assert aggregate.kinesis_bytes(aggregate.body_bytes, aggregate.first_key) == \
            len(encoded) + len(aggregate.first_key.encode()), f"trial {trial}"
        assert deaggregate([{"Data": encoded, "PartitionKey": aggregate.first_key,
                             "SequenceNumber": "1"}], "shard")[0].aggregated


@pytest.mark.emulator
def test_records_wait_at_most_the_buffered_time(kinesis_local, make_stream):
    stream = make_stream(1)
    now = [100.0]
    producer = KinesisProducer(producer_config(stream, kinesis_local),
                               record_max_buffered_time_ms=1000, clock=lambda: now[0])
    producer.put_many((f"r{i}", "k") for i in range(10))
    now[0] += 0.9
    producer.put("r10", "k")
    assert producer.stats.put_records_calls == 0 and producer.buffered_records() == 11
    now[0] += 0.1
    producer.put("r11", "k")
    assert producer.stats.put_records_calls == 1 and producer.buffered_records() == 0
    _, users = read_back(kinesis_local, stream)
    assert len(users) == 12


@pytest.mark.emulator
def test_concurrent_connections_write_every_record_once(kinesis_local, make_stream):
    import threading

    stream = make_stream(2)
    real = client("kinesis", kinesis_local)
    in_flight, peak, lock = [0], [0], threading.Lock()

    class CountingClient:
        """The real client; counts PutRecords calls in flight at once."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def put_records(self, **kwargs: Any) -> Any:
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
            try:
                return real.put_records(**kwargs)
            finally:
                with lock:
                    in_flight[0] -= 1

    with KinesisProducer(producer_config(stream, kinesis_local), aggregation=False,
                         max_connections=3, record_max_buffered_time_ms=60_000,
                         client=CountingClient()) as producer:
        producer.put_many((f"c-{i}", f"k{i}") for i in range(2600))
    assert producer.stats.put_records_calls == 6  # 500 x 5 + 100
    assert peak[0] >= 2
    _, users = read_back(kinesis_local, stream)
    assert Counter(u.binary_data for u in users) == Counter(f"c-{i}".encode() for i in range(2600))
