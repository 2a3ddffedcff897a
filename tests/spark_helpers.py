"""Helpers shared by the createStream end-to-end tests (test_spark_*.py): waiting, the word
count whose result must be exact, and createStream on the test emulators."""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Callable

from emulators import client

from kinesis_dstream import InitialPositionInStream, KinesisUtils

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def word_lines(n: int) -> list[str]:
    """n lines of 1 to 4 words each."""
    return [" ".join(WORDS[(i + j) % 5] for j in range(1 + i % 4)) for i in range(n)]


def words_in(lines: list[str]) -> Counter:
    return Counter(w for line in lines for w in line.split())


def count_words(kstream: Any) -> Counter:
    """Spark's word count on ``kstream``; returns the Counter each batch adds to.

    The counter is updated on the driver under a lock; read ``sum(counts.values())``
    (a copy of the values) from the test thread."""
    counts: Counter = Counter()
    lock = threading.Lock()
    pairs = kstream.flatMap(lambda line: line.split(" ")).map(lambda w: (w, 1)) \
        .reduceByKey(lambda a, b: a + b)

    def add(rdd):
        got = rdd.collect()
        with lock:
            counts.update(dict(got))

    pairs.foreachRDD(add)
    return counts


# createStream on the test emulators with short engine timings
FAST = dict(failover_time_ms=3000, shard_sync_interval_ms=2000, shutdown_grace_ms=8000,
            idle_time_between_reads_ms=100, parent_shard_poll_interval_ms=200)


def make_ssc(sc):
    from pyspark.streaming import StreamingContext

    return StreamingContext(sc, 1)


def create(ssc, app, stream, env, **kwargs):
    overrides = dict(FAST, **kwargs.pop("configOverrides", {}))
    position = kwargs.pop("initialPositionInStream", InitialPositionInStream.TRIM_HORIZON)
    return KinesisUtils.createStream(
        ssc, app, stream, env["kinesis"], "us-east-1", position, kwargs.pop("checkpointInterval", 1),
        dynamoDBEndpoint=env["dynamodb"], configOverrides=overrides, **kwargs)


def leases(env, app: str) -> dict[str, dict]:
    items = client("dynamodb", env["dynamodb"]).scan(TableName=app, ConsistentRead=True)["Items"]
    return {i["leaseKey"]["S"]: i for i in items}
