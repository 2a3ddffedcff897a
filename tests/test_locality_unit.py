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


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_busy_shards_placed_together_spread_one_move_at_a_time():
    clock = Clock()
    placement = ShardPlacement(clock)
    shards = [f"shardId-{i:02d}" for i in range(16)]
    placement.executor_of = {s: (A if i < 8 else B) for i, s in enumerate(shards)}
    busy = {shards[i]: 125.0 for i in (0, 1, 2, 3, 4, 5, 8, 9)}  # 6 on A, 2 on B
    weights = {s: busy.get(s, 0.0) for s in shards}
    holders = {s: f"pid-{placement.executor_of[s][0]}" for s in shards}
    assert placement.balance(weights, [A, B], holders) is None  # not in the first 10 s
    clock.now += 11
    moved = placement.balance(weights, [A, B], holders)
    assert moved in busy and placement.executor_of[moved] == B
    # the moved shard's task subscribes in its new process until its holder changes
    assert placement.subscribe_anew(moved, holders[moved])
    assert not placement.subscribe_anew(shards[1] if moved != shards[1] else shards[2], "x")
    assert placement.balance(weights, [A, B], holders) is None  # not again within 10 s
    clock.now += 11
    second = placement.balance(weights, [A, B], holders)
    assert second in busy and second != moved and placement.executor_of[second] == B
    load = {e: sum(w for s, w in weights.items() if placement.executor_of[s] == e) for e in (A, B)}
    assert load[A] == load[B] == 500
    clock.now += 11
    assert placement.balance(weights, [A, B], holders) is None  # balanced: nothing moves
    assert not placement.subscribe_anew(moved, "pid-1")  # it moved: done
    assert moved not in placement.moving
    assert placement.place(shards, [A, B])[moved] == B  # and it stays


def test_no_move_for_a_small_gain_and_a_stuck_move_is_given_up():
    clock = Clock()
    placement = ShardPlacement(clock)
    placement.executor_of = {"s0": A, "s1": A, "s2": B}
    placement.balance({}, [A, B], {})
    clock.now += 11
    # A 200, B 190: moving either of A's shards would not lower A's load by 15 %
    assert placement.balance({"s0": 100.0, "s1": 100.0, "s2": 190.0}, [A, B], {}) is None
    moved = placement.balance({"s0": 300.0, "s1": 200.0, "s2": 0.0}, [A, B], {"s0": "old"})
    assert moved == "s0"
    for _ in range(15):
        assert placement.subscribe_anew("s0", "old")
    assert not placement.subscribe_anew("s0", "old")  # given up: asks the old process
    assert "s0" not in placement.moving


def test_a_shard_placed_less_than_ten_seconds_ago_is_not_moved():
    """Its subscription there is as young: Kinesis refuses a takeover within 5 s."""
    clock = Clock()
    placement = ShardPlacement(clock)
    placement.place(["s0", "s1"], [A])  # both on A: B joins later
    placement.balance({}, [A], {})
    clock.now += 11
    placement.place(["s0", "s1", "s2"], [A, B])  # s2, new, goes to B
    assert placement.executor_of == {"s0": A, "s1": A, "s2": B}
    placement.executor_of["s2"] = A  # say it had landed on A, just now
    weights = {"s0": 50.0, "s1": 50.0, "s2": 300.0}
    assert placement.balance(weights, [A, B], {}) is None  # s2, the one to move, is new
    clock.now += 11
    assert placement.balance(weights, [A, B], {}) == "s2"


def test_a_shard_no_batch_planned_for_a_while_is_forgotten_with_its_move():
    """A shard whose lease went elsewhere (or that was read to its end) stops counting in
    its executor's load, and its move ends, once no batch planned it for FORGET_AFTER_S."""
    from kinesis_dstream.spark.locality import FORGET_AFTER_S

    clock = Clock()
    placement = ShardPlacement(clock)
    placement.place(SHARDS, [A, B])
    placement.moving["shardId-0"] = ("old", 1)
    clock.now += FORGET_AFTER_S / 2
    placement.place(SHARDS[1:], [A, B])
    assert "shardId-0" in placement.executor_of and "shardId-0" in placement.moving
    clock.now += FORGET_AFTER_S / 2
    placed = placement.place(SHARDS[1:], [A, B])
    assert "shardId-0" not in placement.executor_of and placement.moving == {}
    # the executor it was on counts one shard fewer: the next new shard goes there
    emptier = min((A, B), key=lambda e: sum(1 for x in placed.values() if x == e))
    assert placement.place(SHARDS[1:] + ["shardId-7"], [A, B])["shardId-7"] == emptier
