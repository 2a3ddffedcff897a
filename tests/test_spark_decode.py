"""Undecodable bytes: the batch fails with an error naming shard and position; nothing is lost."""
from __future__ import annotations

import threading
import warnings

import pytest

from emulators import client
from spark_helpers import wait_until

from kinesis_dstream import InitialPositionInStream, KinesisUtils, MetricsLevel, utf8_decoder
from kinesis_dstream.records import Record
from kinesis_dstream.spark.records import naming_decoder

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)


@pytest.mark.unit
def test_naming_decoder_passes_good_records_and_names_bad_ones():
    decode = naming_decoder(utf8_decoder)
    good = Record(b"caf\xc3\xa9", "k", "4960", 3, 0, "shardId-1")
    bad = Record(b"\xff\xfe", "k", "4961", 0, 0, "shardId-1")
    assert list(decode([good, good])) == ["café", "café"]
    with pytest.raises(ValueError, match=r"utf8_decoder cannot decode the record at 4961/0 of "
                                         r"shard shardId-1 .*UnicodeDecodeError"):
        list(decode([good, bad]))


@pytest.mark.matrix
@pytest.mark.spark
def test_an_undecodable_record_fails_its_batch_and_is_never_checkpointed(
        sc, aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name):
    from pyspark.streaming import StreamingContext

    stream = make_stream(1)
    good = put_records(stream, [("k", "one"), ("k", "two")])
    ddb = client("dynamodb", dynamodb)

    def checkpoint() -> str | None:
        item = ddb.get_item(TableName=unique_app_name, Key={"leaseKey": {"S": good[-1].shard_id}},
                            ConsistentRead=True).get("Item")
        return item["checkpoint"]["S"] if item else None

    ssc = StreamingContext(sc, 1)
    kstream = KinesisUtils.createStream(
        ssc, unique_app_name, stream, kinesis_local, "us-east-1",
        InitialPositionInStream.TRIM_HORIZON, 1, MetricsLevel.NONE, dynamoDBEndpoint=dynamodb,
        configOverrides=dict(failover_time_ms=3000, idle_time_between_reads_ms=100))
    errors: list[str] = []
    lock = threading.Lock()

    def save(rdd):
        try:
            rdd.collect()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            with lock:
                errors.append(str(exc))
            raise

    kstream.foreachRDD(save)
    ssc.start()
    try:
        # The good records' batch completes and is checkpointed; then the bad one comes.
        wait_until(lambda: checkpoint() == good[-1].sequence_number, timeout=60,
                   what="the good records to be checkpointed")
        bad = put_records(stream, [("k", b"\xff\xfe\xfd")])[0]
        wait_until(lambda: errors, timeout=60, what="the batch with the bad record to fail")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert any(bad.sequence_number in e and bad.shard_id in e and "utf8_decoder" in e
               for e in errors), errors[:1]
    # Graceful stop wrote what completed: the good records, never the undecodable one.
    assert checkpoint() == good[-1].sequence_number, "the undecodable record must not be checkpointed"
