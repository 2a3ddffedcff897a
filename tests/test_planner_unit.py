"""The DStream planner's pure rules: the storage level of a batch, the read time budget."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_batches_are_cached_with_one_replica_and_nothing_else_changed() -> None:
    from pyspark import StorageLevel

    from kinesis_dstream.spark.storage_level import unreplicated

    level = unreplicated(StorageLevel.MEMORY_AND_DISK_2)
    assert (level.useDisk, level.useMemory, level.useOffHeap, level.deserialized,
            level.replication) == (True, True, False, False, 1)
    assert unreplicated(StorageLevel.DISK_ONLY) is StorageLevel.DISK_ONLY
    assert unreplicated(StorageLevel.NONE) is None
    assert unreplicated(None) is None


def test_reads_are_short_while_leases_are_still_being_taken() -> None:
    from kinesis_dstream.retrieval import MAX_FETCH_TIME_PER_SHARD_S
    from kinesis_dstream.spark.planner import read_time_budget_s

    assert read_time_budget_s(1000, taking_leases=True) == 0.8
    assert read_time_budget_s(1000, taking_leases=False) == MAX_FETCH_TIME_PER_SHARD_S
    assert read_time_budget_s(10_000, taking_leases=False) == 8.0  # 0.8 of a long interval
