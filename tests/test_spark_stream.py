"""createStream end to end on kinesis-local + moto, master local[2], 1 s batches.

One SparkContext for the whole session (the ``sc`` fixture in conftest.py, shared with
test_spark_more.py); each test makes its own StreamingContext and stops it with
stopSparkContext=False.
"""
from __future__ import annotations

import threading
import warnings

import pytest

from emulators import client, list_shard_ids
from spark_helpers import count_words, create, leases, make_ssc, wait_until, word_lines, words_in

from kinesis_dstream import KinesisUtils

pytestmark = pytest.mark.spark

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

def collect_into(stream, sink: list, lock: threading.Lock) -> None:
    def save(rdd):
        rows = rdd.collect()
        with lock:
            sink.extend(rows)

    stream.foreachRDD(save)


@pytest.mark.matrix
def test_word_count_exact_then_graceful_stop(sc, env, make_stream, put_records, unique_app_name):
    stream = make_stream(2)
    lines = word_lines(600)
    expected = words_in(lines)
    put_records(stream, [(f"pk{i}", line) for i, line in enumerate(lines[:300])])

    ssc = make_ssc(sc)
    counts = count_words(create(ssc, unique_app_name, stream, env))
    ssc.start()
    try:
        wait_until(lambda: sum(counts.values()) >= sum(words_in(lines[:300]).values()), 60,
                   "the first records")
        put_records(stream, [(f"pk{i}", line) for i, line in enumerate(lines[300:], 300)])
        wait_until(lambda: sum(counts.values()) >= sum(expected.values()), 60, "all records")
        metrics = KinesisUtils.metrics(stream)
        assert set(metrics) == set(list_shard_ids(env["kinesis"], stream))
        assert sum(m["records"] for m in metrics.values()) == len(lines)
        assert all(m["owner"] for m in metrics.values())
        counts.settle()  # a few more (empty) batches: nothing counted twice
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert counts == expected

    # graceful stop: every processed position checkpointed, no lease owned
    kinesis = client("kinesis", env["kinesis"])
    for shard_id, item in leases(env, unique_app_name).items():
        assert "leaseOwner" not in item, item
        it = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id,
                                        ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        records = kinesis.get_records(ShardIterator=it, Limit=10000)["Records"]
        assert item["checkpoint"]["S"] == records[-1]["SequenceNumber"]


@pytest.mark.matrix
def test_failed_batch_is_not_checkpointed_and_comes_again(sc, env, make_stream, put_records,
                                                          unique_app_name):
    stream = make_stream(1)
    first = [f"a{i}" for i in range(50)]
    later = [f"b{i}" for i in range(50)]
    put_records(stream, [("k", r) for r in first])

    ssc = make_ssc(sc)
    seen: list[str] = []
    failed: list[str] = []
    lock = threading.Lock()
    kstream = create(ssc, unique_app_name, stream, env)

    batches = [0]
    serializers: set[str] = set()

    def flaky(rdd):
        serializers.add(type(rdd._jrdd_deserializer).__name__)
        rows = rdd.collect()
        with lock:
            batches[0] += 1
            if rows and not failed:
                failed.extend(rows)
                raise RuntimeError("output operation fails once")
            seen.extend(rows)

    kstream.foreachRDD(flaky)
    ssc.start()
    try:
        wait_until(lambda: bool(failed), 60, "the failing batch")
        put_records(stream, [("k", r) for r in later])
        wait_until(lambda: set(later) <= set(seen), 60, "the later records")
        settled = batches[0] + 3  # past the 1 s checkpoint interval: a wrong checkpoint
        wait_until(lambda: batches[0] >= settled, 30, "three more batches")  # is written by now
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    # an output operation on the stream reads its batches through BatchSerializer: its
    # tasks acknowledge their input at once (spark/task.py)
    assert serializers == {"BatchSerializer"}
    item = leases(env, unique_app_name)[list_shard_ids(env["kinesis"], stream)[0]]
    assert "leaseOwner" not in item
    first_failed = min(failed, key=lambda r: int(r[1:]) if r[0] == "a" else 10**6)
    kinesis = client("kinesis", env["kinesis"])
    it = kinesis.get_shard_iterator(StreamName=stream, ShardId=item["leaseKey"]["S"],
                                    ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    by_data = {r["Data"].decode(): r["SequenceNumber"]
               for r in kinesis.get_records(ShardIterator=it)["Records"]}
    checkpoint = item["checkpoint"]["S"]
    assert checkpoint == "TRIM_HORIZON" or int(checkpoint) < int(by_data[first_failed])

    # a restart with the same application name reads the failed batch's records again
    ssc2 = make_ssc(sc)
    again: list[str] = []
    collect_into(create(ssc2, unique_app_name, stream, env), again, lock)
    ssc2.start()
    try:
        wait_until(lambda: set(failed) <= set(again), 60, "the failed records again")
    finally:
        ssc2.stop(stopSparkContext=False, stopGraceFully=True)
