"""The driver's wiring without Spark: which batch event moves a checkpoint.

A ShardCoordinator with two input streams (members) over four held leases; its lease table is
a fake that records checkpoint writes (the coordinator's own logic, the lease coordinator and
the checkpoint policy are the real ones). The listener is fed Spark-shaped batch infos.
These guard what the end-to-end tests guard slowly: only a completed batch is checkpointed,
a failed one never, a read-ahead report is not a completion, and the members split the shards.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kinesis_dstream.aws.lease_table import Lease
from kinesis_dstream.aws.range_table import BatchRange
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.retrieval import ReadReport
from kinesis_dstream.spark.coordinator import ShardCoordinator

pytestmark = pytest.mark.unit

TRIM = ESN("TRIM_HORIZON")
SHARDS = [f"shardId-{i:012d}" for i in range(4)]


class Table:
    """The lease table's checkpoint write, recorded (the rest is never called here)."""

    def __init__(self) -> None:
        self.checkpoints: list[tuple[str, ESN]] = []

    def update_checkpoint(self, lease: Lease, position: ESN) -> Lease:
        self.checkpoints.append((lease.lease_key, position))
        return replace(lease, checkpoint=position, lease_counter=lease.lease_counter + 1)


class Ranges:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, str, int]] = []

    def delete(self, ranges: Any) -> int:
        self.deleted += list(ranges)
        return len(self.deleted)


@pytest.fixture
def coordinator() -> ShardCoordinator:
    config = ConsumerConfig(application_name="app", stream_name="s", region_name="us-east-1",
                            aws_access_key_id="AKIDEXAMPLE", aws_secret_key="secret",
                            checkpoint_interval_ms=0)
    table = Table()
    coordinator = ShardCoordinator(config, kinesis=object(), lease_table=table,
                                   range_table=Ranges())
    coordinator.add_member("m1")
    coordinator.add_member("m2")
    for shard_id in SHARDS:
        lease = Lease(shard_id, lease_owner=config.worker_id, lease_counter=1)
        coordinator.leases._owned[shard_id] = lease
        coordinator.periods.open(lease)
    return coordinator


def _reports(coordinator: ShardCoordinator, member: str, batch_ms: int,
             end: int) -> dict[str, ReadReport]:
    planned = coordinator.plan(member, batch_ms).shards
    return {p.shard_id: ReadReport(BatchRange(
        member, p.shard_id, batch_ms, p.start or TRIM, end=ESN(str(end)), records=1))
        for p in planned}


def _read_ahead(coordinator: ShardCoordinator, member: str, batch_ms: int,
                end: int) -> dict[str, ReadReport]:
    """Plan a batch and report its read-ahead: the reads are known, nothing completed."""
    reports = _reports(coordinator, member, batch_ms, end)
    coordinator.batch_read(member, batch_ms, reports)
    return reports


def _written(coordinator: ShardCoordinator) -> dict[str, ESN]:
    coordinator._write_checkpoints(force=True)
    return dict(coordinator.table.checkpoints)


def test_the_members_split_the_shards_and_plan_each_shard_once(coordinator) -> None:
    one = {p.shard_id for p in coordinator.plan("m1", 1000).shards}
    two = {p.shard_id for p in coordinator.plan("m2", 1000).shards}
    assert one and two and not one & two and one | two == set(SHARDS)


def test_a_child_shard_is_planned_only_once_its_parent_checkpointed_shard_end(
        coordinator) -> None:
    child, parent = SHARDS[0], "shardId-parent"
    leases = coordinator.leases
    leases._owned[child] = replace(leases._owned[child], parent_shard_ids=frozenset({parent}))
    leases._all[parent] = Lease(parent, checkpoint=ESN("5"))

    def planned(batch_ms: int) -> set[str]:
        return {p.shard_id for m in ("m1", "m2") for p in coordinator.plan(m, batch_ms).shards}

    assert planned(1000) == set(SHARDS) - {child} and coordinator._waiting_on_parents()
    leases._all[parent] = Lease(parent, checkpoint=ESN("SHARD_END"))
    assert child in planned(2000) and not coordinator._waiting_on_parents()


