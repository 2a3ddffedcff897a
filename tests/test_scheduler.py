"""The Scheduler in process, against kinesis-local and moto's DynamoDB server.

What only the scheduler does: the first pass (stream check, table, leases, the taking ramp),
moving from a parent shard to its children, surviving processors and factories that raise,
a bounded graceful shutdown that releases leases, and the per-shard metrics view.
Every processor here records its callbacks in one shared, ordered event list, so tests can
check the order of things across shards (a child's initialize after its parent's end).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import pytest

import emulators
from waiting import wait_for

from kinesis_dstream.errors import StreamNotFoundError
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.worker.lease_taker import TakingPace
from kinesis_dstream.worker.processor import RecordProcessor
from kinesis_dstream.worker.scheduler import Scheduler

# -- helpers ---------------------------------------------------------------------------------

class Events:
    """An ordered, thread-safe log of (event, shard, detail) from every processor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[tuple[str, str, Any]] = []

    def add(self, event: str, shard: str, detail: Any = None) -> None:
        with self._lock:
            self.items.append((event, shard, detail))

    def snapshot(self) -> list[tuple[str, str, Any]]:
        with self._lock:
            return list(self.items)

    def records(self, shard: str | None = None) -> list[Any]:
        """Delivered records (kinesis_dstream.records.Record), in delivery order."""
        return [d for e, s, d in self.snapshot() if e == "record" and (shard is None or s == shard)]

    def data(self, shard: str | None = None) -> set[str]:
        return {r.binary_data.decode() for r in self.records(shard)}

    def index(self, event: str, shard: str) -> list[int]:
        return [i for i, (e, s, _) in enumerate(self.snapshot()) if e == event and s == shard]


class Recorder(RecordProcessor):
    """Records callbacks; checkpoints each batch unless told not to; ``gate`` holds batches."""

    def __init__(self, events: Events, shard_id: str, checkpoint_each_batch: bool = True,
                 gate: threading.Event | None = None):
        self.events, self.shard_id = events, shard_id
        self.checkpoint_each_batch = checkpoint_each_batch
        self.gate = gate

    def initialize(self, i) -> None:
        self.events.add("initialize", self.shard_id, ESN(i.sequence_number, i.sub_sequence_number or 0))

    def process_records(self, i) -> None:
        if self.gate is not None:
            assert self.gate.wait(60), "test gate never opened"
        for record in i.records:
            self.events.add("record", self.shard_id, record)
        if self.checkpoint_each_batch and i.records:
            i.checkpointer.checkpoint()
            self.events.add("checkpoint", self.shard_id, i.records[-1].extended_sequence_number)

    def lease_lost(self, i) -> None:
        self.events.add("lease_lost", self.shard_id)

    def shard_ended(self, i) -> None:
        i.checkpointer.checkpoint()
        self.events.add("shard_ended", self.shard_id)

    def shutdown_requested(self, i) -> None:
        i.checkpointer.checkpoint()
        self.events.add("shutdown_requested", self.shard_id)


def lease_items(dynamodb: str, table: str) -> dict[str, dict]:
    items = emulators.client("dynamodb", dynamodb).scan(TableName=table, ConsistentRead=True)["Items"]
    return {item["leaseKey"]["S"]: item for item in items}


def owners(dynamodb: str, table: str) -> dict[str, str | None]:
    return {k: v.get("leaseOwner", {}).get("S") for k, v in lease_items(dynamodb, table).items()}


def item_checkpoint(item: dict) -> ESN:
    return ESN(item["checkpoint"]["S"], int(item.get("checkpointSubSequenceNumber", {"N": "0"})["N"]))


def put_spread(endpoint: str, stream: str, prefix: str, count: int) -> dict[str, str]:
    """``count`` records over many keys (so over every shard); returns data -> shard id."""
    results = emulators.put_records(endpoint, stream,
                                    [(f"k{i}-{prefix}", f"{prefix}-{i}") for i in range(count)])
    return {r.data.decode(): r.shard_id for r in results}


@pytest.fixture
def schedulers():
    """Schedulers made through this are shut down at teardown, failures included."""
    made: list[Scheduler] = []

    def make(config, factory) -> Scheduler:
        scheduler = Scheduler(config, factory)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.shutdown(timeout_s=5)


# -- 1. the first pass ------------------------------------------------------------------------

