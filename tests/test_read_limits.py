"""Kinesis' per-shard read limits: the fault proxy's limits mode (tests/fault_proxy.py) and
how the executors' reads behave at those limits.

The limiter is tested on a fake clock; the proxy and the reads on kinesis-local."""
from __future__ import annotations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from emulators import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY
from fault_proxy import MiB, ShardLimits

SHARD = "shardId-000000000000"


def unretried_kinesis(endpoint: str):
    """A boto3 client that shows every refusal (botocore retries throttles by itself)."""
    return boto3.client("kinesis", endpoint_url=endpoint, region_name=DUMMY_REGION,
                        aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                        aws_secret_access_key=DUMMY_SECRET_ACCESS_KEY,
                        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_get_records_is_served_while_the_shards_byte_budget_is_positive():
    clock = FakeClock()
    limits = ShardLimits(clock=clock)
    assert limits.admit("GetRecords", SHARD)
    limits.charge(SHARD, 10 * MiB)  # a full page: about 4 s of debt (2 MiB/s, 2 MiB burst)
    refused_for = 0.0
    while not limits.admit("GetRecords", SHARD):
        clock.now += 0.5
        refused_for += 0.5
    assert refused_for == 4.5  # the budget is positive again after 8 MiB / 2 MiB/s
    assert limits.refused[("GetRecords", SHARD)] == 9
    # another shard has a budget of its own
    assert limits.admit("GetRecords", "shardId-000000000001")


def test_five_calls_a_second_per_shard_and_operation():
    clock = FakeClock()
    limits = ShardLimits(clock=clock)
    assert all(limits.admit("GetShardIterator", SHARD) for _ in range(5))
    assert not limits.admit("GetShardIterator", SHARD)
    assert all(limits.admit("GetRecords", SHARD) for _ in range(5))  # small pages: no debt
    assert not limits.admit("GetRecords", SHARD)
    clock.now += 1.0
    assert limits.admit("GetShardIterator", SHARD) and limits.admit("GetRecords", SHARD)
    assert limits.refused == {("GetShardIterator", SHARD): 1, ("GetRecords", SHARD): 1}
    # calls the proxy cannot attribute to a shard are not limited
    assert limits.admit("GetRecords", "") and limits.unattributed == 1
    assert limits.admit("ListShards", "")


def test_an_idle_shard_saves_no_more_than_its_burst():
    clock = FakeClock()
    limits = ShardLimits(clock=clock, bytes_per_s=1000, burst_bytes=1000)
    clock.now += 60
    assert limits.admit("GetRecords", SHARD)
    limits.charge(SHARD, 2500)
    clock.now += 1.0
    assert not limits.admit("GetRecords", SHARD)  # 1000 - 2500 + 1000 = -500
    clock.now += 0.6
    assert limits.admit("GetRecords", SHARD)


def test_the_proxy_refuses_as_kinesis_does_and_follows_iterators_to_their_shard(
        make_stream, put_records, make_fault_proxy):
    stream = make_stream(2)
    put_records(stream, [(f"k{i}", "x" * 1000) for i in range(200)])
    clock = FakeClock()  # the limiter's time stands still unless the test moves it
    limits = ShardLimits(bytes_per_s=10_000, clock=clock)  # 1,000 bytes: a tenth of a second
    proxy = make_fault_proxy(share=0.0, limits=limits)
    kinesis = unretried_kinesis(proxy.endpoint)
    iterators = [kinesis.get_shard_iterator(StreamName=stream, ShardId=SHARD,
                                            ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
                 for _ in range(5)]
    with pytest.raises(ClientError) as refused:
        kinesis.get_shard_iterator(StreamName=stream, ShardId=SHARD,
                                   ShardIteratorType="TRIM_HORIZON")
    error = refused.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error["Error"]["Code"] == "ProvisionedThroughputExceededException"
    page = kinesis.get_records(ShardIterator=iterators[0], Limit=10)
    assert len(page["Records"]) == 10
    with pytest.raises(ClientError) as refused:  # 10,000 bytes charged: about 1 s of debt
        kinesis.get_records(ShardIterator=page["NextShardIterator"], Limit=10)
    assert refused.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert limits.served_bytes[SHARD] == 10_000
    assert limits.refused == {("GetShardIterator", SHARD): 1, ("GetRecords", SHARD): 1}
    assert limits.shard_of(page["NextShardIterator"]) == SHARD
    clock.now += 1.0
    assert len(kinesis.get_records(ShardIterator=page["NextShardIterator"], Limit=10)["Records"]) == 10
    assert proxy.shard_calls[("GetRecords", "", SHARD)] == 2