def test_a_read_ahead_report_is_not_a_completion(coordinator) -> None:
    reports = _read_ahead(coordinator, "m1", 1000, end=7)
    assert _written(coordinator) == {}
    coordinator.batch_completed("m1", 1000, True, reports)
    assert _written(coordinator) == {shard: ESN("7") for shard in reports}


def test_a_completed_batch_is_checkpointed_only_for_its_own_member(coordinator) -> None:
    first = _reports(coordinator, "m1", 1000, end=7)
    second = _reports(coordinator, "m2", 1000, end=9)
    coordinator.batch_read("m1", 1000, first)
    coordinator.batch_read("m2", 1000, second)
    coordinator.batch_completed("m2", 1000, True, second)
    assert _written(coordinator) == {shard: ESN("9") for shard in second}


def test_a_failed_batch_stops_its_shards_checkpoints_for_good(coordinator) -> None:
    failed = _read_ahead(coordinator, "m1", 1000, end=7)
    later = _read_ahead(coordinator, "m1", 2000, end=8)
    coordinator.batch_completed("m1", 1000, False, failed)
    coordinator.batch_completed("m1", 2000, True, later)
    assert _written(coordinator) == {}  # records of batch 1000 come again after a restart
    other = _reports(coordinator, "m2", 1000, end=9)
    coordinator.batch_completed("m2", 1000, True, other)
    assert set(_written(coordinator)) == set(other)


def test_batches_are_checkpointed_in_order_whatever_order_they_complete_in(coordinator) -> None:
    first = _read_ahead(coordinator, "m1", 1000, end=7)
    second = _read_ahead(coordinator, "m1", 2000, end=8)
    coordinator.batch_completed("m1", 2000, True, second)
    assert _written(coordinator) == {}  # batch 1000 is still running
    coordinator.batch_completed("m1", 1000, True, first)
    assert _written(coordinator) == {shard: ESN("8") for shard in second}


def test_the_next_batch_starts_where_the_reported_read_ended_with_its_iterator(coordinator) -> None:
    planned = coordinator.plan("m1", 1000).shards
    shard = planned[0].shard_id
    report = ReadReport(BatchRange("m1", shard, 1000, TRIM, end=ESN("7"), records=1),
                        next_iterator="iterator-after-7", iterator_time=__import__("time").time())
    coordinator.batch_read("m1", 1000, {shard: report})
    again = {p.shard_id: p for p in coordinator.plan("m1", 2000).shards}
    assert (again[shard].start, again[shard].iterator) == (ESN("7"), "iterator-after-7")
    stale = replace(report, batch_range=replace(report.batch_range, batch_ms=2000),
                    iterator_time=0.0)
    coordinator.batch_read("m1", 2000, {shard: stale})
    later = {p.shard_id: p for p in coordinator.plan("m1", 3000).shards}
    assert (later[shard].start, later[shard].iterator) == (ESN("7"), None)  # expired: none


class _Op:
    def __init__(self, failure: str | None) -> None:
        self._failure = failure

    def failureReason(self) -> str | None:  # noqa: N802 - Spark's name
        return self._failure


class _Info:
    def __init__(self, time_ms: int, failures: list[str | None]) -> None:
        self.time_ms, self.ops = time_ms, {i: _Op(f) for i, f in enumerate(failures)}

    def batchTime(self) -> Any:  # noqa: N802
        return type("T", (), {"milliseconds": lambda _: self.time_ms})()

    def outputOperationInfos(self) -> Any:  # noqa: N802
        return type("M", (), {"values": lambda _: list(self.ops.values())})()

    def processingDelay(self) -> int:  # noqa: N802
        return 5

    def schedulingDelay(self) -> int:  # noqa: N802
        return 1


class _Completed:
    def __init__(self, info: _Info) -> None:
        self.info = info

    def batchInfo(self) -> _Info:  # noqa: N802
        return self.info


def test_the_listener_reports_a_batch_with_a_failed_output_operation_as_failed() -> None:
    from kinesis_dstream.spark.dstream import BatchListener  # needs pyspark (a test extra)

    seen: list[tuple[int, bool, str | None]] = []

    class Planner:
        name = "p"

        def batch_completed(self, time_ms, succeeded, processing, scheduling, failure):
            seen.append((time_ms, succeeded, failure))

    listener = BatchListener([Planner()])
    listener.onBatchCompleted(_Completed(_Info(1000, [None, None])))
    listener.onBatchCompleted(_Completed(_Info(2000, [None, "boom: the job failed"])))
    assert seen == [(1000, True, None), (2000, False, "boom: the job failed")]