@pytest.mark.emulator
@pytest.mark.timeout(90)
def test_first_pass_creates_table_and_leases_and_a_lone_worker_ramps_to_every_shard(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, schedulers):
    stream = make_stream(4)
    expected = put_spread(kinesis_local, stream, "first", 80)
    assert len(set(expected.values())) == 4
    # A taker interval far longer than the test: only the ramp can take the other leases.
    config = make_config(stream, worker_id="solo", lease_taker_interval_ms=60_000)
    events = Events()
    scheduler = schedulers(config, lambda shard_id: Recorder(events, shard_id))
    passes: list[tuple[float, int | None, list[str]]] = []
    take = scheduler.coordinator.take_leases

    def spy(limit: int | None = None) -> list[str]:
        taken = take(limit=limit)
        passes.append((time.monotonic(), limit, taken))
        return taken

    scheduler.coordinator.take_leases = spy  # type: ignore[method-assign]
    scheduler.start()
    # start() returns only once the stream was checked, the table made and leases created.
    ddb = emulators.client("dynamodb", dynamodb)
    table = ddb.describe_table(TableName=config.application_name)["Table"]
    assert table["KeySchema"] == [{"AttributeName": "leaseKey", "KeyType": "HASH"}]
    shard_ids = sorted(set(expected.values()))
    items = lease_items(dynamodb, config.application_name)
    assert sorted(items) == shard_ids
    assert all(item_checkpoint(item) == ESN.TRIM_HORIZON for item in items.values())

    wait_for(lambda: set(scheduler.coordinator.owned_shard_ids()) == set(shard_ids), 20,
             "the lone worker to own every shard")
    ramp = [(limit, len(taken)) for _, limit, taken in passes if taken]
    assert ramp == [(1, 1), (2, 2), (4, 1)], passes
    # Passes come TakingPace's ramp interval apart, not lease_taker_interval_ms: the whole ramp takes
    # about two ramp intervals (the bound leaves room for a loaded machine, and is still
    # far below the 60 s taker interval, which is what it proves).
    first, last = passes[0][0], [t for t, _, taken in passes if taken][-1]
    assert 2 * TakingPace(60.0).ramp_interval_s * 0.9 <= last - first < 10, passes
    assert set(owners(dynamodb, config.application_name).values()) == {"solo"}

    wait_for(lambda: events.data() >= set(expected), 30, "every record")
    # One consumer per shard, each started once, from the lease's checkpoint.
    for shard in shard_ids:
        assert [events.snapshot()[i][2] for i in events.index("initialize", shard)] == [ESN.TRIM_HORIZON]
        assert events.data(shard) == {d for d, s in expected.items() if s == shard}
    assert sorted(scheduler.metrics()) == shard_ids


@pytest.mark.emulator
@pytest.mark.timeout(60)
def test_start_checks_the_stream_before_making_any_table(
        aws_env, kinesis_local, dynamodb, make_config):
    config = make_config("no-such-stream-" + emulators.unique_name("s"))
    scheduler = Scheduler(config, lambda shard_id: RecordProcessor())
    with pytest.raises(StreamNotFoundError):
        scheduler.start()
    tables = emulators.client("dynamodb", dynamodb).list_tables()["TableNames"]
    assert config.application_name not in tables


# -- 2. shard end: release, children, parents first -------------------------------------------

