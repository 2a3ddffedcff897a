"""The file range store (``aws.range_files`` over ``aws.range_blobs``), on a local
directory: the conditional put under racing writers, listing order, clear errors; and the
SQL options that choose it (tier 1, no emulator)."""
from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest

from kinesis_dstream.aws.range_blobs import LocalBlobs, RangeStoreError
from kinesis_dstream.aws.range_files import FileRangeStore, decode, encode
from kinesis_dstream.aws.range_store import RangeStore, open_range_store
from kinesis_dstream.aws.range_table import BatchRange, BatchRangeTable
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.records import ExtendedSequenceNumber
from kinesis_dstream.sql.options import parse_source_options

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

KEY, SHARD = "sql/orders/q-1", "shardId-000000000000"


def config(path: str | None) -> ConsumerConfig:
    return ConsumerConfig(application_name="app", stream_name="orders", region_name="us-east-1",
                          range_path=path)


def batch(batch_ms: int, records: int = 1, **more) -> BatchRange:
    return BatchRange(KEY, SHARD, batch_ms, ExtendedSequenceNumber("100"), None,
                      ExtendedSequenceNumber(str(100 + records)), records, **more)


def test_a_range_reads_back_as_written_every_field(tmp_path):
    store = FileRangeStore(config(str(tmp_path)))
    full = BatchRange(KEY, SHARD, 7, ExtendedSequenceNumber("AT_TIMESTAMP"), 1700000000.25,
                      ExtendedSequenceNumber("4950", 3), 12, True, ("shardId-1", "shardId-2"),
                      "iter-xyz", 17.5, 420, "10.0.0.7:40123", 12.5, 3.0, 1.5)
    assert store.put_if_absent(full) is full
    back = store.get(KEY, SHARD, 7)
    assert back == full
    assert (back.next_iterator, back.iterator_time, back.millis_behind_latest, back.subscriber,
            back.read_ms, back.wait_ms, back.convert_ms) == (
        "iter-xyz", 17.5, 420, "10.0.0.7:40123", 12.5, 3.0, 1.5)
    assert store.get(KEY, SHARD, 8) is None
    assert decode(encode(batch(3)), "x") == batch(3)


def racing_puts(store: RangeStore, batch_ms: int, writers: int, join_s: float
                ) -> list[BatchRange]:
    """``writers`` threads released at once, each putting its own range of one (key, shard,
    batch): what each was handed back."""
    start = threading.Barrier(writers)
    handed: list[BatchRange] = []
    lock = threading.Lock()

    def write(i: int) -> None:
        start.wait()
        stored = store.put_if_absent(batch(batch_ms, records=i + 1))
        with lock:
            handed.append(stored)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    return handed


def test_writers_racing_on_one_range_store_exactly_one(tmp_path):
    """Sixteen computations of one partition, each with its own range, released at once:
    one object is created, and every writer is handed that one."""
    store = FileRangeStore(config(str(tmp_path)))
    writers = 16
    created: list[bool] = []
    lock = threading.Lock()
    blobs = store.blobs
    original = blobs.create

    def counting_create(name: str, body: bytes) -> bool:
        won = original(name, body)
        with lock:
            created.append(won)
        return won

    blobs.create = counting_create  # type: ignore[method-assign]
    handed = racing_puts(store, 5, writers, 30)
    assert created.count(True) == 1 and len(created) == writers
    winner = store.get(KEY, SHARD, 5)
    assert winner is not None and handed == [winner] * writers
    # no temporary file is left beside it
    assert [p.name for p in Path(tmp_path).rglob("*") if p.is_file()] == [
        f"{5:020d}.json"]


def test_listing_is_in_batch_order_whatever_the_digits(tmp_path):
    store = FileRangeStore(config(str(tmp_path)))
    for t in (1000, 5, 100, 20, 99999999999):
        store.put_if_absent(batch(t, records=t % 7 + 1))
    store.put_if_absent(BatchRange(KEY, "shardId-000000000001", 50, ExtendedSequenceNumber("1")))
    assert store.batch_times(KEY, SHARD) == [5, 20, 100, 1000, 99999999999]
    assert store.latest_before(KEY, SHARD, 1000, 0).batch_ms == 100
    assert store.latest_before(KEY, SHARD, 1001, 0).batch_ms == 1000
    assert store.latest_before(KEY, SHARD, 100, 21) is None  # nothing in [21, 100)
    assert store.latest_before(KEY, SHARD, 21, 20).batch_ms == 20
    assert store.latest_before(KEY, SHARD, 5, 0) is None
    assert store.latest_before(KEY, SHARD, 20, 20) is None
    assert store.latest_before("sql/orders/q-2", SHARD, 1000, 0) is None
    assert store.delete([(KEY, SHARD, 5), (KEY, SHARD, 100), (KEY, SHARD, 100),
                         (KEY, SHARD, 77)]) == 3  # a missing one is no error
    assert store.batch_times(KEY, SHARD) == [20, 1000, 99999999999]


