"""DStreams read by enhanced fan-out: Spark on ``local-cluster[2,1,1024]``, the local fan-out
front (SubscribeToShard served in front of kinesis-local) and moto's DynamoDB.

The front counts every call per shard, so "no GetRecords while reading" and "about one
SubscribeToShard per subscription lifetime" (subscriptions held between tasks, on the
executor that reads the shard batch after batch) are counted, not assumed. Records are put
through the front, which pushes them at once.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
import warnings

import pytest

import emulators
from spark_helpers import collected, create, executor_jvm_of, make_ssc, wait_until
from test_spark_chaos import executors_alive
from test_spark_executors import NO_CACHE, two_output_operations
from test_worker_fanout import consumer_status

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

log = logging.getLogger(__name__)

LIFETIME_S = 8.0  # beyond the 5 s rule
FANOUT = {"retrieval_mode": "FANOUT"}


def putting(put_records, stream: str, endpoint: str, waves: int, per_wave: int,
            every_s: float = 1.0) -> tuple[threading.Thread, list[str]]:
    """A producer: ``waves`` puts of ``per_wave`` records, one every ``every_s``."""
    sent: list[str] = []

    def run() -> None:
        for wave in range(waves):
            batch = [f"w{wave}-{i}" for i in range(per_wave)]
            put_records(stream, [(f"pk{i}", r) for i, r in enumerate(batch)], endpoint=endpoint)
            sent.extend(batch)
            time.sleep(every_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, sent


@pytest.mark.spark
def test_one_second_batches_read_every_record_once_by_subscriptions_held_between_tasks(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name):
    front = make_fanout_front(lifetime_s=LIFETIME_S)
    stream = make_stream(2)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     configOverrides=FANOUT)
    assert consumer_status(front.endpoint, stream, unique_app_name) == "ACTIVE"  # at createStream
    rows = collected(kstream)
    began = time.monotonic()
    ssc.start()
    producer, sent = putting(put_records, stream, front.endpoint, waves=24, per_wave=20)
    try:
        producer.join()
        wait_until(lambda: len(rows) >= len(sent), 60, "every record")
        elapsed = time.monotonic() - began
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(rows) == sorted(sent)  # each exactly once
    assert front.count("GetRecords") == 0
    lifetimes = math.ceil(elapsed / LIFETIME_S)
    log.info("%.0f s read; SubscribeToShard per shard: %s", elapsed,
             {s: n for (op, s), n in front.calls.items() if op == "SubscribeToShard"})
    for shard in ("shardId-000000000000", "shardId-000000000001"):
        subscribes = front.count("SubscribeToShard", shard)
        # one a lifetime; one more where the first batches' tasks met an executor apiece
        assert 1 <= subscribes <= lifetimes + 2, (shard, subscribes, lifetimes, front.calls)


@pytest.mark.spark
def test_a_recomputed_batch_reads_the_same_records_though_more_were_pushed(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name):
    """storageLevel NONE: each output operation computes the batch. The second finds the
    range the first recorded and reads exactly it (by GetRecords), though more records were
    pushed in between; the subscription goes on from the recorded end."""
    front = make_fanout_front(lifetime_s=LIFETIME_S)
    stream = make_stream(2)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     storageLevel=NO_CACHE, configOverrides=FANOUT)
    late: list[str] = []

    def more(got):
        if got and not late:  # records pushed while the batch is between its two operations
            late.extend(f"b{i}" for i in range(100))
            put_records(stream, [(f"pk{i}", r) for i, r in enumerate(late)],
                        endpoint=front.endpoint)

    first, second = two_output_operations(kstream, more)
    ssc.start()
    early = [f"a{i}" for i in range(100)]
    put_records(stream, [(f"pk{i}", r) for i, r in enumerate(early)], endpoint=front.endpoint)
    try:
        wait_until(lambda: sum(len(v) for v in list(second.values())) >= 200, 90, "both waves")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert late
    for when, rows in first.items():
        assert sorted(second.get(when, [])) == sorted(rows), when
    for seen in (first, second):  # every record once in each output operation
        assert sorted(r for rows in seen.values() for r in rows) == sorted(early + late)
    assert front.count("GetRecords") > 0  # the recomputations, exactly their ranges


@pytest.mark.spark
def test_an_executor_killed_while_reading_by_fan_out_loses_nothing_and_doubles_nothing(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name):
    """kill -9 of the executor holding a shard's subscription: its shards move to the other
    executor, which subscribes at the last recorded end (the 5 s rule waited out by the
    pacer); every record comes once."""
    front = make_fanout_front(lifetime_s=LIFETIME_S)
    stream = make_stream(2)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     configOverrides=FANOUT)
    rows = collected(kstream)
    before = executors_alive(sc)
    ssc.start()
    producer, sent = putting(put_records, stream, front.endpoint, waves=20, per_wave=20)
    try:
        wait_until(lambda: len(rows) >= 100, 90, "the first records")
        pids = {pid for m in kstream.metrics().values() for pid in m["read_by_pids"]}
        jvm = executor_jvm_of(min(pids))
        os.kill(jvm, signal.SIGKILL)
        producer.join()
        wait_until(lambda: len(rows) >= len(sent), 120, "every record after the kill")
        wait_until(lambda: len(kstream.metrics()) == 2 and all(
            m["processed"] for m in kstream.metrics().values()), 30, "the batches completed")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
        wait_until(lambda: executors_alive(sc) >= before, 120, "the executor replaced")
    assert sorted(rows) == sorted(sent)  # a doubled record would show here


@pytest.mark.spark
def test_a_split_under_load_reads_the_parent_before_its_children_every_record_once(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name):
    """The parent's subscription ends with ChildShards; its children are read only in
    batches after the parent's last records, and every record comes once."""
    front = make_fanout_front(lifetime_s=LIFETIME_S)
    stream = make_stream(1)
    parent = "shardId-000000000000"
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     configOverrides=FANOUT,
                     messageHandler=lambda r: (r.shard_id, r.data.decode()))
    batches: list[list] = []
    kstream.foreachRDD(lambda rdd: batches.append(rdd.collect()))
    seen = lambda: [row for rows in list(batches) for row in rows]  # noqa: E731
    ssc.start()
    producer, sent = putting(put_records, stream, front.endpoint, waves=40, per_wave=20,
                             every_s=0.3)
    try:
        wait_until(lambda: len(seen()) >= 100, 90, "the first records")
        kinesis = emulators.client("kinesis", front.endpoint)
        hash_range = kinesis.list_shards(StreamName=stream)["Shards"][0]["HashKeyRange"]
        low, high = int(hash_range["StartingHashKey"]), int(hash_range["EndingHashKey"])
        kinesis.split_shard(StreamName=stream, ShardToSplit=parent,
                            NewStartingHashKey=str((low + high) // 2))
        producer.join()
        wait_until(lambda: len(seen()) >= len(sent), 90, "every record")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(data for _, data in seen()) == sorted(sent)
    shards = {shard for shard, _ in seen()}
    assert len(shards - {parent}) == 2, shards  # both children read
    last_parent = max(i for i, rows in enumerate(batches) if any(s == parent for s, _ in rows))
    first_child = min(i for i, rows in enumerate(batches) if any(s != parent for s, _ in rows))
    assert last_parent < first_child
