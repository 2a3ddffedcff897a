"""Lease renewals that cannot reach DynamoDB for longer than failover time stop the reads of
those shards, as the KCL's do (tier 1: no Spark, no emulator; the clock is the test's).

Another worker may take a lease nobody renewed for failover time and read it from its
checkpoint; a driver that went on planning reads of it would hand the same records out twice.
"""
from __future__ import annotations

import threading
from dataclasses import replace

from kinesis_dstream.aws.lease_table import Lease
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import EndpointUnreachableError, UnreachableAfterRetriesError
from kinesis_dstream.spark.coordinator import ShardCoordinator
from kinesis_dstream.worker.leases import LeaseCoordinator

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


def test_a_shard_whose_renewal_hangs_past_failover_is_planned_no_more():
    """The renewer is stuck in a call that has not failed yet: the clock alone decides."""
    clock, hang = Clock(), threading.Event()
    table = UnreachableTable(hang=hang)
    coordinator = ShardCoordinator(config(), kinesis=object(), lease_table=table,
                                   range_table=object())
    coordinator.leases._clock = clock
    coordinator.add_member("m")
    for shard_id in SHARDS:
        coordinator._open_period(hold(coordinator.leases, clock, shard_id))
    renewer = threading.Thread(target=coordinator.leases.renew_leases, daemon=True)
    renewer.start()  # hangs in the table
    try:
        assert [p.shard_id for p in coordinator.plan("m", 1000)] == SHARDS
        clock.now += FAILOVER_MS / 1000 / 2
        # One lease was renewed in time (before the outage): it is read on.
        coordinator.leases._last_renewed[SHARDS[1]] = clock()
        coordinator._settle(coordinator._shards[SHARDS[0]], 1000)
        coordinator._settle(coordinator._shards[SHARDS[1]], 1000)
        clock.now += FAILOVER_MS / 1000 / 2
        assert [p.shard_id for p in coordinator.plan("m", 2000)] == [SHARDS[1]]
        assert coordinator.metrics()[SHARDS[0]]["state"] == "lost"
        assert coordinator.metrics()[SHARDS[0]]["owner"] is None
        assert coordinator.checkpointer.track(SHARDS[0]) is None  # no checkpoint of it here
    finally:
        hang.set()
        renewer.join(timeout=10)
        coordinator.leases.stop()
    assert table.renewals == 2


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
