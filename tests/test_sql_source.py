"""spark.readStream.format("aws-kinesis"): the Structured Streaming source, end to end.

Real Spark (the session's local-cluster: executors in processes of their own), kinesis-local
for Kinesis (resharding, shard end) and the moto server for the range table. Every query
collects its rows per micro-batch id through foreachBatch: a batch that runs again replaces
its rows, and the test checks that it brought the same ones. Run as a script
(``python tests/test_sql_source.py driver ...``) this file is the subprocess driver of the
kill -9 test.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

if __name__ != "__main__":
    import pytest

    from emulators import Producer, client, put_records as put_at

from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.records import ExtendedSequenceNumber
from kinesis_dstream.sql import source as sql_source
from kinesis_dstream.sql._source_options import parse_source_options
from kinesis_dstream.sql.source import KinesisSource

TRIGGER = "1 second"


# -- helpers -----------------------------------------------------------------------------------
def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


class Batches:
    """foreachBatch target: rows by batch id; a batch run again must bring the same rows."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_batch: dict[int, list[tuple]] = {}
        self.reruns_differing: list[int] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = sorted((r.shardId, r.sequenceNumber, r.subSequenceNumber, r.partitionKey,
                       bytes(r.data)) for r in df.collect())
        with self.lock:
            if batch_id in self.by_batch and self.by_batch[batch_id] != rows:
                self.reruns_differing.append(batch_id)
            self.by_batch[batch_id] = rows

    def rows(self) -> list[tuple]:
        with self.lock:
            return [r for rows in self.by_batch.values() for r in rows]

    def data(self) -> Counter:
        return Counter(r[4] for r in self.rows())


def options(stream: str, kinesis: str, dynamodb: str, app: str, **extra: str) -> dict[str, str]:
    opts = {"kinesis.streamName": stream, "kinesis.endpointUrl": kinesis,
            "kinesis.region": "us-east-1", "kinesis.dynamodb.endpointUrl": dynamodb,
            "kinesis.dynamodb.tableName": app, "kinesis.startingPosition": "TRIM_HORIZON",
            "kinesis.clientRetryIntervalsMs": "100"}
    opts.update(extra)
    return opts


def start_query(spark: Any, opts: dict[str, str], checkpoint: str, sink: Batches,
                trigger: dict[str, Any] | None = None) -> Any:
    df = spark.readStream.format("aws-kinesis").options(**opts).load()
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    writer = writer.trigger(**(trigger or {"processingTime": TRIGGER}))
    return writer.start()


def stop(query: Any) -> None:
    query.stop()
    assert query.exception() is None, query.exception()


# -- fixtures ----------------------------------------------------------------------------------
if __name__ != "__main__":

    @pytest.fixture(scope="module")
    def spark(sc: Any) -> Iterator[Any]:
        from pyspark.sql import SparkSession

        session = SparkSession(sc)
        session.conf.set("spark.sql.shuffle.partitions", "2")
        session.dataSource.register(KinesisSource)
        yield session

    @pytest.fixture
    def env(aws_env: dict[str, str], kinesis_local: str, dynamodb: str,
            unique_app_name: str) -> dict[str, str]:
        return {"kinesis": kinesis_local, "dynamodb": dynamodb, "app": unique_app_name}

    @pytest.fixture
    def checkpoint(tmp_path: Path) -> str:
        return str(tmp_path / "checkpoint")


# -- reading -----------------------------------------------------------------------------------
def test_reads_plain_and_aggregated_records_on_executors(spark, env, make_stream, put_records,
                                                          put_aggregated, checkpoint):
    stream = make_stream(2)
    plain = put_records(stream, [(f"pk{i % 7}", f"plain-{i}") for i in range(300)])
    aggregated = put_aggregated(stream, [(f"ak{i % 5}", f"agg-{i}") for i in range(400)],
                                per_aggregate=50)
    expected = Counter([p.data for p in plain] +
                       [d for a in aggregated for _, d in a.user_records])
    sink = Batches()
    query = start_query(spark, options(stream, env["kinesis"], env["dynamodb"], env["app"]),
                        checkpoint, sink)
    try:
        wait_until(lambda: sum(sink.data().values()) >= len(expected), 120, "700 records")
        later = put_aggregated(stream, [("late", f"late-{i}") for i in range(30)], per_aggregate=10)
        expected.update(d for a in later for _, d in a.user_records)
        wait_until(lambda: sum(sink.data().values()) >= sum(expected.values()), 60, "late records")
    finally:
        stop(query)
    assert sink.data() == expected
    assert not sink.reruns_differing
    rows = sink.rows()
    # KPL user records keep their aggregate's sequence number and their own sub-sequence.
    where = {(a.shard_id, a.sequence_number, i): d for a in aggregated
             for i, (_, d) in enumerate(a.user_records)}
    got = {(r[0], r[1], r[2]): r[4] for r in rows if r[4].startswith(b"agg-")}
    assert got == where
    # Within a shard, rows come in sequence order across batches.
    for shard in {r[0] for r in rows}:
        order = [ExtendedSequenceNumber(r[1], r[2]) for b in sorted(sink.by_batch)
                 for r in sink.by_batch[b] if r[0] == shard]
        assert order == sorted(order)
