"""Pure logic of the Spark glue: checkpoint policy, bounded buffer, rate limits, channel."""
from __future__ import annotations

import os
import stat
import threading

import pytest

from kinesis_dstream.spark import channel
from kinesis_dstream.spark.buffer import RecordBuffer
from kinesis_dstream.spark.checkpointer import KinesisCheckpointer
from kinesis_dstream.spark.rate import RateController, RateSettings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def rec(seq: int, sub: int = 0) -> tuple:
    return (b"x", "pk", str(seq), sub, 0)


# --- KinesisCheckpointer -------------------------------------------------------------------
def owned(*shard_ids: str, interval_s: float = 0, clock: Clock | None = None) -> KinesisCheckpointer:
    """A checkpointer whose shards have an owner (a worker sent INIT at TRIM_HORIZON)."""
    cp = KinesisCheckpointer(interval_s=interval_s, clock=clock or Clock())
    for shard_id in shard_ids:
        cp.shard_started(shard_id)
    return cp


def test_position_written_only_after_its_batch_completed() -> None:
    cp = owned("s1")
    cp.batch_generated(1000, {"s1": ("10", 0)})
    assert cp.due_checkpoints() == []
    cp.batch_completed(1000, succeeded=True)
    assert cp.due_checkpoints() == [("s1", ("10", 0))]
    assert cp.due_checkpoints() == []  # nothing new


def test_failed_batch_blocks_later_positions_of_its_shards() -> None:
    cp = owned("s1", "s2")
    cp.batch_generated(1000, {"s1": ("10", 0), "s2": ("20", 3)})
    cp.batch_generated(2000, {"s1": ("11", 0)})
    cp.batch_generated(3000, {"s1": ("12", 0), "s2": ("21", 0)})
    cp.batch_completed(1000, succeeded=True)
    cp.batch_completed(2000, succeeded=False)
    cp.batch_completed(3000, succeeded=True)
    due = dict(cp.due_checkpoints())
    assert due == {"s1": ("10", 0), "s2": ("21", 0)}  # s1 stops before the failed batch
    assert cp.has_failed("s1") and not cp.has_failed("s2")


def test_out_of_order_completion_waits_for_earlier_batches() -> None:
    cp = owned("s1")
    cp.batch_generated(1000, {"s1": ("10", 0)})
    cp.batch_generated(2000, {"s1": ("11", 5)})
    cp.batch_completed(2000, succeeded=True)
    assert cp.due_checkpoints() == [] and cp.has_running_batches("s1")
    cp.batch_completed(1000, succeeded=True)
    assert cp.due_checkpoints() == [("s1", ("11", 5))]
    assert not cp.has_running_batches("s1")


def test_at_most_one_checkpoint_per_interval_per_shard() -> None:
    clock = Clock()
    cp = owned("s1", interval_s=10, clock=clock)
    for i, t in enumerate((1000, 2000, 3000)):
        cp.batch_generated(t, {"s1": (str(10 + i), 0)})
        cp.batch_completed(t, succeeded=True)
        clock.now += 1
        assert len(cp.due_checkpoints()) == (1 if i == 0 else 0)
    clock.now += 10
    assert cp.due_checkpoints() == [("s1", ("12", 0))]


def test_progress_outlives_a_lease_move_and_goes_to_the_new_owner() -> None:
    cp = owned("s1")
    cp.batch_generated(1000, {"s1": ("10", 0)})
    cp.shard_closed("s1")  # lease lost: nobody to write
    cp.batch_completed(1000, succeeded=True)
    assert cp.due_checkpoints() == []
    cp.shard_started("s1", ("5", 0))  # the new owner starts at the last checkpoint
    assert cp.completed_position("s1") == ("10", 0)
    assert cp.due_checkpoints() == [("s1", ("10", 0))]


def test_nothing_at_or_below_the_new_owners_start_is_handed_out() -> None:
    cp = owned("s1")
    cp.batch_generated(1000, {"s1": ("10", 0)})
    cp.batch_completed(1000, succeeded=True)
    cp.shard_closed("s1")
    cp.shard_started("s1", ("20", 0))  # someone else wrote further meanwhile
    assert cp.due_checkpoints() == []
    cp.batch_generated(2000, {"s1": ("30", 0)})
    cp.batch_completed(2000, succeeded=True)
    assert cp.due_checkpoints() == [("s1", ("30", 0))]


