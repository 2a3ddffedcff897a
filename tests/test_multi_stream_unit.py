"""Multi-stream mode without I/O: the KCL's lease keys, the items, the stream list's rules."""
from __future__ import annotations

from typing import Any

import pytest

from kinesis_dstream.aws.kinesis import Shard
from kinesis_dstream.aws.lease_table import Lease, _item_to_lease, _lease_to_item
from kinesis_dstream.aws.stream_identifier import StreamIdentifier, parse_lease_key, parse_stream_arn
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.operations.positions import split_lease_key
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.worker.leases import parents_done
from kinesis_dstream.worker.shard_sync import in_generations, new_leases
from kinesis_dstream.worker.streams import MultiStreamTracker, StreamConfig, StreamSync

pytestmark = pytest.mark.unit

ORDERS = StreamIdentifier("123456789012", "orders", 1700000000)


def test_lease_key_is_account_stream_epoch_shard():
    assert ORDERS.serialize() == "123456789012:orders:1700000000"
    assert ORDERS.lease_key("shardId-000000000001") == \
        "123456789012:orders:1700000000:shardId-000000000001"
    assert StreamIdentifier.parse("123456789012:orders:1700000000") == ORDERS
    assert parse_lease_key("123456789012:orders:1700000000:shardId-000000000001") == \
        (ORDERS, "shardId-000000000001")
    assert split_lease_key(ORDERS.lease_key("shardId-7")) == ("orders", "shardId-7")


@pytest.mark.parametrize("key", ["shardId-000000000001", "a:b:c:d", "1:orders:0:shardId-1",
                                 "1:orders:x:shardId-1", "1:or:ders:5:shardId-1", ""])
def test_single_stream_and_malformed_keys_are_not_multi_stream(key):
    assert parse_lease_key(key) is None


@pytest.mark.parametrize("text", ["1:or:ders:5", "1:orders", "x:orders:5", "1:orders:0",
                                  "1:orders:-5", "1::5"])
def test_identifiers_the_kcl_refuses_are_refused(text):
    """A stream name with a colon cannot be told apart from the key's other parts."""
    with pytest.raises(ConfigurationError):
        StreamIdentifier.parse(text)


def test_names_kinesis_refuses_are_refused():
    with pytest.raises(ConfigurationError, match="colon"):
        StreamIdentifier("1", "or:ders", 5)
    with pytest.raises(ConfigurationError):
        StreamIdentifier("1", "orders", 0)


def test_stream_arn():
    arn = parse_stream_arn("arn:aws:kinesis:eu-west-1:123456789012:stream/orders")
    assert (arn.region, arn.account_id, arn.stream_name) == ("eu-west-1", "123456789012", "orders")
    assert parse_stream_arn("orders") is None


def test_multi_stream_item_carries_stream_name_and_shard_id_as_the_kcl():
    lease = Lease(lease_key=ORDERS.lease_key("shardId-2"), stream_identifier=ORDERS.serialize(),
                  parent_shard_ids=frozenset({"shardId-0"}))
    item = _lease_to_item(lease)
    assert item["leaseKey"] == {"S": "123456789012:orders:1700000000:shardId-2"}
    assert item["streamName"] == {"S": "123456789012:orders:1700000000"}
    assert item["shardId"] == {"S": "shardId-2"}
    assert item["parentShardId"] == {"SS": ["shardId-0"]}  # shard ids, not keys (KCL)
    back = _item_to_lease(item)
    assert back == lease and back.shard_id == "shardId-2"
    assert back.key_of("shardId-0") == ORDERS.lease_key("shardId-0")


def test_single_stream_item_is_unchanged():
    item = _lease_to_item(Lease(lease_key="shardId-2"))
    assert "streamName" not in item and "shardId" not in item
    assert _item_to_lease(item).shard_id == "shardId-2"


def config(**kw: Any) -> ConsumerConfig:
    return ConsumerConfig(application_name="a", stream_name="s", region_name="r",
                          initial_position="TRIM_HORIZON", worker_id="w", **kw)


def test_new_leases_of_a_stream_are_keyed_and_parented_per_stream():
    shards = [Shard("shardId-0", None, None, "0", "9", "1", "5"),
              Shard("shardId-1", "shardId-0", None, "0", "4", "6", None),
              Shard("shardId-2", "shardId-0", None, "5", "9", "6", None)]
    other = StreamIdentifier("123456789012", "events", 1700000001)
    # The same shard ids exist in another stream: its leases are not this stream's.
    existing_other = {"shardId-0": Lease(lease_key=other.lease_key("shardId-0"),
                                         stream_identifier=other.serialize())}
    assert existing_other  # keyed by shard id, but only the caller's own stream's are passed
    leases = new_leases(shards, {}, config(), ORDERS)
    keys = {lease.lease_key: lease for lease in leases}
    assert set(keys) == {ORDERS.lease_key(f"shardId-{i}") for i in range(3)}
    child = keys[ORDERS.lease_key("shardId-1")]
    assert child.parent_shard_ids == {"shardId-0"} and child.checkpoint == ESN.TRIM_HORIZON
    assert [[lease.shard_id for lease in g] for g in in_generations(leases)][0] == ["shardId-0"]
    everything = dict(keys)
    assert not parents_done(child, everything)
    everything[ORDERS.lease_key("shardId-0")] = Lease(
        lease_key=ORDERS.lease_key("shardId-0"), stream_identifier=ORDERS.serialize(),
        checkpoint=ESN.SHARD_END)
    assert parents_done(child, everything)


