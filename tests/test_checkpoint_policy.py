"""The DStream driver's checkpoint policy (each shard's ShardTrack and KinesisCheckpointer),
pure logic: which position is due when, after which batch completed."""
from __future__ import annotations

import pytest

from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.spark.checkpointer import SHARD_END, KinesisCheckpointer
from kinesis_dstream.spark.lease_period import ShardTrack

pytestmark = pytest.mark.unit

TRIM = ESN("TRIM_HORIZON")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Shards:
    """The policy over some shards' tracks, driven as the coordinator drives it through each
    shard's ShardState (which holds its track while it holds the lease)."""

    def __init__(self, interval_s: float, clock: Clock) -> None:
        self.policy = KinesisCheckpointer(interval_s, clock)
        self.tracks: dict[str, ShardTrack] = {}

    def shard_started(self, shard_id: str, checkpoint: ESN) -> None:
        self.tracks[shard_id] = ShardTrack(shard_id, written=checkpoint)

    def shard_closed(self, shard_id: str) -> None:
        self.tracks.pop(shard_id, None)

    def batch_generated(self, time_ms: int, shard_ids) -> None:
        for s in shard_ids:
            self.tracks[s].batch_generated(time_ms)

    def batch_completed(self, time_ms: int, succeeded: bool, reached: dict, shard_ids) -> list:
        return [s for s in shard_ids if s in self.tracks and self.tracks[s].batch_completed(
            time_ms, succeeded, *reached.get(s, (None, False)))]

    def due_checkpoints(self, force: bool = False) -> list:
        return self.policy.due_checkpoints(self.tracks.values(), force)

    def checkpoint_written(self, shard_id: str, position: ESN) -> None:
        track = self.tracks[shard_id]
        track.written, track.written_at = position, self.policy.clock()

    def has_running_batches(self, shard_id: str) -> bool:
        return self.tracks[shard_id].has_running_batches

    def has_failed(self, shard_id: str) -> bool:
        return self.tracks[shard_id].has_failed

    def completed_position(self, shard_id: str) -> ESN | None:
        return self.tracks[shard_id].completed


def owned(*shard_ids: str, interval_s: float = 0, clock: Clock | None = None) -> Shards:
    """A checkpointer whose shards we took at TRIM_HORIZON."""
    cp = Shards(interval_s, clock or Clock())
    for shard_id in shard_ids:
        cp.shard_started(shard_id, TRIM)
    return cp


def run(cp: Shards, time_ms: int, reached: dict, succeeded: bool = True) -> None:
    """Batch ``time_ms`` planned the shards of ``reached`` and completed."""
    cp.batch_generated(time_ms, reached)
    cp.batch_completed(time_ms, succeeded, {s: (ESN(*p) if p else None, False)
                                            for s, p in reached.items()}, reached)


def test_position_written_only_after_its_batch_completed() -> None:
    cp = owned("s1")
    cp.batch_generated(1000, ["s1"])
    assert cp.due_checkpoints() == []
    cp.batch_completed(1000, True, {"s1": (ESN("10", 2), False)}, ["s1"])
    assert cp.due_checkpoints() == [("s1", ESN("10", 2))]
    cp.checkpoint_written("s1", ESN("10", 2))
    assert cp.due_checkpoints() == []  # nothing new


def test_failed_batch_blocks_later_positions_of_its_shards() -> None:
    cp = owned("s1", "s2")
    cp.batch_generated(1000, ["s1", "s2"])
    cp.batch_generated(2000, ["s1"])
    cp.batch_generated(3000, ["s1", "s2"])
    cp.batch_completed(1000, True, {"s1": (ESN("10"), False), "s2": (ESN("20", 3), False)},
                       ["s1", "s2"])
    cp.batch_completed(2000, False, {"s1": (ESN("11"), False)}, ["s1"])
    cp.batch_completed(3000, True, {"s1": (ESN("12"), False), "s2": (ESN("21"), False)},
                       ["s1", "s2"])
    assert dict(cp.due_checkpoints()) == {"s1": ESN("10"), "s2": ESN("21")}
    assert cp.has_failed("s1") and not cp.has_failed("s2")