class Recorded:
    """A MetricsPublisher's ``record``, kept: (metric, value, shard)."""

    def __init__(self) -> None:
        self.data: list[tuple[str, float, str | None]] = []

    def record(self, name: str, value: float, **dims: Any) -> None:
        self.data.append((name, value, dims.get("shard_id")))


def test_get_records_success_counts_answered_calls_not_refused_shard_iterators(coordinator) -> None:
    """CloudWatch's getRecords.Success: one 1 per GetRecords Kinesis answered, one 0 per
    refusal. A read whose GetShardIterator was refused once, then made two GetRecords calls
    of which one was refused, had one answered call (calls minus refusals would say zero)."""
    from kinesis_dstream.worker import metrics as m

    published = Recorded()
    coordinator.publisher = published  # type: ignore[assignment]
    shard = SHARDS[0]
    planned = {p.shard_id for p in coordinator.plan("m1", 1000).shards}
    assert shard in planned
    report = ReadReport(BatchRange("m1", shard, 1000, TRIM, end=ESN("7"), records=1),
                        get_records_calls=2, get_records_ms=4.0, throttled=2,
                        get_records_served=1)
    coordinator.batch_completed("m1", 1000, True, {shard: report})
    success = [v for name, v, s in published.data if name == m.GET_RECORDS_SUCCESS and s == shard]
    assert sorted(success) == [0, 0, 1]


class _SparkContext:
    """Just what BatchPlanner._build asks of a SparkContext; it keeps the ranges planned."""

    defaultParallelism = 2

    def __init__(self) -> None:
        self.ranges: dict[int, list] = {}

    def accumulator(self, value: Any, param: Any) -> Any:
        return type("Accumulator", (), {"value": value})()

    def emptyRDD(self) -> str:  # noqa: N802
        return "empty"

    def parallelize(self, groups: list, slices: int) -> Any:
        ranges = [r for group in groups for r in group]
        self.ranges[ranges[0].batch_ms] = ranges
        return type("RDD", (), {"mapPartitions": lambda _self, f: BatchTime(ranges[0].batch_ms)})()


class BatchTime(int):
    """The fake context's batch RDD: its batch time, with PySpark's serializer attribute."""

    _jrdd_deserializer = None


def _unstored_planner(coordinator: ShardCoordinator) -> Any:
    from pyspark import StorageLevel

    from kinesis_dstream.spark.planner import BatchPlanner, StreamSpec

    planner = BatchPlanner(StreamSpec("m1", coordinator.config.to_dict(),
                                      storage_level=StorageLevel.NONE), coordinator)
    planner.attached = True
    return planner


def test_with_storage_level_none_the_next_batch_waits_for_the_previous_ones_completion(
        coordinator, caplog) -> None:
    """No read-ahead: every range records even an empty read, and batch 2000 is planned
    only once batch 1000 completed, so its shards start where 1000's reads ended instead of
    sitting it out. A stop releases a waiting batch; a wait that gave up is not repeated."""
    import threading
    import time

    caplog.set_level("DEBUG", logger="kinesis_dstream.spark")
    sc = _SparkContext()
    planner = _unstored_planner(coordinator)
    assert planner.batch_rdd(sc, 1000, None) == 1000
    first = sc.ranges[1000]
    assert first and all(r.record_empty for r in first)
    second = threading.Thread(target=planner.batch_rdd, args=(sc, 2000, None))
    second.start()
    deadline = time.monotonic() + 30
    while "batch 2000 waits for batch 1000" not in caplog.text:
        assert time.monotonic() < deadline, "batch 2000 did not wait"
        time.sleep(0.01)
    assert 2000 not in sc.ranges
    planner.reports.value.update({("m1", r.shard_id, 1000): ReadReport(BatchRange(
        "m1", r.shard_id, 1000, TRIM, end=ESN("7"), records=1)) for r in first})
    planner.batch_completed(1000, True, 10, 0, None)
    second.join(30)
    assert not second.is_alive()
    assert {r.shard_id: r.start for r in sc.ranges[2000]} == {r.shard_id: ESN("7") for r in first}
    # batch 2000 completes without a report (no output operation read it): its shards are
    # planned again, their start looked up by the task
    planner.batch_completed(2000, True, 10, 0, None)
    planner.batch_rdd(sc, 3000, None)
    assert {r.shard_id: r.start for r in sc.ranges[3000]} == {r.shard_id: None for r in first}
    # 3000 never completes: 4000 gives up waiting (its shards sit out), 5000 does not wait
    assert not planner.unread.wait(4000, 0.01)
    assert planner.batch_rdd(sc, 4000, None) == "empty"
    assert planner.unread.wait(5000, 600)
    planner.unread.waited_out = 0
    planner.stopping = True
    assert not planner.unread.wait(5000, 600)  # at once: a stop waits for nothing


