"""LeaseTable and LeaseCoordinator on moto's in-process DynamoDB (tier 1: no emulator process).

The raw items are checked against the KCL 2.x lease format (/work/shared/notes/kcl-compat.md),
so a Java KCL worker could share the table.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any, Iterator

import boto3
import pytest
from moto import mock_aws

from kinesis_dstream.aws.lease_table import Lease, LeaseTable
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import LeaseLostError
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.worker.leases import LeaseCoordinator

pytestmark = pytest.mark.unit

REGION = "us-east-1"
SEQ = "49590338271490256608559692538361571095921575989136588898"


@pytest.fixture(scope="module")
def aws() -> Iterator[Any]:
    """One in-process moto for the module (cheap); each test still gets its own table."""
    patch = pytest.MonkeyPatch()
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_KINESIS"):
        patch.delenv(name, raising=False)
    patch.setenv("AWS_ACCESS_KEY_ID", "testing")
    patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    patch.setenv("AWS_DEFAULT_REGION", REGION)
    patch.setenv("AWS_REGION", REGION)
    patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    try:
        with mock_aws():
            yield boto3.client("dynamodb", region_name=REGION)
    finally:
        patch.undo()


def config_for(app: str, worker: str = "A", **kw: Any) -> ConsumerConfig:
    settings: dict[str, Any] = dict(application_name=app, stream_name="s", region_name=REGION,
                                    worker_id=worker, retry_wait_time_ms=1, failover_time_ms=10_000)
    settings.update(kw)
    return ConsumerConfig(**settings)


@pytest.fixture
def app() -> str:
    return f"app-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def table(aws: Any, app: str) -> Iterator[LeaseTable]:
    t = LeaseTable(config_for(app), client=aws)
    assert t.create_table_if_not_exists(timeout_s=10) is True
    yield t
    t.delete_table()


def test_lease_table_builds_its_own_client_from_the_config(aws, app):
    t = LeaseTable(config_for(app))
    assert t.client is not aws
    assert t.create_table_if_not_exists(timeout_s=10) is True
    assert aws.describe_table(TableName=app)["Table"]["TableStatus"] == "ACTIVE"
    t.delete_table()


def raw(ddb: Any, app: str, key: str) -> dict[str, Any]:
    return ddb.get_item(TableName=app, Key={"leaseKey": {"S": key}}, ConsistentRead=True)["Item"]


def types(item: dict[str, Any]) -> dict[str, str]:
    return {name: next(iter(value)) for name, value in item.items()}


# -- the table ----------------------------------------------------------------------------------
class CreatingFor:
    """moto's client, except that a table is CREATING for its first ``n`` DescribeTable answers
    (moto makes tables ACTIVE at once; DynamoDB takes seconds)."""

    def __init__(self, client: Any, n: int):
        self._client = client
        self.left = n
        self.described = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def describe_table(self, **kwargs: Any) -> Any:
        answer = self._client.describe_table(**kwargs)
        self.described += 1
        if self.left > 0:
            self.left -= 1
            answer["Table"]["TableStatus"] = "CREATING"
        return answer


def test_a_new_table_is_polled_until_active(aws, app):
    """Through retry.poll_until: waits from 0.1 s up, so a few CREATING answers cost ~1 s."""
    client = CreatingFor(aws, 4)
    assert LeaseTable(config_for(app), client=client).create_table_if_not_exists(timeout_s=30)
    assert client.left == 0 and client.described == 5
    aws.delete_table(TableName=app)


def test_a_table_never_active_times_out_naming_it(aws, app):
    client = CreatingFor(aws, 10**6)
    with pytest.raises(TimeoutError, match=f"^lease table {app} not ACTIVE after 0.5 s$"):
        LeaseTable(config_for(app), client=client).create_table_if_not_exists(timeout_s=0.5)
    assert client.described >= 3
    aws.delete_table(TableName=app)


def test_the_batch_range_table_is_polled_until_active_too(aws, app):
    from kinesis_dstream.aws.range_table import BatchRangeTable, range_table_name

    client = CreatingFor(aws, 3)
    BatchRangeTable(config_for(app), client=client).create_table_if_not_exists(timeout_s=30)
    assert client.left == 0 and client.described == 4
    with pytest.raises(TimeoutError, match=f"table {range_table_name(app)} not ACTIVE after 0.3 s"):
        BatchRangeTable(config_for(app), client=CreatingFor(aws, 10**6)
                        ).create_table_if_not_exists(timeout_s=0.3)
    aws.delete_table(TableName=range_table_name(app))


def test_table_has_the_kcl_shape(aws, table, app):
    described = aws.describe_table(TableName=app)["Table"]
    assert described["KeySchema"] == [{"AttributeName": "leaseKey", "KeyType": "HASH"}]
    assert described["AttributeDefinitions"] == [{"AttributeName": "leaseKey", "AttributeType": "S"}]
    assert described["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert not described.get("GlobalSecondaryIndexes") and not described.get("LocalSecondaryIndexes")
    assert described["TableStatus"] == "ACTIVE"


def test_create_table_twice_is_fine(aws, table, app):
    assert LeaseTable(config_for(app, "B"), client=aws).create_table_if_not_exists(timeout_s=10) is False


def test_create_lease_if_not_exists_twice(aws, table, app):
    lease = Lease("shardId-000000000000", checkpoint=ESN.TRIM_HORIZON,
                  starting_hash_key="0", ending_hash_key="170141183460469231731687303715884105727")
    assert table.create_lease_if_not_exists(lease) is True
    assert table.create_lease_if_not_exists(Lease("shardId-000000000000", checkpoint=ESN.LATEST)) is False
    got = table.get_lease("shardId-000000000000")
    assert got is not None and got.checkpoint == ESN.TRIM_HORIZON
    assert got.lease_owner is None and got.lease_counter == 0
    assert table.get_lease("shardId-nope") is None


def test_created_items_match_the_kcl_format(aws, table, app):
    table.create_lease_if_not_exists(Lease("p", checkpoint=ESN.TRIM_HORIZON,
                                           starting_hash_key="0", ending_hash_key="99"))
    table.create_lease_if_not_exists(Lease("c", checkpoint=ESN.TRIM_HORIZON,
                                           parent_shard_ids=frozenset({"p", "q"})))
    parent = raw(aws, app, "p")
    assert types(parent) == {
        "leaseKey": "S", "leaseCounter": "N", "checkpoint": "S",
        "checkpointSubSequenceNumber": "N", "ownerSwitchesSinceCheckpoint": "N",
        "startingHashKey": "S", "endingHashKey": "S",
    }
    assert parent["checkpoint"] == {"S": "TRIM_HORIZON"}
    assert parent["leaseCounter"] == {"N": "0"}
    assert "leaseOwner" not in parent  # absent until taken
    child = raw(aws, app, "c")
    assert types(child)["parentShardId"] == "SS"
    assert sorted(child["parentShardId"]["SS"]) == ["p", "q"]


def test_take_renew_checkpoint_evict_bump_the_counter(aws, table, app):
    table.create_lease_if_not_exists(Lease("s"))
    lease = table.get_lease("s")
    taken = table.take_lease(lease, "A")
    assert (taken.lease_owner, taken.lease_counter) == ("A", 1)
    renewed = table.renew_lease(taken)
    assert renewed.lease_counter == 2
    checkpointed = table.update_checkpoint(renewed, ESN(SEQ, 3))
    assert checkpointed.lease_counter == 3
    released = table.evict_lease(checkpointed)
    assert released.lease_counter == 4 and released.lease_owner is None
    stored = table.get_lease("s")
    assert stored == released
    item = raw(aws, app, "s")
    assert item["leaseCounter"] == {"N": "4"}
    assert "leaseOwner" not in item  # evict removes the owner
    assert item["checkpoint"] == {"S": SEQ}  # ... and keeps the checkpoint


def test_take_first_time_is_not_an_owner_switch(aws, table, app):
    table.create_lease_if_not_exists(Lease("s"))
    taken = table.take_lease(table.get_lease("s"), "A")
    assert taken.owner_switches_since_checkpoint == 0
    assert raw(aws, app, "s")["leaseOwner"] == {"S": "A"}


def test_checkpoint_writes_kcl_attributes_and_removes_pending(aws, table, app):
    table.create_lease_if_not_exists(Lease("s"))
    lease = table.take_lease(table.get_lease("s"), "A")
    # Another worker (B) steals it: one owner switch, which B's checkpoint resets.
    stolen = table.take_lease(lease, "B")
    assert stolen.owner_switches_since_checkpoint == 1
    assert raw(aws, app, "s")["ownerSwitchesSinceCheckpoint"] == {"N": "1"}
    # A Java KCL worker may have left a two-phase checkpoint behind.
    aws.update_item(TableName=app, Key={"leaseKey": {"S": "s"}},
                    UpdateExpression="SET pendingCheckpoint = :p, pendingCheckpointSubSequenceNumber = :n,"
                                     " pendingCheckpointState = :b",
                    ExpressionAttributeValues={":p": {"S": SEQ}, ":n": {"N": "0"},
                                               ":b": {"B": b"\x01"}})
    assert table.get_lease("s").pending_checkpoint == SEQ
    done = table.update_checkpoint(stolen, ESN(SEQ, 7))
    item = raw(aws, app, "s")
    assert item["checkpoint"] == {"S": SEQ}
    assert item["checkpointSubSequenceNumber"] == {"N": "7"}
    assert item["ownerSwitchesSinceCheckpoint"] == {"N": "0"}
    assert item["leaseOwner"] == {"S": "B"}
    assert item["leaseCounter"] == {"N": str(done.lease_counter)} and done.lease_counter == 3
    for name in ("pendingCheckpoint", "pendingCheckpointSubSequenceNumber", "pendingCheckpointState"):
        assert name not in item
    assert table.get_lease("s").checkpoint == ESN(SEQ, 7)


def test_steals_count_owner_switches(aws, table, app):
    table.create_lease_if_not_exists(Lease("s"))
    lease = table.take_lease(table.get_lease("s"), "A")
    lease = table.take_lease(lease, "B")
    lease = table.take_lease(lease, "A")
    assert lease.owner_switches_since_checkpoint == 2
    assert table.get_lease("s").owner_switches_since_checkpoint == 2


def test_shard_end_checkpoint_and_children(aws, table, app):
    table.create_lease_if_not_exists(Lease("p"))
    lease = table.take_lease(table.get_lease("p"), "A")
    lease = table.update_checkpoint(lease, ESN.SHARD_END)
    lease = table.set_child_shard_ids(lease, ["c2", "c1"])
    item = raw(aws, app, "p")
    assert item["checkpoint"] == {"S": "SHARD_END"}
    assert types(item)["childShardIds"] == "SS"
    assert sorted(item["childShardIds"]["SS"]) == ["c1", "c2"]
    stored = table.get_lease("p")
    assert stored.is_finished and stored.child_shard_ids == {"c1", "c2"}


@pytest.mark.parametrize("operation", ["take", "renew", "checkpoint", "evict", "children"])
def test_a_stale_counter_is_lease_lost(aws, table, app, operation):
    table.create_lease_if_not_exists(Lease("s"))
    mine = table.take_lease(table.get_lease("s"), "A")
    table.take_lease(mine, "B")  # B steals: counter moved past what A holds
    before = raw(aws, app, "s")
    with pytest.raises(LeaseLostError):
        {
            "take": lambda: table.take_lease(mine, "A"),
            "renew": lambda: table.renew_lease(mine),
            "checkpoint": lambda: table.update_checkpoint(mine, ESN(SEQ)),
            "evict": lambda: table.evict_lease(mine),
            "children": lambda: table.set_child_shard_ids(mine, ["c"]),
        }[operation]()
    assert raw(aws, app, "s") == before  # nothing written


def test_renew_checks_the_owner_too(aws, table, app):
    table.create_lease_if_not_exists(Lease("s"))
    taken = table.take_lease(table.get_lease("s"), "B")
    # Same counter, but we believe we are A: the guard must refuse.
    from dataclasses import replace
    with pytest.raises(LeaseLostError):
        table.renew_lease(replace(taken, lease_owner="A"))


def test_list_leases_reads_every_item(aws, table, app):
    for i in range(25):
        table.create_lease_if_not_exists(Lease(f"shard-{i:02d}"))
    leases = table.list_leases()
    assert sorted(lease.lease_key for lease in leases) == [f"shard-{i:02d}" for i in range(25)]


def test_items_written_by_the_java_kcl_are_read(aws, table, app):
    aws.put_item(TableName=app, Item={
        "leaseKey": {"S": "shardId-000000000001"}, "leaseOwner": {"S": "java-worker"},
        "leaseCounter": {"N": "42"}, "checkpoint": {"S": SEQ},
        "checkpointSubSequenceNumber": {"N": "5"}, "ownerSwitchesSinceCheckpoint": {"N": "2"},
        "parentShardId": {"SS": ["shardId-000000000000"]},
        "startingHashKey": {"S": "0"}, "endingHashKey": {"S": "9"},
        "throughputKBps": {"N": "1.5"},  # a KCL 3.x attribute we don't use
    })
    lease = table.get_lease("shardId-000000000001")
    assert lease == Lease("shardId-000000000001", lease_owner="java-worker", lease_counter=42,
                          checkpoint=ESN(SEQ, 5), owner_switches_since_checkpoint=2,
                          parent_shard_ids=frozenset({"shardId-000000000000"}),
                          starting_hash_key="0", ending_hash_key="9")
    taken = table.take_lease(lease, "A")
    assert taken.lease_counter == 43 and taken.owner_switches_since_checkpoint == 3
    assert raw(aws, app, "shardId-000000000001")["throughputKBps"] == {"N": "1.5"}


# -- LeaseCoordinator on the real table format ------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def owners(table: LeaseTable) -> dict[str, str | None]:
    return {lease.lease_key: lease.lease_owner for lease in table.list_leases()}


@pytest.fixture
def four_leases(table: LeaseTable) -> LeaseTable:
    for i in range(4):
        table.create_lease_if_not_exists(Lease(f"shard-{i}"))
    return table


def coordinator(table: LeaseTable, worker: str, clock: Clock, lost: list[str] | None = None
                ) -> LeaseCoordinator:
    config = config_for(table.table_name, worker)
    return LeaseCoordinator(config, LeaseTable(config, client=table.client), clock=clock,
                            on_lease_lost=(lost.append if lost is not None else lambda s: None))


def test_two_coordinators_converge_two_and_two(aws, app, four_leases):
    clock = Clock()
    lost_by_a: list[str] = []
    a = coordinator(four_leases, "A", clock, lost_by_a)
    b = coordinator(four_leases, "B", clock)
    assert sorted(a.take_leases()) == ["shard-0", "shard-1", "shard-2", "shard-3"]
    assert set(owners(four_leases).values()) == {"A"}

    stolen: list[str] = []
    for _ in range(2):
        clock.now += 1.0
        a.renew_leases()
        got = b.take_leases()
        assert len(got) == 1  # one steal per pass
        stolen += got
    assert sorted(b.owned_shard_ids()) == sorted(stolen)
    counts = list(owners(four_leases).values())
    assert counts.count("A") == 2 and counts.count("B") == 2

    # A learns of the steals when it renews: on_lease_lost for exactly those.
    clock.now += 1.0
    a.renew_leases()
    assert sorted(lost_by_a) == sorted(stolen)
    assert sorted(a.owned_shard_ids()) == sorted(set(owners(four_leases)) - set(stolen))

    # Balanced: further passes change nothing, on either side.
    for _ in range(3):
        clock.now += 1.0
        a.renew_leases()
        b.renew_leases()
        assert a.take_leases() == [] and b.take_leases() == []
    for shard_id in stolen:
        assert four_leases.get_lease(shard_id).owner_switches_since_checkpoint == 1


def test_dead_worker_leases_taken_after_failover_on_our_clock(aws, app, four_leases):
    clock = Clock()
    a = coordinator(four_leases, "A", clock)
    b = coordinator(four_leases, "B", clock)
    a.take_leases()
    # A dies (never renews again). Before A's leases expire, B only steals to its share ...
    clock.now += 1.0
    assert len(b.take_leases()) == 1
    clock.now += 1.0
    b.renew_leases()
    assert len(b.take_leases()) == 1
    clock.now += 1.0
    b.renew_leases()
    assert b.take_leases() == []          # 2/2 and A not expired yet on B's clock
    clock.now += 10.5                     # A's counters stood still for > failover
    b.renew_leases()
    assert len(b.take_leases()) == 2
    assert set(owners(four_leases).values()) == {"B"}


def test_release_frees_the_lease_for_another_worker_at_once(aws, app, four_leases):
    clock = Clock()
    a = coordinator(four_leases, "A", clock)
    b = coordinator(four_leases, "B", clock)
    a.take_leases()
    b.refresh()
    a.release("shard-2")
    assert a.owned_shard_ids() == ["shard-0", "shard-1", "shard-3"]
    assert owners(four_leases)["shard-2"] is None
    # No failover wait: B takes the free lease in its next pass, same instant.
    assert b.take_leases() == ["shard-2"]
    a.release("shard-2")  # not ours any more: a no-op
    assert owners(four_leases)["shard-2"] == "B"


def test_checkpoint_through_the_coordinator(aws, app, four_leases):
    clock = Clock()
    a = coordinator(four_leases, "A", clock)
    a.take_leases()
    lease = a.checkpoint("shard-1", ESN(SEQ, 2))
    assert lease.checkpoint == ESN(SEQ, 2)
    assert four_leases.get_lease("shard-1").checkpoint == ESN(SEQ, 2)
    # The counter the coordinator holds is still the table's: renew works afterwards.
    a.renew_leases()
    assert a.owned_shard_ids() == ["shard-0", "shard-1", "shard-2", "shard-3"]


def test_checkpoint_on_a_lost_lease_raises_and_reports_the_loss(aws, app, four_leases):
    clock = Clock()
    lost: list[str] = []
    a = coordinator(four_leases, "A", clock, lost)
    b = coordinator(four_leases, "B", clock)
    a.take_leases()
    clock.now += 1.0
    (stolen,) = b.take_leases()
    with pytest.raises(LeaseLostError):
        a.checkpoint(stolen, ESN(SEQ))
    assert lost == [stolen]
    assert stolen not in a.owned_shard_ids()
    with pytest.raises(LeaseLostError):  # and it stays refused
        a.checkpoint(stolen, ESN(SEQ))
    assert four_leases.get_lease(stolen).checkpoint == ESN.TRIM_HORIZON
    assert lost == [stolen]  # reported once


def test_known_leases_show_ours_as_we_hold_them(aws, app, four_leases):
    clock = Clock()
    a = coordinator(four_leases, "A", clock)
    a.take_leases()
    a.checkpoint("shard-0", ESN(SEQ))
    known = a.known_leases()
    assert set(known) == {"shard-0", "shard-1", "shard-2", "shard-3"}
    assert known["shard-0"].checkpoint == ESN(SEQ)


def test_renew_failing_past_failover_drops_the_lease_then_it_is_taken_again(aws, app, four_leases):
    """A DynamoDB outage longer than failover: stop processing, then recover the leases.

    With a single worker nobody else will take them: the worker must take its own expired
    leases back once the table answers again, or those shards stay unread until a restart.
    """
    from kinesis_dstream.errors import TransientServiceError

    clock = Clock()
    lost: list[str] = []
    a = coordinator(four_leases, "A", clock, lost)
    assert len(a.take_leases()) == 4
    real_renew = a.table.renew_lease

    def broken(lease: Lease) -> Lease:
        raise TransientServiceError("DynamoDB is down")

    a.table.renew_lease = broken  # type: ignore[method-assign]
    clock.now += 5.0
    a.renew_leases()
    assert lost == [] and len(a.owned_shard_ids()) == 4   # within failover: keep going
    clock.now += 5.5
    a.renew_leases()
    assert sorted(lost) == ["shard-0", "shard-1", "shard-2", "shard-3"]
    assert a.owned_shard_ids() == []
    a.table.renew_lease = real_renew  # type: ignore[method-assign]
    # The table still names A as owner, with counters that no longer move.
    assert set(owners(four_leases).values()) == {"A"}
    a.take_leases()                      # the taker sees the frozen counters from now on
    clock.now += 10.5
    assert sorted(a.take_leases()) == ["shard-0", "shard-1", "shard-2", "shard-3"]
    for shard_id in a.owned_shard_ids():
        assert four_leases.get_lease(shard_id).owner_switches_since_checkpoint == 0


def test_held_leases_are_not_taken_again_even_if_they_look_expired(aws, app, four_leases):
    clock = Clock()
    a = coordinator(four_leases, "A", clock)
    a.take_leases()
    counters = {lease.lease_key: lease.lease_counter for lease in four_leases.list_leases()}
    clock.now += 30.0  # renewer stalled, but we still hold them
    assert a.take_leases() == []
    assert {lease.lease_key: lease.lease_counter for lease in four_leases.list_leases()} == counters
    a.renew_leases()
    assert len(a.owned_shard_ids()) == 4


def test_workers_starting_together_split_without_stealing_when_taking_is_ramped(aws, app, four_leases):
    clock = Clock()
    a = coordinator(four_leases, "A", clock)
    b = coordinator(four_leases, "B", clock)
    assert len(a.take_leases(limit=1)) == 1 and a.wanted_more
    assert len(b.take_leases(limit=1)) == 1 and b.wanted_more
    clock.now += 0.5
    assert len(a.take_leases(limit=2)) == 1 and not a.wanted_more  # target is 2 each now
    assert len(b.take_leases(limit=2)) == 1 and not b.wanted_more
    counts = list(owners(four_leases).values())
    assert counts.count("A") == 2 and counts.count("B") == 2
    switches = [lease.owner_switches_since_checkpoint for lease in four_leases.list_leases()]
    assert switches == [0, 0, 0, 0], "no lease changed hands"


def test_unlimited_taking_grabs_every_free_lease_at_once(aws, app, four_leases):
    a = coordinator(four_leases, "A", Clock())
    assert len(a.take_leases()) == 4 and not a.wanted_more


# -- KCL 3.x items and attributes ---------------------------------------------------------------
# KCL 3.5's single-table format puts coordinator state and worker metrics into the lease table,
# marked by entityType; the last item is anything else without a leaseCounter.
NOT_LEASES = [
    {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "COORDINATOR_STATE"},
     "cv": {"S": "CLIENT_VERSION_3X"}, "mb": {"S": "java-1"}},
    {"leaseKey": {"S": "WorkerMetricStats#java-1"}, "entityType": {"S": "WORKER_METRICS"},
     "wid": {"S": "java-1"}, "leaseCounter": {"N": "3"}},  # entityType alone marks it
    {"leaseKey": {"S": "LeaderLock"}, "ownerName": {"S": "java-1"}},
]


def test_kcl35_coordinator_and_worker_metrics_items_are_not_leases(aws, four_leases, app):
    for item in NOT_LEASES:
        aws.put_item(TableName=app, Item=item)
    assert sorted(lease.lease_key for lease in four_leases.list_leases()) == \
        [f"shard-{i}" for i in range(4)]
    for item in NOT_LEASES:
        assert four_leases.get_lease(item["leaseKey"]["S"]) is None


def test_workers_on_a_kcl35_table_split_its_leases_and_never_touch_its_other_items(
        aws, app, four_leases, caplog):
    for item in NOT_LEASES:
        aws.put_item(TableName=app, Item=item)
    clock = Clock()
    a = coordinator(four_leases, "A", clock)
    b = coordinator(four_leases, "B", clock)
    with caplog.at_level(logging.DEBUG, logger="kinesis_dstream"):
        assert len(a.take_leases()) == 4
        for _ in range(3):  # counted as leases, 3 unowned items would skew the target
            clock.now += 1.0
            a.renew_leases()
            b.take_leases()
        clock.now += 1.0
        a.renew_leases()
    counts = list(owners(four_leases).values())
    assert counts.count("A") == 2 and counts.count("B") == 2
    assert len(a.known_leases()) == len(b.known_leases()) == 4
    for item in NOT_LEASES:  # never taken, never written
        assert raw(aws, app, item["leaseKey"]["S"]) == item
        assert item["leaseKey"]["S"] not in caplog.text


def test_take_and_evict_remove_checkpoint_owner_as_kcl3_does(aws, table, app):
    """KCL 3 treats checkpointOwner, while set, as the owner finishing a graceful handoff."""
    table.create_lease_if_not_exists(Lease("shard-0"))

    def hand_off(owner: str, to: str) -> Lease:  # what a KCL 3 leader writes
        lease = table.get_lease("shard-0")
        aws.update_item(TableName=app, Key={"leaseKey": {"S": "shard-0"}},
                        UpdateExpression="SET leaseOwner = :to, checkpointOwner = :from, "
                                         "leaseCounter = :n",
                        ExpressionAttributeValues={":to": {"S": to}, ":from": {"S": owner},
                                                   ":n": {"N": str(lease.lease_counter + 1)}})
        return table.get_lease("shard-0")

    taken = table.take_lease(hand_off("java-1", "java-2"), "A")  # a steal
    item = raw(aws, app, "shard-0")
    assert "checkpointOwner" not in item and item["leaseOwner"] == {"S": "A"}
    assert taken.lease_counter == int(item["leaseCounter"]["N"])
    lease = hand_off("A", "A")  # our own name both ways, so evict's owner guard holds
    assert "checkpointOwner" in raw(aws, app, "shard-0")
    table.evict_lease(lease)
    item = raw(aws, app, "shard-0")
    assert "checkpointOwner" not in item and "leaseOwner" not in item


def test_an_operators_reset_takes_the_lease_from_its_holder_and_keeps_the_new_checkpoint(
        aws, table, app):
    """``leases reset``: one write guarded on the counter moves the checkpoint, drops the
    owner (and a pending checkpoint); the holder's next renew and checkpoint are lease lost."""
    table.create_lease_if_not_exists(Lease("s"))
    held = table.update_checkpoint(table.take_lease(table.get_lease("s"), "A"), ESN(SEQ, 2))
    aws.update_item(TableName=app, Key={"leaseKey": {"S": "s"}},
                    UpdateExpression="SET pendingCheckpoint = :p",
                    ExpressionAttributeValues={":p": {"S": SEQ}})
    reset = table.reset_checkpoint(table.get_lease("s"), ESN("TRIM_HORIZON"))
    assert (reset.lease_owner, reset.lease_counter) == (None, held.lease_counter + 1)
    item = raw(aws, app, "s")
    assert item["checkpoint"] == {"S": "TRIM_HORIZON"}
    assert item["checkpointSubSequenceNumber"] == {"N": "0"}
    assert "leaseOwner" not in item and "pendingCheckpoint" not in item
    for write in (table.renew_lease, lambda lease: table.update_checkpoint(lease, ESN(SEQ, 2))):
        with pytest.raises(LeaseLostError):
            write(held)
    with pytest.raises(LeaseLostError):  # a reset planned on a stale read writes nothing
        table.reset_checkpoint(held, ESN("LATEST"))
    assert raw(aws, app, "s") == item
