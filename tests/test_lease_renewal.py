"""Lease renewals that cannot reach DynamoDB for longer than failover time stop the reads of
those shards, as the KCL's do (tier 1: no Spark, no emulator; the clock is the test's).

Another worker may take a lease nobody renewed for failover time and read it from its
checkpoint; a driver that went on planning reads of it would hand the same records out twice.
"""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from kinesis_dstream.aws.lease_table import Lease
from kinesis_dstream.aws.range_table import BatchRange
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import EndpointUnreachableError, UnreachableAfterRetriesError
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.retrieval import ReadReport
from kinesis_dstream.spark.coordinator import ShardCoordinator
from kinesis_dstream.worker.leases import LeaseCoordinator

pytestmark = pytest.mark.unit

FAILOVER_MS = 10_000
SHARDS = [f"shardId-{i:012d}" for i in range(2)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class UnreachableTable:
    """A lease table behind a DynamoDB outage: every renewal fails as the retry policy's
    give-up does, or hangs (``hang``) as a black-holed connection does."""

    def __init__(self, hang: threading.Event | None = None) -> None:
        self.hang = hang
        self.renewals = 0

    def renew_lease(self, lease: Lease) -> Lease:
        self.renewals += 1
        if self.hang is not None:
            self.hang.wait(10)
        raise UnreachableAfterRetriesError("renewing: endpoint unreachable",
                                           EndpointUnreachableError("unreachable"))


def config() -> ConsumerConfig:
    return ConsumerConfig(application_name="app", stream_name="s", region_name="us-east-1",
                          aws_access_key_id="AKIDEXAMPLE", aws_secret_key="secret",
                          worker_id="me", failover_time_ms=FAILOVER_MS)


def hold(leases: LeaseCoordinator, clock: Clock, shard_id: str) -> Lease:
    lease = Lease(shard_id, lease_owner="me", lease_counter=1)
    leases._owned[shard_id] = lease
    leases._last_renewed[shard_id] = clock()
    return lease


def test_renewals_failing_for_failover_time_let_the_leases_go_and_say_so():
    clock, lost = Clock(), []
    leases = LeaseCoordinator(config(), UnreachableTable(), on_lease_lost=lost.append,
                              clock=clock)
    for shard_id in SHARDS:
        hold(leases, clock, shard_id)
    clock.now += FAILOVER_MS / 1000 - 1
    leases.renew_leases()  # failing, but within failover time: still ours
    assert leases.owned_shard_ids() == SHARDS and not lost
    clock.now += 1
    leases.renew_leases()
    assert leases.owned_shard_ids() == [] and sorted(lost) == SHARDS
    leases.stop()


class Table(UnreachableTable):
    """The lease table as a dict: scans and conditional takes work, renewals do not."""

    def __init__(self, hang: threading.Event | None = None) -> None:
        super().__init__(hang)
        self.leases = {s: Lease(s, lease_owner="me", lease_counter=1) for s in SHARDS}

    def list_leases(self) -> list[Lease]:
        return list(self.leases.values())

    def take_lease(self, lease: Lease, owner: str) -> Lease:
        assert self.leases[lease.lease_key].lease_counter == lease.lease_counter
        new = replace(lease, lease_owner=owner, lease_counter=lease.lease_counter + 1)
        self.leases[lease.lease_key] = new
        return new


def driver(table: Table, clock: Clock) -> ShardCoordinator:
    """A coordinator holding both leases, each read once (batch 1000, through "5")."""
    coordinator = ShardCoordinator(config(), kinesis=object(), lease_table=table,
                                   range_table=object())
    coordinator.leases._clock = clock
    coordinator.add_member("m")
    for shard_id in SHARDS:
        coordinator.periods.open(hold(coordinator.leases, clock, shard_id))
    assert [p.shard_id for p in coordinator.plan("m", 1000).shards] == SHARDS
    coordinator.batch_read("m", 1000, {s: ReadReport(BatchRange(
        "m", s, 1000, ESN("TRIM_HORIZON"), end=ESN("5"), records=5)) for s in SHARDS})
    return coordinator


def test_a_shard_whose_renewal_hangs_past_failover_is_planned_no_more():
    """The renewer is stuck in a call that has not failed yet: the clock alone decides."""
    clock, hang = Clock(), threading.Event()
    table = Table(hang=hang)
    coordinator = driver(table, clock)
    renewer = threading.Thread(target=coordinator.leases.renew_leases, daemon=True)
    renewer.start()  # hangs in the table
    try:
        clock.now += FAILOVER_MS / 1000 / 2
        # One lease was renewed in time (before the outage): it is read on.
        coordinator.leases._last_renewed[SHARDS[1]] = clock()
        clock.now += FAILOVER_MS / 1000 / 2
        assert [p.shard_id for p in coordinator.plan("m", 2000).shards] == [SHARDS[1]]
        assert coordinator.metrics()[SHARDS[0]]["state"] == "lapsed"
        assert coordinator.metrics()[SHARDS[0]]["owner"] is None
    finally:
        hang.set()
        renewer.join(timeout=10)
        coordinator.leases.stop()
    assert table.renewals >= 1  # the renewer was under way all along


def test_a_lapsed_lease_taken_by_another_worker_ends_the_period():
    clock = Clock()
    table = Table()
    coordinator = driver(table, clock)
    clock.now += FAILOVER_MS / 1000
    assert coordinator.plan("m", 2000).shards == []
    table.leases[SHARDS[0]] = Lease(SHARDS[0], lease_owner="other", lease_counter=2)
    coordinator.leases.refresh()
    coordinator.periods.reconcile()
    assert coordinator.metrics()[SHARDS[0]]["state"] == "lost"
    assert coordinator.periods.shards[SHARDS[0]].track is None  # no checkpoint of it here
    assert coordinator.metrics()[SHARDS[1]]["state"] == "lapsed"


def test_a_lapsed_lease_taken_back_untouched_reads_on_where_it_stood():
    """Nobody read it meanwhile: its next batch starts after batch 1000's records, not from
    the checkpoint (which would hand them out twice), and batch 1000 still checkpoints."""
    clock = Clock()
    table = Table()
    coordinator = driver(table, clock)
    clock.now += FAILOVER_MS / 1000
    assert coordinator.plan("m", 2000).shards == []
    coordinator.leases.take_leases()  # the counter stood still for failover on our clock:
    clock.now += FAILOVER_MS / 1000 + 1
    assert sorted(coordinator.leases.take_leases()) == SHARDS  # expired, taken back
    coordinator.periods.reconcile()
    planned = coordinator.plan("m", 3000).shards
    assert [(p.shard_id, p.start, p.since_ms) for p in planned] == \
        [(s, ESN("5"), 1000) for s in SHARDS]
    reports = {s: ReadReport(BatchRange("m", s, 1000, ESN("TRIM_HORIZON"),
                                                     end=ESN("5"), records=5)) for s in SHARDS}
    coordinator.batch_completed("m", 1000, True, reports)
    assert all(coordinator.periods.shards[s].track.completed == ESN("5") for s in SHARDS)
    assert coordinator.metrics()[SHARDS[0]]["state"] == "processing"


def test_a_lease_renewed_again_in_time_is_kept():
    clock = Clock()
    leases = LeaseCoordinator(config(), UnreachableTable(), clock=clock)
    hold(leases, clock, SHARDS[0])
    clock.now += FAILOVER_MS / 1000 - 0.5
    leases._last_renewed[SHARDS[0]] = clock()  # a renewal that got through
    leases._owned[SHARDS[0]] = replace(leases._owned[SHARDS[0]], lease_counter=2)
    clock.now += FAILOVER_MS / 1000 - 0.5
    assert leases.drop_lapsed() == []
    assert leases.owned_shard_ids() == [SHARDS[0]]


def test_a_failing_lease_loop_never_waits_longer_than_a_renewal_interval() -> None:
    """Both lease loops (the Scheduler's and the driver's coordinator's) back off while a
    service fails, capped at the renewal interval: once an outage ends, the leases are renewed
    and due checkpoints written within one interval, before any lease lapses."""
    from kinesis_dstream.worker.lease_loop import lease_loop_backoff

    config = ConsumerConfig(application_name="app", stream_name="s", region_name="us-east-1",
                            failover_time_ms=10_000, retry_wait_time_ms=100)
    backoff = lease_loop_backoff(config)
    waits = [backoff.next_wait_s() for _ in range(30)]
    assert waits[0] < 1.0
    assert max(waits) <= config.renew_interval_ms / 1000.0 < config.failover_time_ms / 1000.0
