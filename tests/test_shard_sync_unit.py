"""Shard sync decisions: which leases to create, parents before children (tier 1, no I/O)."""
from __future__ import annotations

import pytest

from kinesis_dstream.aws.kinesis import Shard
from kinesis_dstream.aws.lease_table import Lease
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.worker.leases import parents_done
from kinesis_dstream.worker.shard_sync import initial_checkpoint, new_leases

pytestmark = pytest.mark.unit


def config(position: str = "TRIM_HORIZON", **kw) -> ConsumerConfig:
    return ConsumerConfig(application_name="a", stream_name="s", region_name="r",
                          initial_position=position, worker_id="w", **kw)


def shard(shard_id: str, *parents: str, closed: bool = False) -> Shard:
    return Shard(shard_id, parents[0] if parents else None, parents[1] if len(parents) > 1 else None,
                 "0", "100", "1", "9" if closed else None)


def by_key(leases: list[Lease]) -> dict[str, Lease]:
    return {lease.lease_key: lease for lease in leases}


# A split of shard-0 into 1 and 2, then a merge of 1 and 2 into 3.
SPLIT_AND_MERGE = [
    shard("shard-0", closed=True),
    shard("shard-1", "shard-0", closed=True),
    shard("shard-2", "shard-0", closed=True),
    shard("shard-3", "shard-1", "shard-2"),
    shard("shard-9"),  # an unrelated open shard
]


def test_shard_from_a_list_shards_answer():
    info = Shard.from_api({
        "ShardId": "shardId-000000000003",
        "ParentShardId": "shardId-000000000001",
        "AdjacentParentShardId": "shardId-000000000002",
        "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "340282366920938463463374607431768211455"},
        "SequenceNumberRange": {"StartingSequenceNumber": "4959"},
    })
    assert info.shard_id == "shardId-000000000003"
    assert info.parent_shard_ids == ["shardId-000000000001", "shardId-000000000002"]
    assert info.ending_hash_key == "340282366920938463463374607431768211455"
    assert not info.is_closed
    closed = Shard.from_api({"ShardId": "s0", "HashKeyRange": {},
                             "SequenceNumberRange": {"StartingSequenceNumber": "1",
                                                     "EndingSequenceNumber": "9"}})
    assert closed.is_closed and closed.parent_shard_ids == []


def test_trim_horizon_fresh_table_leases_every_shard_children_name_parents():
    leases = by_key(new_leases(SPLIT_AND_MERGE, {}, config("TRIM_HORIZON")))
    assert set(leases) == {"shard-0", "shard-1", "shard-2", "shard-3", "shard-9"}
    for lease in leases.values():
        assert lease.checkpoint == ESN.TRIM_HORIZON
        assert lease.lease_owner is None and lease.lease_counter == 0
    assert leases["shard-0"].parent_shard_ids == frozenset()
    assert leases["shard-1"].parent_shard_ids == {"shard-0"}
    assert leases["shard-2"].parent_shard_ids == {"shard-0"}
    assert leases["shard-3"].parent_shard_ids == {"shard-1", "shard-2"}  # merge: two parents
    assert leases["shard-9"].parent_shard_ids == frozenset()
    assert (leases["shard-3"].starting_hash_key, leases["shard-3"].ending_hash_key) == ("0", "100")


def test_latest_fresh_table_skips_closed_roots_and_their_children_become_roots_at_latest():
    shards = [shard("shard-0", closed=True), shard("shard-1", "shard-0"),
              shard("shard-2", "shard-0"), shard("shard-5")]
    leases = by_key(new_leases(shards, {}, config("LATEST")))
    assert set(leases) == {"shard-1", "shard-2", "shard-5"}
    for key in ("shard-1", "shard-2", "shard-5"):
        assert leases[key].parent_shard_ids == frozenset()
        assert leases[key].checkpoint == ESN.LATEST


def test_latest_fresh_table_open_shards_start_at_latest():
    leases = new_leases([shard("shard-0"), shard("shard-1")], {}, config("LATEST"))
    assert [lease.checkpoint for lease in leases] == [ESN.LATEST, ESN.LATEST]


def test_at_timestamp_roots_start_at_timestamp_children_at_trim_horizon():
    cfg = config("AT_TIMESTAMP", initial_position_timestamp=1700000000.0)
    leases = by_key(new_leases([shard("p"), shard("c", "p")], {}, cfg))
    assert leases["p"].checkpoint == ESN.AT_TIMESTAMP
    assert leases["c"].checkpoint == ESN.TRIM_HORIZON
    assert initial_checkpoint(cfg) == ESN.AT_TIMESTAMP


def test_existing_leases_are_not_recreated():
    existing = {"shard-0": Lease("shard-0", lease_owner="A", lease_counter=7,
                                 checkpoint=ESN("123"))}
    leases = by_key(new_leases([shard("shard-0"), shard("shard-1")], existing, config()))
    assert set(leases) == {"shard-1"}
    assert new_leases([shard("shard-0")], existing, config()) == []