# -- the stream list: added, removed, listed again, deleted after the wait ----------------------

class FakeTable:
    def __init__(self, leases: list[Lease]):
        self.leases = {lease.lease_key: lease for lease in leases}
        self.deleted: list[str] = []

    def list_leases(self) -> list[Lease]:
        return list(self.leases.values())

    def delete_lease(self, lease: Lease) -> None:
        self.deleted.append(lease.lease_key)
        self.leases.pop(lease.lease_key, None)


class FakeKinesis:
    def __init__(self, config: ConsumerConfig):
        self.config = config


def lease_of(stream: StreamIdentifier, shard: str) -> Lease:
    return Lease(lease_key=stream.lease_key(shard), stream_identifier=stream.serialize())


def test_a_removed_stream_is_read_until_its_leases_are_deleted_after_the_wait():
    events = StreamIdentifier("123456789012", "events", 1700000001)
    audit = StreamIdentifier("123456789012", "audit", 1700000002)  # in the table, never listed
    table = FakeTable([lease_of(ORDERS, "shardId-0"), lease_of(events, "shardId-0"),
                       lease_of(audit, "shardId-0")])
    listed = [ORDERS.serialize(), events.serialize()]
    now = [0.0]
    sync = StreamSync(config(), MultiStreamTracker(lambda: listed, stream_check_interval_ms=1000,
                                                   wait_period_to_delete_former_streams_ms=10_000),
                      table, make_kinesis=FakeKinesis, clock=lambda: now[0])  # type: ignore[arg-type]
    sync.start()
    assert sync.listed == {ORDERS, events}
    assert set(sync.streams) == {ORDERS, events, audit}  # the orphan is read meanwhile
    assert sync.streams[audit].config.initial_position == "LATEST"
    assert sync.streams[ORDERS].config.stream_name == "orders"
    assert set(sync.stale_since) == {audit}

    listed.remove(events.serialize())
    now[0] = 0.5
    assert not sync.check_due()  # not yet its interval
    now[0] = 1.0
    assert sync.check_due()
    assert set(sync.stale_since) == {audit, events} and events in sync.streams
    now[0] = 5.0
    listed.append(events.serialize())  # listed again within the wait: kept
    sync.check()
    assert set(sync.stale_since) == {audit}
    now[0] = 10.0
    sync.check()  # the orphan's wait is over
    assert table.deleted == [audit.lease_key("shardId-0")] and audit not in sync.streams
    listed.remove(events.serialize())
    now[0] = 11.0
    sync.check()
    now[0] = 21.0
    sync.check()
    assert table.deleted[-1] == events.lease_key("shardId-0") and events not in sync.streams
    assert set(sync.streams) == {ORDERS} and not sync.stale_since


def test_no_deletion_strategy_never_deletes():
    table = FakeTable([lease_of(ORDERS, "shardId-0")])
    sync = StreamSync(config(), MultiStreamTracker([], former_streams_deletion="NO_STREAMS_LEASES_DELETION",
                                                   wait_period_to_delete_former_streams_ms=0),
                      table, make_kinesis=FakeKinesis)  # type: ignore[arg-type]
    sync.start()
    sync.check()
    assert not table.deleted


def test_stream_config_and_tracker_refuse_bad_settings():
    with pytest.raises(ConfigurationError):
        StreamConfig("orders", initial_position="EARLIEST")
    with pytest.raises(ConfigurationError):
        MultiStreamTracker([], former_streams_deletion="SOMETIMES")
    with pytest.raises(ConfigurationError):
        MultiStreamTracker([], former_streams_deletion="PROVIDED_STREAMS_DEFERRED_DELETION")


def test_leases_marked_entity_type_lease_are_leases():
    """KCL 3.5 and kcl-rs write ``entityType`` LEASE on every lease; other types are not leases."""
    from kinesis_dstream.aws.lease_table import is_lease_item

    item = _lease_to_item(Lease(lease_key=ORDERS.lease_key("shardId-0"),
                                stream_identifier=ORDERS.serialize()))
    assert is_lease_item(item)
    assert is_lease_item({**item, "entityType": {"S": "LEASE"}})
    assert not is_lease_item({**item, "entityType": {"S": "WORKER_METRIC_STATS"}})
