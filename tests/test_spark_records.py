"""The record guarantees on the executor path: KPL aggregates with their sub-sequence numbers,
a corrupt aggregate delivered whole, and throttling waited out, all through createStream.

Real Spark (the session's local-cluster context), kinesis-local behind a loopback proxy that
throttles half of the GetRecords calls, moto's DynamoDB.
"""
from __future__ import annotations

import threading
import warnings
from collections import Counter

import pytest
from aws_kinesis_agg import MAGIC

from spark_helpers import collected, create, leases, make_ssc, wait_until

pytestmark = pytest.mark.spark

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)


def test_aggregates_corrupt_records_and_throttling(sc, env, make_stream, put_records,
                                                   put_aggregated, make_fault_proxy,
                                                   unique_app_name):
    stream = make_stream(1)
    proxy = make_fault_proxy(share=0.5, seed=7)
    aggregates = put_aggregated(stream, [(f"k{i}", f"u{i}") for i in range(250)], per_aggregate=100)
    corrupt = MAGIC + b"not a protobuf and no checksum"
    (bad,) = put_records(stream, [("k-corrupt", corrupt)])
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=proxy.endpoint),
                     messageHandler=lambda r: (r.data, r.partition_key, r.sequence_number,
                                               r.sub_sequence_number))
    rows = collected(kstream)
    ssc.start()
    try:
        wait_until(lambda: len(rows) >= 251, 90, "every user record and the corrupt one")
        last = aggregates[-1]
        wait_until(lambda: leases(env, unique_app_name)[bad.shard_id]["checkpoint"]["S"]
                   == bad.sequence_number, 30, "the checkpoint at the corrupt record")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert proxy.injected > 0, "nothing was throttled"
    expected = Counter((data, key, a.sequence_number, sub) for a in aggregates
                       for sub, (key, data) in enumerate(a.user_records))
    expected[(corrupt, "k-corrupt", bad.sequence_number, 0)] += 1
    assert Counter(rows) == expected  # each exactly once, sub-sequences and own keys kept
    assert last.sequence_number != bad.sequence_number


def test_the_checkpoint_inside_an_aggregate_keeps_its_sub_sequence(
        sc, env, make_stream, put_aggregated, unique_app_name):
    """maxRate cuts a batch inside an aggregate: the checkpoint says where, sub-sequence
    included, and the next batch goes on from the next user record of the same aggregate."""
    stream = make_stream(1)
    (aggregate,) = put_aggregated(stream, [(f"k{i}", f"u{i}") for i in range(30)], per_aggregate=30)
    jconf = sc._conf._jconf
    jconf.set("spark.streaming.receiver.maxRate", "10")
    try:
        ssc = make_ssc(sc)
        kstream = create(ssc, unique_app_name, stream, env, checkpointInterval=0.1,
                         messageHandler=lambda r: r.sub_sequence_number)
    finally:
        jconf.remove("spark.streaming.receiver.maxRate")
    subs_seen: list[int] = []
    lock = threading.Lock()
    checkpoints: list[tuple[str, str]] = []

    def keep(rdd):
        got = rdd.collect()
        with lock:
            subs_seen.extend(got)
        item = leases(env, unique_app_name).get(aggregate.shard_id, {})
        if "checkpointSubSequenceNumber" in item:
            checkpoints.append((item["checkpoint"]["S"], item["checkpointSubSequenceNumber"]["N"]))

    kstream.foreachRDD(keep)
    ssc.start()
    try:
        wait_until(lambda: len(subs_seen) >= 30, 60, "the whole aggregate, 10 a batch")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert subs_seen == list(range(30))
    assert (aggregate.sequence_number, "9") in checkpoints or \
        (aggregate.sequence_number, "19") in checkpoints, checkpoints
    item = leases(env, unique_app_name)[aggregate.shard_id]
    assert (item["checkpoint"]["S"], item["checkpointSubSequenceNumber"]["N"]) == \
        (aggregate.sequence_number, "29")