def test_refused_checkpoint_is_handed_out_again_after_the_interval() -> None:
    clock = Clock()
    cp = owned("s1", interval_s=5, clock=clock)
    cp.batch_generated(1000, {"s1": ("10", 0)})
    cp.batch_completed(1000, succeeded=True)
    assert cp.due_checkpoints() == [("s1", ("10", 0))]
    cp.checkpoint_refused("s1", ("10", 0))  # e.g. the old owner had just lost the lease
    assert cp.due_checkpoints() == []  # still one per interval
    clock.now += 5
    assert cp.due_checkpoints() == [("s1", ("10", 0))]
    cp.checkpoint_confirmed("s1", ("10", 0))
    clock.now += 5
    assert cp.due_checkpoints() == []


def test_positions_compare_as_integers() -> None:
    cp = owned("s1")
    cp.batch_generated(1000, {"s1": ("9", 0)})
    cp.batch_completed(1000, succeeded=True)
    cp.shard_closed("s1")
    cp.shard_started("s1", ("10", 0))  # "9" > "10" as text
    assert cp.due_checkpoints() == []


# --- RecordBuffer ---------------------------------------------------------------------------
def test_buffer_acks_late_when_full_and_keeps_order() -> None:
    buf = RecordBuffer(capacity=3)
    acks: list[str] = []
    buf.put("a", [rec(1), rec(2)], lambda: acks.append("a1"))
    buf.put("b", [rec(5)], lambda: acks.append("b1"))
    buf.put("a", [rec(3), rec(4)], lambda: acks.append("a2"))  # 5 > 3: held
    assert acks == ["a1", "b1"]
    runs = buf.take(limit=1)
    assert [(s, [r[2] for r in rs]) for s, rs in runs] == [("a", ["1"])]
    assert acks == ["a1", "b1"]  # 4 still > 3
    runs = buf.take(limit=2)
    assert [(s, [r[2] for r in rs]) for s, rs in runs] == [("a", ["2"]), ("b", ["5"])]
    assert acks == ["a1", "b1", "a2"]
    assert buf.count("a") == 2 and buf.count("b") == 0
    assert [r[2] for _, rs in buf.take() for r in rs] == ["3", "4"]
    assert len(buf) == 0


def test_buffer_release_all_wakes_waiting_workers() -> None:
    buf = RecordBuffer(capacity=1)
    acks: list[int] = []
    buf.put("a", [rec(1), rec(2)], lambda: acks.append(1))
    assert acks == []
    buf.release_all()
    assert acks == [1]


# --- RateController -------------------------------------------------------------------------
def test_max_rate_limits_each_batch() -> None:
    rc = RateController(RateSettings.from_spark_conf({"spark.streaming.receiver.maxRate": "500"}),
                        batch_interval_ms=2000)
    assert rc.batch_limit() == 1000
    assert RateController(RateSettings(), 1000).batch_limit() is None


def test_backpressure_follows_processing_rate() -> None:
    conf = {"spark.streaming.backpressure.enabled": "true",
            "spark.streaming.receiver.maxRate": "100000"}
    rc = RateController(RateSettings.from_spark_conf(conf), batch_interval_ms=1000)
    assert rc.batch_limit() == 100000  # no estimate yet: maxRate
    rc.batch_completed(1000, records=2000, processing_delay_ms=1000, scheduling_delay_ms=0)
    assert rc.batch_limit() == 2000
    # slower processing with a growing scheduling delay: the limit falls
    rc.batch_completed(2000, records=2000, processing_delay_ms=2000, scheduling_delay_ms=1000)
    assert rc.batch_limit() < 2000


# --- channel --------------------------------------------------------------------------------
def test_channel_key_is_private_and_required(tmp_path) -> None:
    got: list[tuple] = []
    done = threading.Event()

    def on_message(peer, message):
        got.append((peer.worker_id, message))
        done.set()

    server = channel.ChannelServer(str(tmp_path), on_message, lambda peer: None)
    try:
        mode = stat.S_IMODE(os.stat(server.authkey_path).st_mode)
        assert mode == 0o600
        conn = channel.connect(server.address, server.authkey_path)
        conn.send((channel.HELLO, "w1", 1))
        conn.send((channel.LAG, "s1", 5))
        assert done.wait(5)
        assert got == [("w1", (channel.LAG, "s1", 5))]
        conn.close()
        bad = tmp_path / "bad.key"
        bad.write_text("00" * 32)
        with pytest.raises(Exception) as info:  # AuthenticationError or a reset connection
            c = channel.connect(server.address, str(bad))
            c.send((channel.LAG, "s1", 1))
            c.recv()
        assert info.type.__name__ in ("AuthenticationError", "ConnectionResetError", "EOFError",
                                      "BrokenPipeError")
        assert len(got) == 1
    finally:
        server.close()
