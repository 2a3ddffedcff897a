"""Pure logic of the driver's Spark glue: the checkpoint policy, rate limits, storage level."""
from __future__ import annotations

from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.spark.checkpointer import SHARD_END, KinesisCheckpointer
from kinesis_dstream.spark.rate import RateController, RateSettings

TRIM = ESN("TRIM_HORIZON")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def owned(*shard_ids: str, interval_s: float = 0, clock: Clock | None = None) -> KinesisCheckpointer:
    """A checkpointer whose shards we took at TRIM_HORIZON."""
    cp = KinesisCheckpointer(interval_s=interval_s, clock=clock or Clock())
    for shard_id in shard_ids:
        cp.shard_started(shard_id, TRIM)
    return cp


def run(cp: KinesisCheckpointer, time_ms: int, reached: dict, succeeded: bool = True) -> None:
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
    cp = KinesisCheckpointer(0, Clock())
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


def test_batches_are_cached_with_one_replica_and_nothing_else_changed() -> None:
    from pyspark import StorageLevel

    from kinesis_dstream.spark.storage_level import unreplicated

    level = unreplicated(StorageLevel.MEMORY_AND_DISK_2)
    assert (level.useDisk, level.useMemory, level.useOffHeap, level.deserialized,
            level.replication) == (True, True, False, False, 1)
    assert unreplicated(StorageLevel.DISK_ONLY) is StorageLevel.DISK_ONLY
    assert unreplicated(StorageLevel.NONE) is None
    assert unreplicated(None) is None


def test_a_shard_sits_out_while_where_its_previous_batch_ended_is_unknown() -> None:
    """A batch whose read-ahead failed records its range later, in its own output operation;
    a batch planned meanwhile must not guess where it starts (it would read those records a
    second time). The shard is planned again once that batch completed or reported."""
    from kinesis_dstream.aws.lease_table import Lease
    from kinesis_dstream.aws.range_table import BatchRange
    from kinesis_dstream.config import ConsumerConfig
    from kinesis_dstream.spark.coordinator import ShardCoordinator
    from kinesis_dstream.retrieval import ReadReport

    config = ConsumerConfig(application_name="app", stream_name="s", region_name="us-east-1",
                            aws_access_key_id="AKIDEXAMPLE", aws_secret_key="secret")
    coordinator = ShardCoordinator(config, kinesis=object(), lease_table=object(),
                                   range_table=object())
    coordinator.add_member("m")
    coordinator.periods.open(Lease("shardId-0", lease_owner=config.worker_id))

    def shards(batch_ms: int) -> list[tuple[str, ESN | None]]:
        return [(p.shard_id, p.start) for p in coordinator.plan("m", batch_ms).shards]

    assert shards(1000) == [("shardId-0", TRIM)]  # a period's first batch starts at its floor
    assert shards(2000) == []  # batch 1000's read-ahead reported nothing
    coordinator.batch_completed("m", 1000, False, {})
    assert shards(3000) == [("shardId-0", None)]  # its end unknown here: the task looks it up
    report = ReadReport(BatchRange("m", "shardId-0", 3000, TRIM, end=ESN("5"), records=1))
    coordinator.batch_read("m", 3000, {"shardId-0": report})
    assert shards(4000) == [("shardId-0", ESN("5"))]  # a read-ahead report settles it at once


def test_a_reader_process_keeps_its_clients_out_of_the_per_task_garbage_collection() -> None:
    """PySpark's reused workers run gc.collect() after every task; boto3's objects must not be
    walked each time (they were most of the executors' CPU at 200 records/s)."""
    out = _in_a_fresh_reader_process("import gc\n",
                                     "print(gc.get_freeze_count(), len(gc.get_objects()))\n")
    frozen, walked = map(int, out.stdout.split())
    assert frozen > 20_000  # botocore's loaded models and the clients
    assert walked < 2_000  # what a task's gc.collect() still walks


