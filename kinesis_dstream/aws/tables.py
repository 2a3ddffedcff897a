"""Creating our DynamoDB tables: key schema, billing mode and options, then the wait.

A table is created only when DescribeTable says it does not exist. One made beforehand (by
``kinesis-dstream leases create-table``, CloudFormation or Terraform) is used as it is: its
owner chose its billing, and an application that finds it needs no CreateTable permission.
The settings are the KCL's LeaseManagementConfig ones (``TableSettings.of`` a config).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import botocore.exceptions

from ..config import DEFAULT_TABLE_CAPACITY, ConsumerConfig
from ..retry import RetryPolicy, poll_until
from .clients import call
from .protocols import DynamoDBAPI

log = logging.getLogger(__name__)

# (attribute, HASH or RANGE, S or N)
KeySchema = Sequence[tuple[str, str, str]]


@dataclass(frozen=True)
class TableSettings:
    """How a table we create is billed and protected."""

    billing_mode: str = "PAY_PER_REQUEST"
    read_capacity: int = DEFAULT_TABLE_CAPACITY
    write_capacity: int = DEFAULT_TABLE_CAPACITY
    deletion_protection: bool = False
    point_in_time_recovery: bool = False

    @classmethod
    def of(cls, config: ConsumerConfig) -> "TableSettings":
        return cls(config.billing_mode, config.initial_lease_table_read_capacity,
                   config.initial_lease_table_write_capacity,
                   config.lease_table_deletion_protection_enabled,
                   config.lease_table_pitr_enabled)

    def create_arguments(self, table_name: str, keys: KeySchema) -> dict[str, Any]:
        """CreateTable's arguments (capacities only for PROVISIONED, as DynamoDB wants)."""
        arguments: dict[str, Any] = {
            "TableName": table_name,
            "KeySchema": [{"AttributeName": name, "KeyType": kind} for name, kind, _ in keys],
            "AttributeDefinitions": [{"AttributeName": name, "AttributeType": type_}
                                     for name, _, type_ in keys],
            "BillingMode": self.billing_mode,
        }
        if self.billing_mode == "PROVISIONED":
            arguments["ProvisionedThroughput"] = {"ReadCapacityUnits": self.read_capacity,
                                                  "WriteCapacityUnits": self.write_capacity}
        if self.deletion_protection:
            arguments["DeletionProtectionEnabled"] = True
        return arguments


def describe(policy: RetryPolicy, client: DynamoDBAPI, table_name: str,
             what: str) -> dict[str, Any] | None:
    """DescribeTable's ``Table``, or None when there is no such table."""
    try:
        return call(policy, client.describe_table, f"describing the {what} (table {table_name})",
                    expected=("ResourceNotFoundException",), TableName=table_name)["Table"]
    except botocore.exceptions.ClientError:
        return None


def schema_problem(table: dict[str, Any], keys: KeySchema) -> str | None:
    """What is wrong with an existing table's key schema for our items, or None."""
    have = {(k["AttributeName"], k["KeyType"]) for k in table.get("KeySchema", [])}
    types = {a["AttributeName"]: a["AttributeType"]
             for a in table.get("AttributeDefinitions", [])}
    want = {(name, kind) for name, kind, _ in keys}
    wrong_type = [f"{name} is {types.get(name)}, not {type_}" for name, _, type_ in keys
                  if (name, _) in have and types.get(name) != type_]
    if have != want or wrong_type:
        expected = ", ".join(f"{name} ({kind}, {type_})" for name, kind, type_ in keys)
        found = ", ".join(f"{name} ({kind}, {types.get(name)})" for name, kind in sorted(have))
        return f"its key schema is {found or 'unknown'}; expected {expected}"
    return None


def create_table_if_not_exists(policy: RetryPolicy, client: DynamoDBAPI, table_name: str,
                               what: str, keys: KeySchema, timeout_s: float = 60.0,
                               settings: TableSettings = TableSettings()) -> bool:
    """Create the table unless it exists, then wait until it is ACTIVE; True if this call
    created it. Another worker or driver creating it at the same moment is fine: both wait
    for the one table."""
    where = f"(table {table_name})"
    created = False
    if describe(policy, client, table_name, what) is None:
        try:
            call(policy, client.create_table, f"creating the {what} {where}",
                 expected=("ResourceInUseException",),
                 **settings.create_arguments(table_name, keys))
            created = True
            log.info("created %s %s (%s)", what, table_name, settings.billing_mode)
        except botocore.exceptions.ClientError:
            pass  # created by another process first
    poll_until(lambda: call(policy, client.describe_table, f"describing the {what} {where}",
                            TableName=table_name)["Table"]["TableStatus"] == "ACTIVE",
               f"{what} {table_name} not ACTIVE", timeout_s=timeout_s)
    if created and settings.point_in_time_recovery:
        call(policy, client.update_continuous_backups,
             f"turning point-in-time recovery on for the {what} {where}", TableName=table_name,
             PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True})
    return created
