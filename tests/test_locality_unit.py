"""The driver's shard placement for fan-out DStreams on its own: a shard keeps its executor
batch after batch, a lost executor's shards (and new shards) go to the least loaded, and a
task holds one executor's shards only (no Spark: the JVM RDD is exercised by
test_spark_fanout)."""
from __future__ import annotations

import pytest

from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.retrieval import ShardRange
from kinesis_dstream.spark.locality import ShardPlacement, located_groups

pytestmark = pytest.mark.unit

A, B, C = ("0", "10.0.0.1"), ("1", "10.0.0.2"), ("2", "10.0.0.3")
SHARDS = [f"shardId-{i}" for i in range(4)]


def ranges(shard_ids):
    return [ShardRange("k", s, 1000, ESN.TRIM_HORIZON, None, 0, 100, 1.0) for s in shard_ids]


def test_shards_keep_their_executor_across_batches():
    placement = ShardPlacement()
    first = placement.place(SHARDS, [A, B])
    assert sorted(first.values()).count(A) == 2 and sorted(first.values()).count(B) == 2
    for _ in range(3):
        assert placement.place(SHARDS, [A, B]) == first
    assert placement.place(SHARDS, [A, B, C]) == first  # a new executor takes no shard away


def test_a_lost_executors_shards_and_new_shards_go_to_the_least_loaded():
    placement = ShardPlacement()
    first = placement.place(SHARDS, [A, B])
    after = placement.place(SHARDS + ["shardId-9"], [B, C])
    for shard, executor in first.items():
        assert after[shard] == (B if executor == B else C)
    assert after["shardId-9"] in (B, C)
    assert sorted(after.values()).count(C) >= 2


def test_a_task_reads_one_executors_shards_only():
    placed = ShardPlacement().place(SHARDS, [A, B])
    tasks = located_groups(ranges(SHARDS), placed, shards_per_task=32, parallelism=2)
    assert sorted(r.shard_id for group, _ in tasks for r in group) == SHARDS
    for group, executor in tasks:
        assert {placed[r.shard_id] for r in group} == {executor}