def test_reads_are_short_while_leases_are_still_being_taken() -> None:
    from kinesis_dstream.spark.planner import read_time_budget_s
    from kinesis_dstream.retrieval import MAX_FETCH_TIME_PER_SHARD_S

    assert read_time_budget_s(1000, taking_leases=True) == 0.8
    assert read_time_budget_s(1000, taking_leases=False) == MAX_FETCH_TIME_PER_SHARD_S
    assert read_time_budget_s(10_000, taking_leases=False) == 8.0  # 0.8 of a long interval


def test_an_idle_streams_empty_batch_ranges_are_deleted_25_at_a_time_across_shards() -> None:
    """Empty batches move no checkpoint, so no checkpoint write deletes their ranges: they
    go once 25 have gathered, in one call for every shard, the newest of each kept."""
    from kinesis_dstream.aws.lease_table import Lease
    from kinesis_dstream.aws.range_table import BatchRange
    from kinesis_dstream.config import ConsumerConfig
    from kinesis_dstream.spark.coordinator import ShardCoordinator
    from kinesis_dstream.retrieval import ReadReport

    class Ranges:
        def __init__(self) -> None:
            self.calls: list[list[tuple[str, str, int]]] = []

        def delete(self, ranges):
            self.calls.append(sorted(ranges))
            return len(self.calls[-1])

    config = ConsumerConfig(application_name="app", stream_name="s", region_name="us-east-1",
                            aws_access_key_id="AKIDEXAMPLE", aws_secret_key="secret")
    ranges = Ranges()
    coordinator = ShardCoordinator(config, kinesis=object(), lease_table=object(),
                                   range_table=ranges)
    coordinator.add_member("m")
    for shard_id in ("shardId-0", "shardId-1"):
        coordinator.periods.open(Lease(shard_id, lease_owner=config.worker_id))

    def empty_batch(batch_ms: int) -> None:
        planned = coordinator.plan("m", batch_ms).shards
        reports = {p.shard_id: ReadReport(BatchRange(
            "m", p.shard_id, batch_ms, TRIM, end=None, records=0)) for p in planned}
        coordinator.batch_read("m", batch_ms, reports)
        coordinator.batch_completed("m", batch_ms, True, reports)

    for n in range(1, 13):
        empty_batch(n * 1000)
    coordinator._write_checkpoints(force=False)
    assert ranges.calls == []  # 22 surplus ranges: not yet a full call
    empty_batch(13_000)
    empty_batch(14_000)
    coordinator._write_checkpoints(force=False)
    assert ranges.calls == [sorted(("m", s, n * 1000) for s in ("shardId-0", "shardId-1")
                                   for n in range(1, 14))]  # 26: batch 14000's stay
    coordinator._write_checkpoints(force=False)
    assert len(ranges.calls) == 1  # deleted once


def test_an_executor_process_logs_with_time_level_and_logger() -> None:
    """A Python worker has no logging set up; our lines must still say when, how bad and who."""
    import re
    out = _in_a_fresh_reader_process("", "executor_process.log.info('not shown')\n"
                                         "executor_process.log.warning('reading shard x failing')\n")
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING "
                    r"kinesis_dstream\.retrieval\.executor_process \[pid \d+\]: reading shard x failing$",
                    lines[0]), lines[0]


def _in_a_fresh_reader_process(before: str, after: str):
    """Run ``before``, an executor reader's clients being made, then ``after``, in a new
    Python process (as a Spark Python worker starts); its completed process."""
    import os
    import subprocess
    import sys

    code = (before + "from kinesis_dstream.config import ConsumerConfig\n"
            "from kinesis_dstream.retrieval import executor_process\n"
            "config = ConsumerConfig(application_name='app', stream_name='s', "
            "region_name='us-east-1', kinesis_endpoint='http://127.0.0.1:9', "
            "dynamodb_endpoint='http://127.0.0.1:9')\n"
            "executor_process.clients_for(config)\n" + after)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "AWS_ACCESS_KEY_ID": "x",
                                          "AWS_SECRET_ACCESS_KEY": "y"})
    assert out.returncode == 0, out.stderr
    return out
