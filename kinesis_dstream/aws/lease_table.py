"""The KCL 2.x lease table in DynamoDB: its item format and its conditional writes.

The attribute names and types are the Java KCL's (DynamoDBLeaseSerializer), so a Java
worker and ours can share one table. KCL 3.x writes to the same table: it adds attributes
we leave alone (``throughputKBps``), one we clear on every take and eviction as it does
(``checkpointOwner``, its owner-in-waiting during a graceful handoff), and, from 3.5 on,
items that are not leases at all (coordinator state, worker metrics, marked by
``entityType``; its leases are marked LEASE): every read here skips those, so nothing above
sees them as leases. Multi-stream leases (``stream_identifier``) carry ``streamName`` and
``shardId`` besides their key, as the KCL's DynamoDBMultiStreamLeaseSerializer writes them. Every
write is guarded by ``leaseCounter``, which the holder bumps on each take, renew and
checkpoint: a failed guard means someone else wrote the lease since we last saw it, i.e. we
lost it. This module only reads and writes items; who takes what and when is decided in
``worker.leases``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import botocore.exceptions

from ..config import ConsumerConfig
from ..errors import LeaseLostError
from ..records import ExtendedSequenceNumber
from ..retry import RetryPolicy
from .clients import call, make_client
from .protocols import DynamoDBAPI
from .tables import TableSettings, create_table_if_not_exists

# The KCL 2.x lease table's key: (attribute, key type, attribute type).
LEASE_TABLE_KEYS = (("leaseKey", "HASH", "S"),)


@dataclass(frozen=True)
class Lease:
    lease_key: str
    lease_owner: str | None = None
    lease_counter: int = 0
    checkpoint: ExtendedSequenceNumber = ExtendedSequenceNumber("TRIM_HORIZON")
    owner_switches_since_checkpoint: int = 0
    parent_shard_ids: frozenset[str] = frozenset()
    child_shard_ids: frozenset[str] = frozenset()
    starting_hash_key: str | None = None
    ending_hash_key: str | None = None
    pending_checkpoint: str | None = None
    # Multi-stream leases only: the serialized stream identifier (the item's ``streamName``,
    # the key's prefix); the shard id is then the rest of the key (the item's ``shardId``).
    stream_identifier: str | None = None

    @property
    def is_finished(self) -> bool:
        return self.checkpoint.is_shard_end

    @property
    def shard_id(self) -> str:
        """The Kinesis shard id: the key itself in single-stream mode."""
        if self.stream_identifier is None:
            return self.lease_key
        return self.lease_key[len(self.stream_identifier) + 1:]

    def key_of(self, shard_id: str) -> str:
        """The lease key of another shard of the same stream (a parent's, a child's):
        ``parentShardId`` and ``childShardIds`` hold shard ids in both modes, as in the KCL."""
        return shard_id if self.stream_identifier is None else f"{self.stream_identifier}:{shard_id}"


def is_lease_item(item: dict[str, Any]) -> bool:
    """A shard lease, not one of KCL 3.5's coordinator or worker-metrics items nor anything
    else without the ``leaseCounter`` every lease write guards on. KCL 3.5 (and kcl-rs) mark
    their leases ``entityType`` LEASE and every other item with another type; older leases
    have none."""
    return item.get("entityType", {}).get("S", "LEASE") == "LEASE" and "leaseCounter" in item


def _item_to_lease(item: dict[str, Any]) -> Lease:
    def s(name: str) -> str | None:
        return item[name]["S"] if name in item else None

    def n(name: str, default: int = 0) -> int:
        return int(item[name]["N"]) if name in item else default

    def ss(name: str) -> frozenset[str]:
        return frozenset(item[name]["SS"]) if name in item else frozenset()

    return Lease(
        lease_key=item["leaseKey"]["S"],
        lease_owner=s("leaseOwner"),
        lease_counter=n("leaseCounter"),
        checkpoint=ExtendedSequenceNumber(s("checkpoint") or "TRIM_HORIZON",
                                          n("checkpointSubSequenceNumber")),
        owner_switches_since_checkpoint=n("ownerSwitchesSinceCheckpoint"),
        parent_shard_ids=ss("parentShardId"),
        child_shard_ids=ss("childShardIds"),
        starting_hash_key=s("startingHashKey"),
        ending_hash_key=s("endingHashKey"),
        pending_checkpoint=s("pendingCheckpoint"),
        stream_identifier=s("streamName"),
    )


def _lease_to_item(lease: Lease) -> dict[str, Any]:
    item: dict[str, Any] = {
        "leaseKey": {"S": lease.lease_key},
        "leaseCounter": {"N": str(lease.lease_counter)},
        "checkpoint": {"S": lease.checkpoint.sequence_number},
        "checkpointSubSequenceNumber": {"N": str(lease.checkpoint.sub_sequence_number)},
        "ownerSwitchesSinceCheckpoint": {"N": str(lease.owner_switches_since_checkpoint)},
    }
    if lease.lease_owner:
        item["leaseOwner"] = {"S": lease.lease_owner}
    if lease.parent_shard_ids:
        item["parentShardId"] = {"SS": sorted(lease.parent_shard_ids)}
    if lease.child_shard_ids:
        item["childShardIds"] = {"SS": sorted(lease.child_shard_ids)}
    if lease.starting_hash_key is not None:
        item["startingHashKey"] = {"S": lease.starting_hash_key}
    if lease.ending_hash_key is not None:
        item["endingHashKey"] = {"S": lease.ending_hash_key}
    if lease.stream_identifier is not None:
        item["streamName"] = {"S": lease.stream_identifier}
        item["shardId"] = {"S": lease.shard_id}
    return item


@dataclass
class LeaseTable:
    """``LeaseRefresher`` in the KCL: table lifecycle plus guarded item writes."""

    config: ConsumerConfig
    client: DynamoDBAPI | None = None
    retry: RetryPolicy = field(init=False)

    def __post_init__(self) -> None:
        self.retry = RetryPolicy.from_config(self.config)
        if self.client is None:
            self.client = make_client(self.config, "dynamodb")

    @property
    def table_name(self) -> str:
        return self.config.lease_table_name

    def _call(self, what: str, operation: str, expected: tuple[str, ...] = (), **kwargs: Any) -> Any:
        """One DynamoDB call; a lost conditional write always comes back raw (see _guarded_update)."""
        return call(self.retry, getattr(self.client, operation), f"{what} (table {self.table_name})",
                    expected=(*expected, "ConditionalCheckFailedException"), **kwargs)

    # -- table --------------------------------------------------------------------------
    def create_table_if_not_exists(self, timeout_s: float = 60.0) -> bool:
        """Create the table in the KCL 2.x shape, billed as the config says, unless it
        exists; True if this call created it."""
        assert self.client is not None  # set in __post_init__
        return create_table_if_not_exists(self.retry, self.client, self.table_name,
                                          "lease table", LEASE_TABLE_KEYS, timeout_s,
                                          TableSettings.of(self.config))

    # -- reads --------------------------------------------------------------------------
    def list_leases(self) -> list[Lease]:
        leases: list[Lease] = []
        kwargs: dict[str, Any] = {"TableName": self.table_name, "ConsistentRead": True}
        while True:
            page = self._call("listing leases", "scan", **kwargs)
            leases.extend(_item_to_lease(item) for item in page.get("Items", []) if is_lease_item(item))
            if "LastEvaluatedKey" not in page:
                return leases
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def get_lease(self, lease_key: str) -> Lease | None:
        item = self._call(f"reading lease {lease_key}", "get_item", TableName=self.table_name,
                          Key={"leaseKey": {"S": lease_key}}, ConsistentRead=True).get("Item")
        return _item_to_lease(item) if item and is_lease_item(item) else None

    # -- writes -------------------------------------------------------------------------
    def create_lease_if_not_exists(self, lease: Lease) -> bool:
        try:
            self._call(f"creating lease {lease.lease_key}", "put_item", TableName=self.table_name,
                       Item=_lease_to_item(lease),
                       ConditionExpression="attribute_not_exists(leaseKey)")
            return True
        except botocore.exceptions.ClientError:  # only the condition comes back raw
            return False

    def _guarded_update(self, lease: Lease, what: str, update: str,
                        values: dict[str, Any], names: dict[str, str] | None = None,
                        require_owner: str | None = None) -> None:
        condition = "leaseCounter = :expected"
        values = {**values, ":expected": {"N": str(lease.lease_counter)}}
        if require_owner is not None:
            condition += " AND leaseOwner = :me"
            values[":me"] = {"S": require_owner}
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": {"leaseKey": {"S": lease.lease_key}},
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeValues": values,
        }
        if names:
            kwargs["ExpressionAttributeNames"] = names
        try:
            self._call(f"{what} lease {lease.lease_key}", "update_item", **kwargs)
        except botocore.exceptions.ClientError:  # only the condition comes back raw
            raise LeaseLostError(
                f"{what} lease {lease.lease_key}: it changed since counter {lease.lease_counter}"
            ) from None

    def take_lease(self, lease: Lease, owner: str) -> Lease:
        """Take an expired, unowned or stolen lease; a steal counts an owner switch.

        ``checkpointOwner`` goes, as in KCL 3.x: left behind, a KCL 3 worker would take the
        previous owner for the one still checkpointing and wait on a handoff that never ends."""
        switches = lease.owner_switches_since_checkpoint
        if lease.lease_owner and lease.lease_owner != owner:
            switches += 1
        self._guarded_update(
            lease, "taking",
            "SET leaseOwner = :owner, leaseCounter = :counter, ownerSwitchesSinceCheckpoint = :switches"
            " REMOVE checkpointOwner",
            {":owner": {"S": owner}, ":counter": {"N": str(lease.lease_counter + 1)},
             ":switches": {"N": str(switches)}})
        return replace(lease, lease_owner=owner, lease_counter=lease.lease_counter + 1,
                       owner_switches_since_checkpoint=switches)

    def renew_lease(self, lease: Lease) -> Lease:
        self._guarded_update(lease, "renewing", "SET leaseCounter = :counter",
                             {":counter": {"N": str(lease.lease_counter + 1)}},
                             require_owner=lease.lease_owner)
        return replace(lease, lease_counter=lease.lease_counter + 1)

    def update_checkpoint(self, lease: Lease, checkpoint: ExtendedSequenceNumber) -> Lease:
        self._write_checkpoint(lease, checkpoint, "checkpointing", operator=False)
        return replace(lease, checkpoint=checkpoint, owner_switches_since_checkpoint=0,
                       lease_counter=lease.lease_counter + 1, pending_checkpoint=None)

    def _write_checkpoint(self, lease: Lease, checkpoint: ExtendedSequenceNumber, what: str,
                          operator: bool) -> None:
        """The checkpoint write: the holder's (guarded on counter and owner), or an operator's
        (guarded on the counter alone, the owner removed with it)."""
        removed = "leaseOwner, checkpointOwner, " if operator else ""
        self._guarded_update(
            lease, what,
            "SET #cp = :cp, checkpointSubSequenceNumber = :sub, ownerSwitchesSinceCheckpoint = :zero,"
            " leaseCounter = :counter"
            f" REMOVE {removed}pendingCheckpoint, pendingCheckpointSubSequenceNumber,"
            " pendingCheckpointState",
            {":cp": {"S": checkpoint.sequence_number},
             ":sub": {"N": str(checkpoint.sub_sequence_number)},
             ":zero": {"N": "0"},
             ":counter": {"N": str(lease.lease_counter + 1)}},
            names={"#cp": "checkpoint"},
            require_owner=None if operator else lease.lease_owner)

    def set_child_shard_ids(self, lease: Lease, child_shard_ids: list[str]) -> Lease:
        """Record the children on a finished parent, as the KCL does at shard end."""
        if not child_shard_ids:
            return lease
        self._guarded_update(lease, "recording children of",
                             "SET childShardIds = :children, leaseCounter = :counter",
                             {":children": {"SS": sorted(child_shard_ids)},
                              ":counter": {"N": str(lease.lease_counter + 1)}})
        return replace(lease, child_shard_ids=frozenset(child_shard_ids),
                       lease_counter=lease.lease_counter + 1)

    def evict_lease(self, lease: Lease) -> Lease:
        """Give a lease up (graceful shutdown): the owner goes (``checkpointOwner`` too, as in
        KCL 3.x), the checkpoint stays."""
        self._guarded_update(lease, "releasing",
                             "REMOVE leaseOwner, checkpointOwner SET leaseCounter = :counter",
                             {":counter": {"N": str(lease.lease_counter + 1)}},
                             require_owner=lease.lease_owner)
        return replace(lease, lease_owner=None, lease_counter=lease.lease_counter + 1)

    def reset_checkpoint(self, lease: Lease, checkpoint: ExtendedSequenceNumber) -> Lease:
        """An operator's move of the checkpoint (``kinesis-dstream leases reset``), guarded
        on the counter alone: the owner goes with it, so the holder's next guarded write
        fails (it has lost the lease) and whoever takes the now unowned lease reads
        ``checkpoint``, never the position the holder had."""
        self._write_checkpoint(lease, checkpoint, "resetting", operator=True)
        return replace(lease, lease_owner=None, checkpoint=checkpoint,
                       owner_switches_since_checkpoint=0,
                       lease_counter=lease.lease_counter + 1, pending_checkpoint=None)

    def delete_lease(self, lease: Lease) -> None:
        """Delete a lease whoever holds it, as the KCL deletes a former stream's leases: the
        holder's next guarded write fails, and it lets the shard go."""
        self._call(f"deleting lease {lease.lease_key}", "delete_item", TableName=self.table_name,
                   Key={"leaseKey": {"S": lease.lease_key}})

    def delete_finished_lease(self, lease: Lease) -> bool:
        """Delete a finished shard's lease (cleanupLeasesUponShardCompletion) if it is still
        finished and nobody has taken it since it was read; False if it changed."""
        try:
            self._call(f"deleting finished lease {lease.lease_key}", "delete_item",
                       TableName=self.table_name, Key={"leaseKey": {"S": lease.lease_key}},
                       ConditionExpression="#cp = :end AND leaseCounter = :expected",
                       ExpressionAttributeNames={"#cp": "checkpoint"},
                       ExpressionAttributeValues={":end": {"S": "SHARD_END"},
                                                  ":expected": {"N": str(lease.lease_counter)}})
            return True
        except botocore.exceptions.ClientError:  # only the condition comes back raw
            return False

    def delete_table(self) -> None:
        self._call("deleting the lease table", "delete_table", TableName=self.table_name)