class _LocalExecutors:
    """``sc._jsc``'s executor list in local mode: the driver's only, so no executor."""

    def sc(self) -> "_LocalExecutors":
        return self

    def statusStore(self) -> "_LocalExecutors":  # noqa: N802
        return self

    def executorList(self, active: bool) -> Any:  # noqa: N802
        return type("Seq", (), {"size": lambda self: 0})()


def test_under_fan_out_a_range_names_its_shards_subscription_holder_and_the_drivers_key(
        coordinator) -> None:
    """A shard's range carries the process its previous read named as holding the shard's
    subscription, for the task to ask wherever it runs (another Python worker of an executor
    with several cores, say), and the driver's key that proves the task to that process."""
    from pyspark import StorageLevel

    from kinesis_dstream.spark.planner import BatchPlanner, StreamSpec

    fan_out = coordinator.config.replace(
        retrieval_mode="FANOUT", consumer_arn="arn:aws:kinesis:us-east-1:1:stream/s/consumer/app:1")
    sc = _SparkContext()
    sc._jsc = _LocalExecutors()  # type: ignore[attr-defined]
    key = b"k" * 32
    planner = BatchPlanner(StreamSpec("m1", fan_out.to_dict(), storage_level=StorageLevel.NONE),
                           coordinator, key)
    planner.attached = True
    planner.batch_rdd(sc, 1000, None)
    first = sc.ranges[1000]
    assert {(r.subscriber, r.peer_key) for r in first} == {(None, key)}  # held nowhere yet
    holders = {r.shard_id: f"10.0.0.{n}:4000" for n, r in enumerate(first)}
    planner.reports.value.update({("m1", r.shard_id, 1000): ReadReport(BatchRange(
        "m1", r.shard_id, 1000, TRIM, end=ESN("7"), records=1, subscriber=holders[r.shard_id]))
        for r in first})
    planner.batch_completed(1000, True, 10, 0, None)
    planner.batch_rdd(sc, 2000, None)
    assert {r.shard_id: (r.subscriber, r.peer_key) for r in sc.ranges[2000]} == \
        {shard_id: (holder, key) for shard_id, holder in holders.items()}
    assert BatchPlanner(StreamSpec("m2", fan_out.to_dict()), coordinator).peer_key  # its own
    assert _unstored_planner(coordinator).peer_key is None  # polling: nothing to find


