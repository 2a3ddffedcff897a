"""createStream end to end through a shard split mid-run: the parent ends only after its
records, the children follow, nothing is counted twice.

kinesis-local + moto, the session's one SparkContext (conftest ``sc``), 1 s batches.
"""
from __future__ import annotations

import threading
import time
import warnings
from collections import Counter

import pytest

from emulators import client, list_shard_ids, wait_stream_active
from spark_helpers import (
    create,
    duplicated_ids,
    leases,
    make_ssc,
    shard_records,
    unique_lines,
    wait_until,
    words_in,
)

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

pytestmark = pytest.mark.spark


def test_split_while_counting_ends_parent_only_after_its_records(sc, env, make_stream,
                                                                 put_records, unique_app_name):
    stream = make_stream(2)
    kinesis = client("kinesis", env["kinesis"])
    parent = sorted(kinesis.list_shards(StreamName=stream)["Shards"],
                    key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))[0]
    parent_id = parent["ShardId"]
    produced: list[str] = []
    seen: list[tuple[str, str]] = []  # (shard id, line)
    violations: list[str] = []
    lock = threading.Lock()
    ddb = client("dynamodb", env["dynamodb"])

    def put_lines(n: int) -> None:
        start = len(produced)
        batch = unique_lines(n, start)
        put_records(stream, [(f"key-{i % 16}", line) for i, line in enumerate(batch, start)])
        produced.extend(batch)

    put_lines(200)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, env,
                     messageHandler=lambda r: (r.shard_id, r.data.decode()))

    def check_and_keep(rdd):
        rows = rdd.collect()
        if any(shard == parent_id for shard, _ in rows):
            # This batch holds parent records and has not completed: SHARD_END must not be
            # written yet (Spark's receiver writes it as soon as the records are stored).
            item = ddb.get_item(TableName=unique_app_name, Key={"leaseKey": {"S": parent_id}},
                                ConsistentRead=True).get("Item", {})
            if item.get("checkpoint", {}).get("S") == "SHARD_END":
                violations.append(f"SHARD_END written while a batch held {parent_id}'s records")
        with lock:
            seen.extend(rows)
            batches[0] += 1

    batches = [0]
    kstream.foreachRDD(check_and_keep)
    producing = threading.Event()
    producing.set()
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            while producing.is_set():
                put_lines(20)
                time.sleep(0.2)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    ssc.start()
    thread = threading.Thread(target=producer, daemon=True)
    try:
        wait_until(lambda: len(seen) >= 200, 60, "the backlog")
        thread.start()
        wait_until(lambda: len(produced) >= 300, 30, "records put while counting")
        hash_range = parent["HashKeyRange"]
        low, high = int(hash_range["StartingHashKey"]), int(hash_range["EndingHashKey"])
        kinesis.split_shard(StreamName=stream, ShardToSplit=parent_id,
                            NewStartingHashKey=str((low + high) // 2))
        wait_stream_active(kinesis, stream)
        children = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]
                    if s.get("ParentShardId") == parent_id]
        assert len(children) == 2, children
        wait_until(lambda: {s for s, _ in list(seen)} >= set(children), 45,
                   "records from both child shards")
        more = len(produced) + 100
        wait_until(lambda: len(produced) >= more, 30, "more records after the split")
        producing.clear()
        thread.join(10)
        assert not errors, errors
        wait_until(lambda: len(seen) >= len(produced), 60, "every record produced")
        settled = batches[0] + 2
        wait_until(lambda: batches[0] >= settled, 30, "two more batches: nothing counted twice")
    finally:
        producing.clear()
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert not violations, violations
    lines_seen = [line for _, line in seen]
    assert Counter(w for line in lines_seen for w in line.split()) == words_in(produced)
    assert not duplicated_ids(Counter(lines_seen))

    items = leases(env, unique_app_name)
    assert set(items) == set(list_shard_ids(env["kinesis"], stream)) | {parent_id}
    assert items[parent_id]["checkpoint"]["S"] == "SHARD_END"
    assert set(items[parent_id]["childShardIds"]["SS"]) == set(children)
    for shard_id, item in items.items():
        assert "leaseOwner" not in item, item
        if shard_id != parent_id:
            records = shard_records(env, stream, shard_id)
            assert records, shard_id
            assert item["checkpoint"]["S"] == records[-1]["SequenceNumber"], (shard_id, item)
    for child in children:
        assert items[child]["parentShardId"]["SS"] == [parent_id]