def test_new_children_of_an_existing_parent_start_at_trim_horizon_even_with_latest():
    # After a split on a running application nothing written to the children may be skipped.
    existing = {"shard-0": Lease("shard-0", lease_owner="A", lease_counter=7,
                                 checkpoint=ESN.SHARD_END)}
    shards = [shard("shard-0", closed=True), shard("shard-1", "shard-0"),
              shard("shard-2", "shard-0")]
    leases = by_key(new_leases(shards, existing, config("LATEST")))
    assert set(leases) == {"shard-1", "shard-2"}
    for lease in leases.values():
        assert lease.checkpoint == ESN.TRIM_HORIZON
        assert lease.parent_shard_ids == {"shard-0"}


def test_merge_child_of_two_leased_parents():
    existing = {"a": Lease("a", checkpoint=ESN("5")), "b": Lease("b", checkpoint=ESN("6"))}
    shards = [shard("a", closed=True), shard("b", closed=True), shard("m", "a", "b")]
    (lease,) = new_leases(shards, existing, config("LATEST"))
    assert lease.lease_key == "m"
    assert lease.parent_shard_ids == {"a", "b"}
    assert lease.checkpoint == ESN.TRIM_HORIZON


def test_parent_expired_from_the_stream_and_without_lease_is_dropped():
    # Shard listing no longer shows the parent (trimmed away) and no lease exists for it.
    (lease,) = new_leases([shard("c", "gone")], {}, config("TRIM_HORIZON"))
    assert lease.parent_shard_ids == frozenset()
    assert lease.checkpoint == ESN.TRIM_HORIZON


def test_parents_done():
    finished = Lease("p1", checkpoint=ESN.SHARD_END)
    running = Lease("p2", checkpoint=ESN("99"))
    child = Lease("c", parent_shard_ids=frozenset({"p1", "p2"}))
    leases = {"p1": finished, "p2": running, "c": child}
    assert not parents_done(child, leases)
    leases["p2"] = Lease("p2", checkpoint=ESN.SHARD_END)
    assert parents_done(child, leases)
    # A parent without a lease (never leased, or cleaned up) does not block.
    assert parents_done(Lease("c2", parent_shard_ids=frozenset({"nobody"})), leases)
    assert parents_done(Lease("root"), leases)
    # One finished parent of a merge is not enough.
    half = {"p1": finished, "p2": running}
    assert not parents_done(Lease("m", parent_shard_ids=frozenset({"p1", "p2"})), half)


def test_latest_fresh_table_skips_every_closed_shard_not_only_roots():
    # Split then merge, all before the application first starts at LATEST: only the open
    # shards are read, from LATEST (the KCL's empty-table sync). Leasing the closed middle
    # generation would make shard-3 a child and start it at TRIM_HORIZON: a full replay.
    leases = by_key(new_leases(SPLIT_AND_MERGE, {}, config("LATEST")))
    assert set(leases) == {"shard-3", "shard-9"}
    for lease in leases.values():
        assert lease.checkpoint == ESN.LATEST
        assert lease.parent_shard_ids == frozenset()


def test_leases_are_created_in_generations_parents_before_children():
    """A split's children and a merge's child wait for their parents' leases; the rest of a
    generation is written together."""
    from kinesis_dstream.worker.shard_sync import in_generations

    def lease(key, *parents):
        return Lease(lease_key=key, checkpoint=ESN("TRIM_HORIZON"),
                     parent_shard_ids=frozenset(parents))

    leases = [lease("c1", "p"), lease("p"), lease("q"), lease("m", "c1", "q"), lease("c2", "p"),
              lease("r", "gone")]
    generations = [[x.lease_key for x in g] for g in in_generations(leases)]
    assert generations == [["p", "q", "r"], ["c1", "c2"], ["m"]]
    assert in_generations([]) == []


def test_a_sync_writes_a_generation_concurrently_and_the_next_after_it():
    import threading

    from kinesis_dstream.worker.shard_sync import ShardSyncer

    shards = [shard(f"s{i}") for i in range(6)] + [shard("child", "s0")]
    barrier = threading.Barrier(6, timeout=30)  # every root's write waits for the others
    written: list[str] = []

    class Table:
        def list_leases(self):
            return []

        def create_lease_if_not_exists(self, lease):
            if lease.lease_key != "child":
                barrier.wait()
            written.append(lease.lease_key)
            return True

    kinesis = type("K", (), {"list_shards": lambda self: shards})()
    assert ShardSyncer(config(), kinesis, Table()).sync() == 7
    assert written[-1] == "child" and sorted(written[:6]) == [f"s{i}" for i in range(6)]