def test_out_of_order_completion_waits_for_earlier_batches() -> None:
    cp = owned("s1")
    cp.batch_generated(1000, ["s1"])
    cp.batch_generated(2000, ["s1"])
    cp.batch_completed(2000, True, {"s1": (ESN("11", 5), False)}, ["s1"])
    assert cp.due_checkpoints() == [] and cp.has_running_batches("s1")
    cp.batch_completed(1000, True, {"s1": (ESN("10"), False)}, ["s1"])
    assert cp.due_checkpoints() == [("s1", ESN("11", 5))]
    assert not cp.has_running_batches("s1")


def test_a_planned_shard_no_task_read_makes_no_progress() -> None:
    cp = owned("s1", "s2")
    run(cp, 1000, {"s1": ("10", 0), "s2": None})  # s2's partition was never computed
    assert cp.due_checkpoints() == [("s1", ESN("10"))]
    assert cp.completed_position("s2") is None


def test_batches_of_another_input_stream_are_not_touched() -> None:
    cp = owned("s1", "s2")
    cp.batch_generated(1000, ["s1"])  # stream A
    cp.batch_generated(1000, ["s2"])  # stream B, same batch time
    cp.batch_completed(1000, True, {"s1": (ESN("10"), False)}, ["s1"])
    assert cp.has_running_batches("s2")  # B's completion is still to come
    cp.batch_completed(1000, True, {"s2": (ESN("7"), False)}, ["s2"])
    assert dict(cp.due_checkpoints()) == {"s1": ESN("10"), "s2": ESN("7")}


def test_at_most_one_checkpoint_per_interval_per_shard() -> None:
    clock = Clock()
    cp = owned("s1", interval_s=10, clock=clock)
    for i, t in enumerate((1000, 2000, 3000)):
        run(cp, t, {"s1": (str(10 + i), 0)})
        clock.now += 1
        due = cp.due_checkpoints()
        assert len(due) == (1 if i == 0 else 0)
        for shard_id, position in due:
            cp.checkpoint_written(shard_id, position)
    assert cp.due_checkpoints(force=True) == [("s1", ESN("12"))]  # a graceful stop
    clock.now += 10
    assert cp.due_checkpoints() == [("s1", ESN("12"))]


def test_nothing_at_or_below_the_lease_checkpoint_is_due() -> None:
    cp = Shards(0, Clock())
    cp.shard_started("s1", ESN("20"))  # taken at a checkpoint someone else wrote
    run(cp, 1000, {"s1": ("9", 0)})  # "9" > "20" as text: compare as numbers
    assert cp.due_checkpoints() == []
    run(cp, 2000, {"s1": ("30", 1)})
    assert cp.due_checkpoints() == [("s1", ESN("30", 1))]


def test_a_lost_lease_stops_every_checkpoint_of_the_shard() -> None:
    cp = owned("s1")
    cp.batch_generated(1000, ["s1"])
    cp.shard_closed("s1")
    cp.batch_completed(1000, True, {"s1": (ESN("10"), False)}, ["s1"])
    assert cp.due_checkpoints() == []


def test_shard_end_is_due_only_after_the_batch_with_the_last_records_completed() -> None:
    cp = owned("s1")
    cp.batch_generated(1000, ["s1"])
    cp.batch_generated(2000, ["s1"])
    cp.batch_completed(2000, True, {"s1": (None, True)}, ["s1"])  # read nothing more: the end
    assert cp.due_checkpoints() == []  # batch 1000, with the last records, still runs
    cp.batch_completed(1000, True, {"s1": (ESN("50"), False)}, ["s1"])
    assert cp.due_checkpoints() == [("s1", SHARD_END)]
    cp.checkpoint_written("s1", SHARD_END)
    assert cp.due_checkpoints() == []


def test_shard_end_never_follows_a_failed_batch() -> None:
    cp = owned("s1")
    run(cp, 1000, {"s1": ("50", 0)}, succeeded=False)
    cp.batch_generated(2000, ["s1"])
    cp.batch_completed(2000, True, {"s1": (None, True)}, ["s1"])
    assert cp.due_checkpoints() == []