def split(kinesis_endpoint: str, stream: str) -> tuple[str, list[str]]:
    """Split the stream's only open shard in two; returns (parent, [children])."""
    kinesis = emulators.client("kinesis", kinesis_endpoint)
    (parent,) = [s for s in kinesis.list_shards(StreamName=stream)["Shards"]
                 if "EndingSequenceNumber" not in s["SequenceNumberRange"]]
    low, high = int(parent["HashKeyRange"]["StartingHashKey"]), int(parent["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName=stream, ShardToSplit=parent["ShardId"],
                        NewStartingHashKey=str((low + high) // 2))
    emulators.wait_stream_active(kinesis, stream)
    children = sorted(s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]
                      if s.get("ParentShardId") == parent["ShardId"])
    assert len(children) == 2
    return parent["ShardId"], children


@pytest.mark.emulator
@pytest.mark.timeout(120)
def test_shard_end_releases_the_parent_and_creates_and_takes_its_children_at_once(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, schedulers):
    stream = make_stream(1)
    before = put_spread(kinesis_local, stream, "before", 30)
    # Periodic shard sync out of reach: the children's leases can only come from the sync
    # the scheduler runs when a shard ends.
    config = make_config(stream, worker_id="ender", shard_sync_interval_ms=600_000)
    events = Events()
    scheduler = schedulers(config, lambda shard_id: Recorder(events, shard_id))
    scheduler.start()
    wait_for(lambda: events.data() >= set(before), 30, "the parent's records")
    parent, children = split(kinesis_local, stream)
    after = put_spread(kinesis_local, stream, "after", 40)
    assert set(after.values()) == set(children)
    wait_for(lambda: events.data() >= set(after), 40, "the children's records")

    items = lease_items(dynamodb, config.application_name)
    assert sorted(items) == sorted([parent, *children])
    assert items[parent]["checkpoint"]["S"] == "SHARD_END"
    assert "leaseOwner" not in items[parent], "the finished parent's lease was not released"
    assert set(items[parent]["childShardIds"]["SS"]) == set(children)
    for child in children:
        assert items[child]["parentShardId"]["SS"] == [parent]
        assert items[child]["leaseOwner"]["S"] == "ender"
    assert sorted(scheduler.coordinator.owned_shard_ids()) == children
    # Every child started after its parent's shard end, from TRIM_HORIZON.
    (parent_end,) = events.index("shard_ended", parent)
    for child in children:
        (init,) = events.index("initialize", child)
        assert init > parent_end
        assert events.snapshot()[init][2] == ESN.TRIM_HORIZON
    assert parent not in scheduler.metrics()


@pytest.mark.emulator
@pytest.mark.timeout(120)
def test_children_wait_for_their_parent_shard_end_even_when_their_leases_are_held(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, schedulers):
    stream = make_stream(1)
    before = put_spread(kinesis_local, stream, "before", 30)
    gate = threading.Event()  # holds the parent's first batch: the parent cannot finish
    config = make_config(stream, worker_id="waiter", shard_sync_interval_ms=500,
                         parent_shard_poll_interval_ms=200)
    events = Events()
    scheduler = schedulers(config, lambda shard_id: Recorder(events, shard_id, gate=gate))
    try:
        scheduler.start()
        wait_for(lambda: scheduler.metrics() and next(iter(scheduler.metrics().values())).state
                 == "processing", 20, "the parent to process")
        parent, children = split(kinesis_local, stream)
        after = put_spread(kinesis_local, stream, "after", 40)
        # The periodic sync creates the children's leases and the ramp takes them...
        wait_for(lambda: set(children) <= set(scheduler.coordinator.owned_shard_ids()), 30,
                 "the children's leases to be taken")
        wait_for(lambda: all(scheduler.metrics().get(c) is not None for c in children), 10,
                 "consumers for the children")
        time.sleep(3 * config.parent_shard_poll_interval_ms / 1000)
        # ...but their consumers wait: no processor, no record, while the parent is unfinished.
        states = {c: scheduler.metrics()[c].state for c in children}
        assert states == {c: "waiting on parents" for c in children}
        assert not any(s in children for _, s, _ in events.snapshot())
    finally:
        gate.set()
    wait_for(lambda: events.data() >= set(before) | set(after), 40, "every record")
    (parent_end,) = events.index("shard_ended", parent)
    for child in children:
        assert min(events.index("initialize", child)) > parent_end
        assert min(events.index("record", child)) > max(events.index("record", parent))


# -- 3. processors and factories that raise ----------------------------------------------------

@pytest.mark.emulator
@pytest.mark.timeout(90)
def test_a_raising_factory_does_not_kill_the_scheduler_the_lease_is_released_and_retaken(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, schedulers, caplog):
    stream = make_stream(1)
    expected = put_spread(kinesis_local, stream, "fac", 30)
    (shard,) = set(expected.values())
    config = make_config(stream, worker_id="fac", lease_taker_interval_ms=500)
    events = Events()
    calls: list[str] = []

    def factory(shard_id: str) -> RecordProcessor:
        calls.append(shard_id)
        if len(calls) <= 2:
            raise RuntimeError("factory bug")
        return Recorder(events, shard_id)

    scheduler = schedulers(config, factory)
    with caplog.at_level(logging.INFO, logger="kinesis_dstream"):
        scheduler.start()
        wait_for(lambda: events.data() >= set(expected), 30, "every record after the factory recovers")
    assert len(calls) == 3
    released = [r for r in caplog.records if r.getMessage() == f"released lease {shard}"]
    assert len(released) == 2  # once per failed consumer: given back, then taken again
    assert scheduler._thread is not None and scheduler._thread.is_alive()
    assert owners(dynamodb, config.application_name) == {shard: "fac"}
    assert [events.snapshot()[i][2] for i in events.index("initialize", shard)] == [ESN.TRIM_HORIZON]


class Broken(RecordProcessor):
    """Every callback raises."""

    def __init__(self, events: Events, shard_id: str):
        self.events, self.shard_id = events, shard_id

    def _fail(self, name: str) -> None:
        self.events.add("broken-" + name, self.shard_id)
        raise RuntimeError(f"{name} is broken")

    def initialize(self, i):
        self._fail("initialize")

    def process_records(self, i):
        self._fail("process_records")

    def lease_lost(self, i):
        self._fail("lease_lost")

    def shard_ended(self, i):
        self._fail("shard_ended")

    def shutdown_requested(self, i):
        self._fail("shutdown_requested")


class FailAfterCheckpoint(Recorder):
    """Checkpoints its first batch, then raises on the next one (after seeing it)."""

    def __init__(self, events: Events, shard_id: str, broken: threading.Event):
        super().__init__(events, shard_id)
        self.broken = broken
        self.batches = 0

    def process_records(self, i):
        self.batches += 1
        if self.batches == 1:
            return super().process_records(i)
        for record in i.records:
            self.events.add("lost-record", self.shard_id, record)
        self.broken.set()
        raise RuntimeError("bug on batch 2")


@pytest.mark.emulator
@pytest.mark.timeout(90)
def test_raising_processors_are_replaced_and_the_shard_resumes_from_its_checkpoint(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, schedulers):
    stream = make_stream(1)
    records = put_spread(kinesis_local, stream, "crash", 30)
    (shard,) = set(records.values())
    config = make_config(stream, worker_id="crash", max_records=10, retry_wait_time_ms=100)
    events = Events()
    broken, healed = threading.Event(), threading.Event()
    made: list[str] = []

    def factory(shard_id: str) -> RecordProcessor:
        made.append("first" if not made else "broken" if not healed.is_set() else "healed")
        if made[-1] == "first":
            return FailAfterCheckpoint(events, shard_id, broken)
        return Broken(events, shard_id) if made[-1] == "broken" else Recorder(events, shard_id)

    scheduler = schedulers(config, factory)
    scheduler.start()
    wait_for(lambda: made.count("broken") >= 3, 30, "several broken processors in a row")
    # The scheduler lives on through all that: its loop runs, the lease stays ours, metrics work.
    assert scheduler._thread is not None and scheduler._thread.is_alive()
    assert scheduler.coordinator.owned_shard_ids() == [shard]
    assert scheduler.metrics()[shard].owner == "crash"
    (checkpoint,) = [d for e, s, d in events.snapshot() if e == "checkpoint"]
    assert item_checkpoint(lease_items(dynamodb, config.application_name)[shard]) == checkpoint
    healed.set()
    wait_for(lambda: events.data() >= set(records), 30, "every record once processors heal")

    snapshot = events.snapshot()
    healed_init = [i for i, (e, s, d) in enumerate(snapshot) if e == "initialize"][-1]
    assert snapshot[healed_init][2] == checkpoint  # restarted from the checkpoint...
    again = [d for e, s, d in snapshot[healed_init:] if e == "record"]
    assert again and min(r.extended_sequence_number for r in again) > checkpoint  # ...not before
    lost = {d.binary_data.decode() for e, s, d in snapshot if e == "lost-record"}
    assert lost and lost <= {r.binary_data.decode() for r in again}  # the failed batch came again
    assert "broken-initialize" in {e for e, _, _ in snapshot}


# -- 4. shutdown ------------------------------------------------------------------------------

class BlockInShutdown(Recorder):
    def __init__(self, events: Events, shard_id: str, release: threading.Event):
        super().__init__(events, shard_id)
        self.release = release

    def shutdown_requested(self, i) -> None:
        self.events.add("shutdown_blocking", self.shard_id)
        self.release.wait(60)


@pytest.mark.emulator
@pytest.mark.timeout(90)
def test_shutdown_times_out_on_a_blocked_processor_and_still_releases_every_lease(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, schedulers):
    stream = make_stream(2)
    expected = put_spread(kinesis_local, stream, "stop", 40)
    shard_ids = sorted(set(expected.values()))
    config = make_config(stream, worker_id="stopper")
    events = Events()
    release = threading.Event()
    made: list[str] = []

    def factory(shard_id: str) -> RecordProcessor:
        # The first lease taken (the ramp takes one, then the other half a second later) is
        # the first consumer shutdown waits for: the one that blocks. The other must still
        # be waited for and allowed to checkpoint before the leases go.
        made.append(shard_id)
        if len(made) == 1:
            return BlockInShutdown(events, shard_id, release)
        return Recorder(events, shard_id, checkpoint_each_batch=False)

    scheduler = schedulers(config, factory)
    try:
        scheduler.start()
        wait_for(lambda: events.data() >= set(expected), 30, "every record")
        assert set(owners(dynamodb, config.application_name).values()) == {"stopper"}
        blocked_shard = made[0]
        assert list(scheduler._consumers)[0] == blocked_shard
        started = time.monotonic()
        clean = scheduler.shutdown(timeout_s=1.0)
        elapsed = time.monotonic() - started
        assert clean is False
        # Bounded: the timeout, plus the scheduler loop's own stop (a tick) and the releases.
        assert elapsed < 1.0 + 5, f"shutdown took {elapsed:.1f} s"
        assert events.index("shutdown_blocking", blocked_shard)
        items = lease_items(dynamodb, config.application_name)
        assert {k: v.get("leaseOwner") for k, v in items.items()} == {s: None for s in shard_ids}
        # The processor that finished in time checkpointed everything it had.
        (other,) = [s for s in shard_ids if s != blocked_shard]
        assert events.index("shutdown_requested", other)
        last = max(r.extended_sequence_number for r in events.records(other))
        assert item_checkpoint(items[other]) == last
        assert scheduler.coordinator.owned_shard_ids() == []
    finally:
        release.set()


# -- 5. metrics -------------------------------------------------------------------------------

@pytest.mark.emulator
@pytest.mark.timeout(90)
def test_metrics_show_records_lag_owner_and_last_checkpoint_per_shard(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, schedulers):
    stream = make_stream(2)
    expected = put_spread(kinesis_local, stream, "m", 50)
    shard_ids = sorted(set(expected.values()))
    per_shard = {s: sum(1 for v in expected.values() if v == s) for s in shard_ids}
    config = make_config(stream, worker_id="metered")
    events = Events()
    scheduler = schedulers(config, lambda shard_id: Recorder(events, shard_id))
    scheduler.start()

    def settled() -> bool:
        metrics = scheduler.metrics()
        return (sorted(metrics) == shard_ids
                and all(metrics[s].records == per_shard[s] for s in shard_ids)
                and all(metrics[s].millis_behind_latest == 0 for s in shard_ids))

    wait_for(settled, 30, "metrics to show every record with no lag")
    metrics = scheduler.metrics()
    items = lease_items(dynamodb, config.application_name)
    for shard in shard_ids:
        m = metrics[shard]
        last = max(r.extended_sequence_number for r in events.records(shard))
        assert m.shard_id == shard
        assert m.records == per_shard[shard]
        assert m.millis_behind_latest == 0
        assert m.owner == "metered"
        assert m.state == "processing"
        assert m.last_checkpoint == str(last) == str(item_checkpoint(items[shard]))
        assert m.last_delivered == str(last)


@pytest.mark.unit
def test_a_pass_that_keeps_failing_unexpectedly_backs_off_instead_of_ticking(caplog):
    """A bug in a pass is logged with its traceback, but not at every 0.2 s tick: the waits
    grow as for a service fault (200 ms doubling, equal jitter: the ranges do not overlap)."""
    from kinesis_dstream.config import ConsumerConfig

    class Broken:
        def run_due(self, now: float, any_waiting: Callable[[], bool]) -> None:
            raise RuntimeError("a bug")

    config = ConsumerConfig(application_name="a", stream_name="s", region_name="r",
                            worker_id="w", retry_wait_time_ms=100)
    scheduler = Scheduler(config, lambda shard_id: None, kinesis=object(), lease_table=object())
    scheduler.lease_manager = Broken()
    loop = threading.Thread(target=scheduler._loop, daemon=True)
    with caplog.at_level(logging.ERROR, logger="kinesis_dstream.worker.lease_loop"):
        loop.start()
        try:
            wait_for(lambda: len(caplog.records) >= 3, 30, "three failed passes")
        finally:
            scheduler._stop.set()
            loop.join(5)
    waits = [float(r.getMessage().rsplit(" in ", 1)[1].split()[0]) for r in caplog.records[:3]]
    assert all(r.exc_info for r in caplog.records[:3])
    assert 0.1 <= waits[0] <= 0.2 and 0.2 <= waits[1] <= 0.4 and 0.4 <= waits[2] <= 0.8, waits
