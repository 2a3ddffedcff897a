"""The file range store on S3 (``range_blobs.S3Blobs``), against moto's server (the
``dynamodb`` fixture's moto serves S3 too): the conditional PUT refuses a second writer, and
writers racing on one range are handed one range."""
from __future__ import annotations

import uuid

import pytest

from emulators import client
from test_range_files import KEY, SHARD, racing_puts
from test_range_files import batch as unit_batch

from kinesis_dstream.aws.range_blobs import S3Blobs
from kinesis_dstream.aws.range_files import FileRangeStore
from kinesis_dstream.aws.range_store import open_range_store
from kinesis_dstream.aws.range_table import BatchRange
from kinesis_dstream.config import ConsumerConfig

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

@pytest.fixture
def bucket(aws_env, dynamodb):
    s3 = client("s3", dynamodb)
    name = f"ranges-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    yield s3, name
    for item in s3.list_objects_v2(Bucket=name).get("Contents", []):
        s3.delete_object(Bucket=name, Key=item["Key"])
    s3.delete_bucket(Bucket=name)


def store_at(dynamodb: str, bucket: str, prefix: str = "cp/query-1") -> FileRangeStore:
    config = ConsumerConfig(application_name="app", stream_name="orders",
                            region_name="us-east-1", s3_endpoint=dynamodb,
                            range_path=f"s3://{bucket}/{prefix}", retry_max_attempts=3,
                            retry_wait_time_ms=10)
    store = open_range_store(config)
    assert isinstance(store, FileRangeStore) and isinstance(store.blobs, S3Blobs)
    return store


def batch(batch_ms: int, records: int = 1) -> BatchRange:
    return unit_batch(batch_ms, records, subscriber="10.0.0.7:4000")


def test_the_conditional_put_refuses_a_second_writer(bucket, dynamodb):
    s3, name = bucket
    store = store_at(dynamodb, name)
    first, second = batch(5, records=3), batch(5, records=9)
    assert store.put_if_absent(first) is first
    assert store.put_if_absent(second) == first  # refused: handed the stored one
    key = f"cp/query-1/kinesis-ranges/sql%2Forders%2Fq-1/{SHARD}/{5:020d}.json"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=name)["Contents"]] == [key]
    # moto answers the refused PUT as S3 does: 412 PreconditionFailed
    with pytest.raises(s3.exceptions.ClientError, match="PreconditionFailed"):
        s3.put_object(Bucket=name, Key=key, Body=b"{}", IfNoneMatch="*")
    assert store.blobs.create(f"kinesis-ranges/sql%2Forders%2Fq-1/{SHARD}/x.json", b"1")
    assert not store.blobs.create(f"kinesis-ranges/sql%2Forders%2Fq-1/{SHARD}/x.json", b"2")
    assert store.get(KEY, SHARD, 5).subscriber == "10.0.0.7:4000"


def test_writers_racing_on_s3_are_handed_one_range(bucket, dynamodb):
    _, name = bucket
    store = store_at(dynamodb, name)
    writers = 8
    handed = racing_puts(store, 7, writers, 60)
    assert handed == [store.get(KEY, SHARD, 7)] * writers


def test_listing_and_deleting_on_s3(bucket, dynamodb):
    _, name = bucket
    store = store_at(dynamodb, name, prefix="")
    other = store_at(dynamodb, name, prefix="elsewhere")
    for t in (1000, 5, 100, 20):
        store.put_if_absent(batch(t))
    other.put_if_absent(batch(500))
    assert store.batch_times(KEY, SHARD) == [5, 20, 100, 1000]
    assert store.latest_before(KEY, SHARD, 1000, 0).batch_ms == 100
    assert store.latest_before(KEY, SHARD, 100, 21) is None
    assert store.latest_before(KEY, SHARD, 21, 20).batch_ms == 20
    assert store.delete([(KEY, SHARD, 5), (KEY, SHARD, 100), (KEY, SHARD, 3)]) == 3
    assert store.batch_times(KEY, SHARD) == [20, 1000]
    assert other.batch_times(KEY, SHARD) == [500]