class _ReadAheadContext:
    """Just what BatchPlanner._build asks of a SparkContext when batches are cached: the
    read-ahead's ``count`` stands for the tasks, reporting each planned range as read (one
    record each) and, for the batches in ``more_left``, stopped before the shard's tip."""

    defaultParallelism = 2

    def __init__(self) -> None:
        self.counted: list[tuple[int, str]] = []  # (batch, thread name) of each read-ahead
        self.more_left: set[int] = set()
        self.hold: dict[int, Any] = {}  # batch -> threading.Event the read-ahead waits for
        self.reading: dict[int, Any] = {}  # batch -> threading.Event set when it starts
        self.acc: Any = None
        self.position = 0
        self.failing: set[int] = set()  # batches whose RDD cannot be made

    def accumulator(self, value: Any, param: Any) -> Any:
        self.acc = type("Accumulator", (), {"value": value})()
        return self.acc

    def setLocalProperty(self, key: str, value: Any) -> None:  # noqa: N802
        pass

    def parallelize(self, groups: list, slices: int) -> Any:
        ranges = [r for group in groups for r in group]
        if ranges[0].batch_ms in self.failing:
            raise RuntimeError("SparkContext was shut down")
        sc = self

        class Rdd:
            _jrdd_deserializer = None

            def mapPartitions(self, f: Any) -> "Rdd":  # noqa: N802
                return self

            def persist(self, level: Any) -> "Rdd":
                return self

        class JavaRdd:
            def count(self) -> int:
                import threading

                batch_ms = ranges[0].batch_ms
                if batch_ms in sc.reading:
                    sc.reading[batch_ms].set()
                if batch_ms in sc.hold:
                    assert sc.hold[batch_ms].wait(30)
                sc.counted.append((batch_ms, threading.current_thread().name))
                for r in ranges:
                    sc.position += 1
                    sc.acc.value[(r.stream_key, r.shard_id, r.batch_ms)] = ReadReport(
                        BatchRange(r.stream_key, r.shard_id, r.batch_ms, r.start or TRIM,
                                   end=ESN(str(sc.position)), records=1),
                        more_left=batch_ms in sc.more_left)
                return len(ranges)

        rdd = Rdd()
        rdd.batch_ms, rdd._jrdd = ranges[0].batch_ms, JavaRdd()  # type: ignore[attr-defined]
        return rdd


def _cached_planner(coordinator: ShardCoordinator) -> Any:
    from pyspark import StorageLevel

    from kinesis_dstream.spark.planner import BatchPlanner, StreamSpec

    planner = BatchPlanner(StreamSpec("m1", coordinator.config.to_dict(),
                                      storage_level=StorageLevel.MEMORY_AND_DISK), coordinator)
    planner.attached = True
    return planner


def _early_read_done(planner: Any) -> None:
    assert planner.read_ahead.idle(30)


def test_a_backlog_is_read_one_batch_ahead_of_sparks_clock_and_no_further(coordinator) -> None:
    """The first batch is read as soon as it is asked for early (the context's start); the
    batch after one whose reads stopped before a shard's tip is read as soon as Spark has
    that one, starting where it ended; Spark's call finds it built. Never two ahead, and
    nothing early once a batch reached every tip."""
    import threading

    sc, planner, values = _ReadAheadContext(), _cached_planner(coordinator), list
    sc.more_left = {1000, 2000}
    planner.read_early(sc, 1000, values)
    _early_read_done(planner)
    assert [b for b, _ in sc.counted] == [1000]
    assert sc.counted[0][1] != threading.current_thread().name  # in the background
    rdd = planner.batch_rdd(sc, 1000, values)
    assert rdd.batch_ms == 1000
    _early_read_done(planner)  # 1000 stopped before a tip: 2000 is read now
    assert [b for b, _ in sc.counted] == [1000, 2000]
    ended = {k[1]: r.batch_range.end for k, r in sc.acc.value.items() if k[2] == 1000}
    starts = {k[1]: r.batch_range.start for k, r in sc.acc.value.items() if k[2] == 2000}
    assert starts == ended and ended
    planner.read_early(sc, 3000, values)  # not before Spark has asked for 2000
    _early_read_done(planner)
    assert [b for b, _ in sc.counted] == [1000, 2000]
    assert planner.batch_rdd(sc, 2000, values).batch_ms == 2000
    _early_read_done(planner)
    assert [b for b, _ in sc.counted] == [1000, 2000, 3000]
    assert planner.batch_rdd(sc, 3000, values).batch_ms == 3000  # at every tip
    _early_read_done(planner)
    assert [b for b, _ in sc.counted] == [1000, 2000, 3000]
    planner.batch_rdd(sc, 4000, values)  # Spark's own call, at its time
    assert [b for b, _ in sc.counted] == [1000, 2000, 3000, 4000]


