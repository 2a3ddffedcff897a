"""readStream.format("aws-kinesis") / format("kinesis") reading by enhanced fan-out.

Real Spark on the session's local-cluster (two executor processes: subscriptions live on
executors), the local fan-out front in front of kinesis-local (it counts every call per
shard, so "no GetRecords" and "SubscribeToShard per subscription lifetime" are counted),
moto for the range table. Records are put through the front, which pushes them at once.
Lifetimes stay above the 5 s takeover rule.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest

import emulators
from spark_helpers import wait_until
from test_sql_source import PYSPARK_4_2, Batches, KeyedProducer, options, read_on_exactly_once, stop

pytestmark = pytest.mark.spark

LIFETIME_S = 6.0  # beyond the 5 s rule: a renewal is never refused by it
TRIGGER = {"processingTime": "1 second"}
PRODUCER_EVERY_S = 0.5  # 10 records each time: 20 a second
BATCHES = 15  # batches over which subscriptions are counted


def consumers(endpoint: str, stream: str) -> dict[str, str]:
    """The stream's consumers by name, with their status."""
    kinesis = emulators.client("kinesis", endpoint)
    arn = kinesis.describe_stream_summary(StreamName=stream)[
        "StreamDescriptionSummary"]["StreamARN"]
    listed = kinesis.list_stream_consumers(StreamARN=arn)["Consumers"]
    return {c["ConsumerName"]: c["ConsumerStatus"] for c in listed}


def wait_deregistered(gone: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """A graceful stop() deregisters the consumer (the driver's query listener does it)."""
    wait_until(gone, timeout_s, f"{what} within {timeout_s:.0f} s of stop()")


def start(spark: Any, fmt: str, opts: dict[str, str], checkpoint: str, sink: Batches) -> Any:
    df = spark.readStream.format(fmt).options(**opts).load()
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
            .trigger(**TRIGGER).start())


@pytest.mark.timeout(300)  # the session's Spark may start inside it (90 s loaded)
def test_aws_kinesis_reads_every_record_once_by_fan_out_and_deregisters_on_stop(
        spark, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1)
    before = emulators.put_records(front.endpoint, stream,
                                   [(f"pk-{i}", f"before-{i}") for i in range(100)])
    opts = options(stream, front.endpoint, dynamodb, unique_app_name,
                   **{"kinesis.consumerType": "SubscribeToShard",
                      "kinesis.consumerName": f"{unique_app_name}-c"})
    sink = Batches()
    query = start(spark, "aws-kinesis", opts, str(tmp_path / "cp"), sink)
    shards = emulators.list_shard_ids(kinesis_local, stream)
    producer = KeyedProducer(front.endpoint, stream, prefix="during", every_s=PRODUCER_EVERY_S)
    try:
        # registered when the query starts, ACTIVE before any task subscribes
        wait_until(lambda: consumers(kinesis_local, stream).get(f"{unique_app_name}-c")
                   == "ACTIVE", 30, "the consumer registered")
        wait_until(lambda: set(sink.data()) >= {r.data for r in before}, 120,
                   "the records put before the query")  # its Python workers have started
        producer.start()
        # Counted from here: BATCHES 1 s batches, each a chance for a shard's task to land
        # on the other executor.
        counted_from, batch0 = time.monotonic(), len(sink.by_batch)
        subscribed0 = {s: front.count("SubscribeToShard", s) for s in shards}
        wait_until(lambda: len(sink.by_batch) >= batch0 + BATCHES, 120, f"{BATCHES} batches")
    except BaseException:
        producer.halt.set()
        stop(query)
        raise
    # every record once (those put before included)
    read_on_exactly_once(query, producer, sink, len(producer.sent) + 10,
                         also=[r.data for r in before])
    counted_s = time.monotonic() - counted_from
    subscribed = {s: front.count("SubscribeToShard", s) - subscribed0[s] for s in shards}
    print(f"SubscribeToShard per shard over {len(sink.by_batch) - batch0} batches in "
          f"{counted_s:.1f} s with {LIFETIME_S:.0f} s lifetimes: {subscribed}")
    for shard_id in shards:
        assert front.count("GetRecords", shard_id) == 0, shard_id
        assert front.count("SubscribeToShard", shard_id) >= 1, shard_id
    # subscriptions outlive tasks wherever Spark places them: about one per lifetime, not
    # one each time a shard's task lands on another executor
    bound = counted_s / LIFETIME_S + 2
    assert all(n <= bound for n in subscribed.values()), (subscribed, f"{counted_s:.1f} s")
    # a graceful stop() deregisters the consumer, as the awslabs connector does
    wait_deregistered(lambda: consumers(kinesis_local, stream).get(f"{unique_app_name}-c")
                      in (None, "DELETING"), "the consumer deregistered")


