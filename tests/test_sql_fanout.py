"""readStream.format("aws-kinesis") / format("kinesis") reading by enhanced fan-out.

Real Spark on the session's local-cluster (two executor processes: subscriptions live on
executors), the local fan-out front in front of kinesis-local (it counts every call per
shard, so "no GetRecords" and "SubscribeToShard per subscription lifetime" are counted),
moto for the range table. Records are put through the front, which pushes them at once.
Lifetimes stay above the 5 s takeover rule.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import emulators
import pytest
from spark_helpers import wait_until
from test_sql_source import PYSPARK_4_2, Batches, options, stop


pytestmark = pytest.mark.spark

LIFETIME_S = 6.0  # beyond the 5 s rule: a renewal is never refused by it
TRIGGER = {"processingTime": "1 second"}




def consumers(endpoint: str, stream: str) -> dict[str, str]:
    """The stream's consumers by name, with their status."""
    kinesis = emulators.client("kinesis", endpoint)
    arn = kinesis.describe_stream_summary(StreamName=stream)[
        "StreamDescriptionSummary"]["StreamARN"]
    listed = kinesis.list_stream_consumers(StreamARN=arn)["Consumers"]
    return {c["ConsumerName"]: c["ConsumerStatus"] for c in listed}


def deregistered_or_xfail(done: Any, what: str, timeout_s: float = 30.0) -> None:
    """Deregistration on stop() is best effort (as the awslabs connector documents it) and is
    known to be missed in some runs (issue 24): an XFAIL then, never a pass. Everything the
    test asserted before it holds either way."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            pytest.xfail(f"{what}: not within {timeout_s:.0f} s of stop() (known, issue 24)")
        time.sleep(0.2)


def start(spark: Any, fmt: str, opts: dict[str, str], checkpoint: str, sink: Batches) -> Any:
    df = spark.readStream.format(fmt).options(**opts).load()
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
            .trigger(**TRIGGER).start())


class Producer(threading.Thread):
    """Puts 10 records every 0.5 s through the front, data unique; ``sent`` in order."""

    def __init__(self, endpoint: str, stream: str, prefix: str) -> None:
        super().__init__(name="fan-out-producer", daemon=True)
        self.endpoint, self.stream, self.prefix = endpoint, stream, prefix
        self.sent: list[bytes] = []
        self.halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.halt.is_set():
            batch = [(f"pk-{i % 6}", f"{self.prefix}-{n + i}") for i in range(10)]
            emulators.put_records(self.endpoint, self.stream, batch)
            self.sent += [d.encode() for _, d in batch]
            n += 10
            self.halt.wait(0.5)

    def finish(self) -> list[bytes]:
        self.halt.set()
        self.join(10)
        return list(self.sent)


def read_while_producing(query: Any, producer: Producer, sink: Batches, run_s: float) -> Counter:
    producer.start()
    try:
        time.sleep(run_s)
        sent = producer.finish()
        wait_until(lambda: set(sink.data()) >= set(sent) or not query.isActive, 60,
                   f"every record put ({len(sent)}; {len(sink.data())} read in "
                   f"{len(sink.by_batch)} batches so far)")
    finally:
        producer.halt.set()
    assert query.exception() is None, query.exception()
    return Counter(sent)


@pytest.mark.timeout(240)  # the session's Spark may start inside it (90 s loaded)
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
    started = time.monotonic()
    query = start(spark, "aws-kinesis", opts, str(tmp_path / "cp"), sink)
    try:
        # registered when the query starts, ACTIVE before any task subscribes
        wait_until(lambda: consumers(kinesis_local, stream).get(f"{unique_app_name}-c")
                   == "ACTIVE", 30, "the consumer registered")
        sent = read_while_producing(query, Producer(front.endpoint, stream, "during"), sink,
                                    run_s=3 * LIFETIME_S)
        elapsed = time.monotonic() - started
    finally:
        stop(query)
    sent.update(r.data for r in before)
    got = sink.data()
    assert got == sent, (len(got), len(sent), [d for d, n in got.items() if n > 1][:5])
    assert not sink.reruns_differing
    shards = emulators.list_shard_ids(kinesis_local, stream)
    for shard_id in shards:
        assert front.count("GetRecords", shard_id) == 0, shard_id
        assert front.count("SubscribeToShard", shard_id) >= 1, shard_id
    # subscriptions outlive tasks: about one per lifetime, not one per 1 s batch. A Python
    # source's partitions carry no executor location, so a shard's task may move and
    # subscribe again (known, issue 24): over the bound is an XFAIL, never a pass.
    over = {s: front.count("SubscribeToShard", s) for s in shards
            if front.count("SubscribeToShard", s) > elapsed / LIFETIME_S + 3}
    # a graceful stop() deregisters the consumer, as the awslabs connector does
    deregistered_or_xfail(lambda: consumers(kinesis_local, stream).get(f"{unique_app_name}-c")
                          in (None, "DELETING"), "the consumer deregistered")
    if over:
        pytest.xfail(f"subscriptions over one per {LIFETIME_S:.0f} s lifetime in "
                     f"{elapsed:.1f} s: {over} (SQL tasks are not pinned to executors, issue 24)")


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
    producer = Producer(front.endpoint, stream, "run")
    query = start(spark, "kinesis", opts, checkpoint, sink)
    try:
        producer.start()
        wait_until(lambda: len(sink.data()) >= 40, 60, "the first records")
    finally:
        stop(query)
    named = [n for n in consumers(kinesis_local, stream) if n.startswith("kinesis-dstream-sql-")]
    assert len(named) == 1
    time.sleep(2)  # the source's stop() has run: the consumer is kept (Databricks' default)
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
    try:
        wait_until(lambda: len(producer.sent) >= len(sink.data()) + 30, 30, "more records")
        sent = producer.finish()
        wait_until(lambda: set(sink.data()) >= set(sent) or not query.isActive, 60,
                   "every record put")
    finally:
        producer.halt.set()
        stop(query)
    got = sink.data()
    assert got == Counter(sent), (len(got), len(sent), [d for d, n in got.items() if n > 1][:5])
    assert not sink.reruns_differing
    assert [n for n in consumers(kinesis_local, stream)
            if n.startswith("kinesis-dstream-sql-")] in ([], named)  # the same consumer
    for shard_id in shards:
        # The restart recomputes the reading the stop left planned but not committed: that
        # one recorded range is read exactly, by GetRecords (one iterator, a page or two);
        # everything after it by the subscription.
        iterators = front.count("GetShardIterator", shard_id) - before[shard_id][0]
        pages = front.count("GetRecords", shard_id) - before[shard_id][1]
        assert iterators <= 1 and pages <= 2 * iterators, (shard_id, iterators, pages)
    deregistered_or_xfail(lambda: consumers(kinesis_local, stream).get(named[0])
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