def test_sparks_call_for_a_batch_being_read_early_waits_for_that_read(coordinator) -> None:
    import threading

    sc, planner, values = _ReadAheadContext(), _cached_planner(coordinator), list
    sc.hold[1000], sc.reading[1000] = threading.Event(), threading.Event()
    planner.read_early(sc, 1000, values)
    assert sc.reading[1000].wait(30)
    got: list = []
    spark = threading.Thread(target=lambda: got.append(planner.batch_rdd(sc, 1000, values)))
    spark.start()
    sc.hold[1000].set()
    spark.join(30)
    _early_read_done(planner)
    assert [b for b, _ in sc.counted] == [1000]  # read once, by the early read
    assert got and got[0].batch_ms == 1000


def test_an_early_read_that_failed_fails_sparks_call_for_its_batch(coordinator) -> None:
    """As if Spark's own call had built it: the batch is not planned a second time."""
    sc, planner, values = _ReadAheadContext(), _cached_planner(coordinator), list
    sc.failing = {1000}
    planner.read_early(sc, 1000, values)
    _early_read_done(planner)
    with pytest.raises(RuntimeError, match="SparkContext was shut down"):
        planner.batch_rdd(sc, 1000, values)
    assert sc.counted == []


def test_nothing_is_read_early_without_a_cache_or_while_stopping(coordinator) -> None:
    sc, values = _ReadAheadContext(), list
    unstored = _unstored_planner(coordinator)
    unstored.read_early(sc, 1000, values)
    assert unstored.read_ahead.thread is None
    planner = _cached_planner(coordinator)
    planner.stopping = True
    planner.read_early(sc, 1000, values)
    assert planner.read_ahead.thread is None and sc.counted == []


def test_a_shard_sits_out_while_where_its_previous_batch_ended_is_unknown() -> None:
    """A batch whose read-ahead failed records its range later, in its own output operation;
    a batch planned meanwhile must not guess where it starts (it would read those records a
    second time). The shard is planned again once that batch completed or reported."""
    from kinesis_dstream.aws.lease_table import Lease
    from kinesis_dstream.aws.range_table import BatchRange
    from kinesis_dstream.config import ConsumerConfig
    from kinesis_dstream.retrieval import ReadReport
    from kinesis_dstream.spark.coordinator import ShardCoordinator

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


def test_an_idle_streams_empty_batch_ranges_are_deleted_25_at_a_time_across_shards() -> None:
    """Empty batches move no checkpoint, so no checkpoint write deletes their ranges: they
    go once 25 have gathered, in one call for every shard, the newest of each kept."""
    from kinesis_dstream.aws.lease_table import Lease
    from kinesis_dstream.aws.range_table import BatchRange
    from kinesis_dstream.config import ConsumerConfig
    from kinesis_dstream.retrieval import ReadReport
    from kinesis_dstream.spark.coordinator import ShardCoordinator

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


def test_metrics_carry_the_largest_lag_and_a_shard_whose_batches_stopped_is_stalled_once(
        coordinator, caplog) -> None:
    import logging

    now = [100.0]
    coordinator.stalls.clock = lambda: now[0]
    coordinator.stalls.lag_threshold_ms, coordinator.stalls.stall_time_ms = 1000, 60_000
    planned = coordinator.plan("m1", 1000).shards
    lags = {p.shard_id: 2000 * (n + 1) for n, p in enumerate(planned)}
    reports = {p.shard_id: ReadReport(BatchRange("m1", p.shard_id, 1000, p.start or TRIM,
                                                 end=ESN("7"), records=1), lags[p.shard_id])
               for p in planned}
    coordinator.batch_read("m1", 1000, reports)
    coordinator.batch_completed("m1", 1000, True, reports)
    view = coordinator.metrics()
    assert set(view) == set(SHARDS)  # still one entry per shard
    assert view.millis_behind_latest == max(lags.values()) and view.stalls == 0
    assert coordinator.metrics("m1").millis_behind_latest == max(lags.values())
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.worker.stall"):
        coordinator._watch_stalls()
        now[0] += 60
        coordinator._watch_stalls()  # no batch of m1 completed for a minute: stalled
        now[0] += 60
        coordinator._watch_stalls()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == len(planned) and all(any(s in w for w in warned) for s in lags)
    view = coordinator.metrics()
    assert view.stalled_shards == sorted(lags) and view.stalls == len(planned)