@pytest.mark.timeout(300)  # the session's Spark may start inside it (90 s loaded)
def test_kinesis_format_keeps_its_query_named_consumer_across_a_restart(
        spark, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    """consumerMode efo without consumerName: the consumer is named after the query id the
    checkpoint keeps, kept on stop(), used again by the restarted query (which reads every
    record once), and deregistered when requireConsumerDeregistration asks for it."""
    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1)
    opts = {"streamName": stream, "endpointUrl": front.endpoint, "region": "us-east-1",
            "kinesis.dynamodb.endpointUrl": dynamodb,
            "kinesis.dynamodb.tableName": unique_app_name,
            "initialPosition": "TRIM_HORIZON", "consumerMode": "efo",
            "kinesis.clientRetryIntervalsMs": "100"}
    checkpoint = str(tmp_path / "cp")
    sink = Batches()
    producer = KeyedProducer(front.endpoint, stream, prefix="run", every_s=PRODUCER_EVERY_S)
    query = start(spark, "kinesis", opts, checkpoint, sink)
    try:
        producer.start()
        wait_until(lambda: len(sink.data()) >= 40, 60, "the first records")
    finally:
        stop(query)
    named = [n for n in consumers(kinesis_local, stream) if n.startswith("kinesis-dstream-sql-")]
    assert len(named) == 1
    time.sleep(2)  # the listener has seen the stop: the consumer is kept (Databricks' default)
    assert consumers(kinesis_local, stream)[named[0]] == "ACTIVE"
    shards = emulators.list_shard_ids(kinesis_local, stream)
    for shard_id in shards:  # read normally: by the subscription only
        assert front.count("GetRecords", shard_id) == 0, shard_id
    if not PYSPARK_4_2:  # pyspark < 4.2 cannot resume a Python source from its checkpoint
        producer.finish()
        return
    before = {s: (front.count("GetShardIterator", s), front.count("GetRecords", s))
              for s in shards}
    query = start(spark, "kinesis", {**opts, "requireConsumerDeregistration": "true"},
                  checkpoint, sink)
    read_on_exactly_once(query, producer, sink, len(producer.sent) + 30, read_within_s=60)
    assert [n for n in consumers(kinesis_local, stream)
            if n.startswith("kinesis-dstream-sql-")] in ([], named)  # the same consumer
    for shard_id in shards:
        # The restart recomputes the reading the stop left planned but not committed: that
        # one recorded range is read exactly, by GetRecords (one iterator, a page or two);
        # everything after it by the subscription.
        iterators = front.count("GetShardIterator", shard_id) - before[shard_id][0]
        pages = front.count("GetRecords", shard_id) - before[shard_id][1]
        assert iterators <= 1 and pages <= 2 * iterators, (shard_id, iterators, pages)
    wait_deregistered(lambda: consumers(kinesis_local, stream).get(named[0])
                      in (None, "DELETING"),
                      "the consumer deregistered (requireConsumerDeregistration)")


@pytest.mark.timeout(90)
def test_a_consumer_that_cannot_be_registered_fails_the_query_naming_it(
        spark, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    stream = make_stream(1)
    front = make_fanout_front()
    for index in range(20):  # the stream's limit
        emulators.register_consumer(kinesis_local, stream, f"other-{index}")
    opts = options(stream, front.endpoint, dynamodb, unique_app_name,
                   **{"kinesis.consumerType": "SubscribeToShard",
                      "kinesis.consumerName": "one-too-many"})
    started = time.monotonic()
    query = start(spark, "aws-kinesis", opts, str(tmp_path / "cp"), Batches())
    try:
        wait_until(lambda: not query.isActive, 60, "the query to fail")
    finally:
        query.stop()
    assert time.monotonic() - started < 60
    message = str(query.exception())
    assert "'one-too-many'" in message and repr(stream) in message
    assert "20 consumers" in message
