"""createStream(engine="java-kcl"): the real Java KCL 2.5.8 MultiLangDaemon feeds the DStream.

kinesis-local for Kinesis (the Java KCL speaks HTTP/2), moto for DynamoDB, master local[2],
1 s batches, the session SparkContext from conftest.py. The daemon takes 30-45 s to take its
first leases here, hence the long timeout. Unlike ours, the Java KCL leaves its leases owned
after a graceful stop, so only the checkpoints are checked.
"""
from __future__ import annotations

import time
import warnings

import pytest

from emulators import client, list_shard_ids
from spark_helpers import count_words, wait_until, word_lines, words_in

from kinesis_dstream import InitialPositionInStream, KinesisUtils, MetricsLevel

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

# JVM flags for a quick start on a small machine; the KCL's behaviour does not depend on them.
JVM_FLAGS = "-Xmx384m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss512k"


def checkpoints(kinesis_local: str, dynamodb: str, stream: str, app: str) -> dict[str, tuple]:
    """shard id -> (checkpoint, lease owner, sequence number of the shard's last record)."""
    kinesis = client("kinesis", kinesis_local)
    ddb = client("dynamodb", dynamodb)
    view = {}
    for item in ddb.scan(TableName=app, ConsistentRead=True)["Items"]:
        shard_id = item["leaseKey"]["S"]
        it = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id,
                                        ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        records = kinesis.get_records(ShardIterator=it, Limit=10000)["Records"]
        view[shard_id] = (item["checkpoint"]["S"], item.get("leaseOwner", {}).get("S"),
                          records[-1]["SequenceNumber"])
    return view


@pytest.mark.timeout(420)
def test_word_count_exact_on_the_java_kcl(sc, aws_env, kinesis_local, dynamodb, make_stream,
                                          put_records, unique_app_name, monkeypatch):
    from pyspark.streaming import StreamingContext

    monkeypatch.setenv("JAVA_TOOL_OPTIONS", JVM_FLAGS)
    stream = make_stream(2)
    lines = word_lines(400)
    expected, first = words_in(lines), words_in(lines[:200])
    put_records(stream, [(f"pk{i}", line) for i, line in enumerate(lines[:200])])

    ssc = StreamingContext(sc, 1)
    kstream = KinesisUtils.createStream(
        ssc, unique_app_name, stream, kinesis_local, "us-east-1",
        InitialPositionInStream.TRIM_HORIZON, 1, MetricsLevel.NONE,
        dynamoDBEndpoint=dynamodb, engine="java-kcl",
        configOverrides=dict(failover_time_ms=10000, shard_sync_interval_ms=10000,
                             shutdown_grace_ms=10000, idle_time_between_reads_ms=250,
                             max_records=1000))
    counts = count_words(kstream)
    ssc.start()
    try:
        wait_until(lambda: sum(counts.values()) >= sum(first.values()), 240,
                   "the records put before the start")
        put_records(stream, [(f"pk{i}", line) for i, line in enumerate(lines[200:], 200)])
        wait_until(lambda: sum(counts.values()) >= sum(expected.values()), 60, "all records")
        metrics = KinesisUtils.metrics(stream)
        assert set(metrics) == set(list_shard_ids(kinesis_local, stream))
        assert sum(m["records"] for m in metrics.values()) == len(lines)
        # The Java daemon owns the leases and forwards to the driver
        view = checkpoints(kinesis_local, dynamodb, stream, unique_app_name)
        assert set(view) == set(metrics)
        assert all(view[s][1] == m["owner"] and "-j0-" in m["owner"] for s, m in metrics.items())
        # Confirmed positions are checkpointed while running (during the daemon's next
        # callback), not only at the stop.
        wait_until(lambda: all(c == last for c, _, last in checkpoints(
            kinesis_local, dynamodb, stream, unique_app_name).values()), 30,
            "checkpoints at the last records while running")
        time.sleep(2)  # a few more (empty) batches: nothing counted twice
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert counts == expected

    # after the graceful stop each shard's checkpoint is its last record
    view = checkpoints(kinesis_local, dynamodb, stream, unique_app_name)
    assert set(view) == set(metrics)
    assert all(checkpoint == last for checkpoint, _, last in view.values()), view