def test_a_corrupt_range_fails_naming_its_file(tmp_path):
    store = FileRangeStore(config(str(tmp_path)))
    store.put_if_absent(batch(9))
    (path,) = Path(tmp_path).rglob("*.json")
    path.write_text('{"v": 1, "stream_key": ')
    with pytest.raises(RangeStoreError, match=str(path)) as broken:
        store.get(KEY, SHARD, 9)
    assert "not one we wrote" in str(broken.value)
    with pytest.raises(RangeStoreError, match=str(path)):
        store.latest_before(KEY, SHARD, 10, 0)
    path.write_text('{"v": 99}')
    with pytest.raises(RangeStoreError, match="not a version 1 batch range"):
        store.put_if_absent(batch(9, records=4))  # lost the race to a broken file: said so


def test_the_config_chooses_the_store_and_the_executors_get_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")  # a DynamoDB client is made
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    chosen = open_range_store(pickle.loads(pickle.dumps(config(str(tmp_path)))))
    assert isinstance(chosen, FileRangeStore) and isinstance(chosen.blobs, LocalBlobs)
    assert chosen.blobs.directory == str(tmp_path)
    assert isinstance(open_range_store(config(None)), BatchRangeTable)


BASE = {"kinesis.streamName": "orders", "kinesis.region": "us-east-1"}


def test_hdfs_keeps_ranges_under_metadata_path_and_refuses_what_it_cannot(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:4566")
    source = parse_source_options({**BASE, "kinesis.metadataPath": "s3a://bucket/cp/q1/"})
    assert (source.metadata_committer_type, source.config.range_path,
            source.config.s3_endpoint) == ("HDFS", "s3://bucket/cp/q1", "http://127.0.0.1:4566")
    local = parse_source_options({**BASE, "kinesis.metadataCommitterType": "hdfs",
                                  "kinesis.metadataPath": f"file://{tmp_path}"})
    assert local.config.range_path == str(tmp_path)
    dynamo = parse_source_options({**BASE, "kinesis.metadataCommitterType": "DYNAMODB",
                                   "kinesis.metadataPath": str(tmp_path)})
    assert dynamo.config.range_path is None
    assert parse_source_options(BASE).config.range_path is None  # neither: DynamoDB
    with pytest.raises(ConfigurationError, match="HDFS needs kinesis.metadataPath: Spark does "
                                                 "not tell a Python source its checkpointLocation"):
        parse_source_options({**BASE, "kinesis.metadataCommitterType": "HDFS"})
    with pytest.raises(ConfigurationError, match=r"kinesis.metadataPath: 'hdfs://nn/cp' is on a "
                                                 r"file system \(hdfs://\)"):
        parse_source_options({**BASE, "kinesis.metadataPath": "hdfs://nn/cp"})
    with pytest.raises(ConfigurationError, match="names no bucket"):
        parse_source_options({**BASE, "kinesis.metadataPath": "s3:///cp"})


class _ConflictingS3:
    """put_object answers ``answers`` in turn (an error code, or None for success)."""

    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.puts = 0

    def put_object(self, **kwargs):
        import botocore.exceptions

        assert kwargs["IfNoneMatch"] == "*"
        self.puts += 1
        code = self.answers.pop(0)
        if code is None:
            return {}
        raise botocore.exceptions.ClientError(
            {"Error": {"Code": code, "Message": code},
             "ResponseMetadata": {"HTTPStatusCode": 409 if "Conflict" in code else 412}},
            "PutObject")


def test_an_s3_race_in_flight_is_asked_again_and_bounded():
    """S3 answers 409 ConditionalRequestConflict to a conditional PUT racing another: asked
    again (after a backoff), it learns who won; a conflict that never clears is an error."""
    from kinesis_dstream.aws.range_blobs import S3Blobs

    cfg = ConsumerConfig(application_name="app", stream_name="orders", region_name="us-east-1",
                         retry_wait_time_ms=1, retry_max_attempts=3)
    lost = _ConflictingS3("ConditionalRequestConflict", "PreconditionFailed")
    assert S3Blobs(cfg, "bucket", "cp", client=lost).create("a.json", b"{}") is False
    assert lost.puts == 2
    won = _ConflictingS3("ConditionalRequestConflict", None)
    assert S3Blobs(cfg, "bucket", "cp", client=won).create("a.json", b"{}") is True
    stuck = _ConflictingS3(*["ConditionalRequestConflict"] * 3)
    with pytest.raises(RangeStoreError, match="s3://bucket/cp/a.json: S3 answered "
                                              "ConditionalRequestConflict 3 times"):
        S3Blobs(cfg, "bucket", "cp", client=stuck).create("a.json", b"{}")
    assert stuck.puts == 3
