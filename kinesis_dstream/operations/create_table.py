"""``leases create-table``: the lease table and the batch-range table, made ahead of time.

The tables the library would create on first start, made by an operator instead, with the
billing the operator chooses (the library then finds them and creates nothing). Every table
is described before anything is created: one that exists is reported as it is, and one whose
key schema our items cannot use stops the command with nothing created.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ..aws.clients import make_client
from ..aws.lease_table import LEASE_TABLE_KEYS
from ..aws.range_table import RANGE_TABLE_KEYS, enable_ttl, range_table_name
from ..aws.tables import KeySchema, TableSettings, create_table_if_not_exists, describe, schema_problem
from ..config import BILLING_MODES, DEFAULT_TABLE_CAPACITY, ConsumerConfig
from ..retry import RetryPolicy
from ..settings import parse_choice
from .connection import EXIT_OK, OPERATOR_RETRY, BadInput, emit_json, emit_table

ROLES = ("lease", "ranges")
WHAT = {"lease": "lease table", "ranges": "batch-range table"}


@dataclass
class TablePlan:
    """One table: what we found and what we do (or did) about it."""

    role: str
    table: str
    keys: KeySchema
    found: dict[str, Any] | None = None
    action: str = ""

    def to_json(self, settings: TableSettings) -> dict[str, Any]:
        table = self.found or {}
        billing = (table.get("BillingModeSummary", {}).get("BillingMode")
                   or ("PROVISIONED" if table else settings.billing_mode))
        throughput = table.get("ProvisionedThroughput", {})
        if table:
            read, write = throughput.get("ReadCapacityUnits"), throughput.get("WriteCapacityUnits")
        else:
            provisioned = settings.billing_mode == "PROVISIONED"
            read = settings.read_capacity if provisioned else None
            write = settings.write_capacity if provisioned else None
        return {"role": self.role, "table": self.table, "action": self.action,
                "billing_mode": billing,
                "read_capacity": read if billing == "PROVISIONED" else None,
                "write_capacity": write if billing == "PROVISIONED" else None,
                "status": table.get("TableStatus")}


def _billing_mode(value: str) -> str:
    try:
        return parse_choice("--billing-mode", value, BILLING_MODES)
    except Exception as exc:  # noqa: BLE001 - argparse reports it as a usage error
        raise argparse.ArgumentTypeError(str(exc)) from None


def _capacity(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of capacity units >= 1, got {value!r}")
    return int(value)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("create-table", help="create the lease and batch-range tables")
    parser.add_argument("--app", required=True, help="application name (KCL applicationName)")
    parser.add_argument("--table", help="lease table, when not named after the application")
    parser.add_argument("--region", help="AWS region (default: AWS_REGION, AWS_DEFAULT_REGION)")
    parser.add_argument("--dynamodb-endpoint",
                        help="DynamoDB endpoint URL (default: AWS_ENDPOINT_URL_DYNAMODB, else AWS)")
    parser.add_argument("--billing-mode", type=_billing_mode, default="PAY_PER_REQUEST",
                        metavar="PAY_PER_REQUEST|PROVISIONED",
                        help="how the new tables are billed (default PAY_PER_REQUEST)")
    parser.add_argument("--read-capacity", type=_capacity, metavar="RCU",
                        help=f"PROVISIONED only: read capacity units of each table "
                             f"(default {DEFAULT_TABLE_CAPACITY}, the KCL's)")
    parser.add_argument("--write-capacity", type=_capacity, metavar="WCU",
                        help=f"PROVISIONED only: write capacity units of each table "
                             f"(default {DEFAULT_TABLE_CAPACITY}, the KCL's)")
    parser.add_argument("--deletion-protection", action="store_true",
                        help="create the tables with deletion protection")
    parser.add_argument("--pitr", action="store_true",
                        help="turn point-in-time recovery on for the new tables")
    parser.add_argument("--only", choices=ROLES,
                        help="only the lease table (DStream, worker, multilang) or only the "
                             "batch-range table (the SQL source: --app is its "
                             "kinesis.dynamodb.tableName)")
    parser.add_argument("--wait-s", type=float, default=300.0,
                        help="how long to wait for a new table to be ACTIVE (default 300)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, create nothing")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(handler=create_table)


def settings_of(args: argparse.Namespace) -> TableSettings:
    given = [flag for flag, value in (("--read-capacity", args.read_capacity),
                                      ("--write-capacity", args.write_capacity))
             if value is not None]
    if given and args.billing_mode != "PROVISIONED":
        raise BadInput(f"{' and '.join(given)} {'need' if len(given) > 1 else 'needs'} "
                       "--billing-mode PROVISIONED (a "
                       f"{args.billing_mode} table has no provisioned capacity)")
    return TableSettings(args.billing_mode, args.read_capacity or DEFAULT_TABLE_CAPACITY,
                         args.write_capacity or DEFAULT_TABLE_CAPACITY,
                         args.deletion_protection, args.pitr)


def create_table(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    config = ConsumerConfig(
        application_name=args.table or args.app, stream_name=args.app,
        **({"region_name": args.region} if args.region else {}),
        dynamodb_endpoint=args.dynamodb_endpoint, metrics_level="NONE", **OPERATOR_RETRY)
    client = make_client(config, "dynamodb")
    retry = RetryPolicy.from_config(config)
    plans = [TablePlan("lease", args.table or args.app, LEASE_TABLE_KEYS),
             TablePlan("ranges", range_table_name(args.app), RANGE_TABLE_KEYS)]
    plans = [plan for plan in plans if args.only in (None, plan.role)]
    for plan in plans:
        plan.found = describe(retry, client, plan.table, WHAT[plan.role])
        problem = plan.found is not None and schema_problem(plan.found, plan.keys)
        if problem:
            raise BadInput(f"table {plan.table!r} exists but is not a {WHAT[plan.role]}: "
                           f"{problem}; nothing created")
        plan.action = "exists" if plan.found else "would create" if args.dry_run else "create"
    for plan in plans:
        if plan.action != "create":
            continue
        created = create_table_if_not_exists(retry, client, plan.table, WHAT[plan.role],
                                             plan.keys, args.wait_s, settings)
        if created and plan.role == "ranges":
            enable_ttl(client, plan.table)
        plan.action = "created" if created else "exists"
        plan.found = describe(retry, client, plan.table, WHAT[plan.role])
    rows = [plan.to_json(settings) for plan in plans]
    if args.json:
        emit_json({"application": args.app, "dry_run": args.dry_run, "tables": rows})
    else:
        emit_table(["ROLE", "TABLE", "ACTION", "BILLING", "RCU", "WCU", "STATUS"],
                   [[r["role"], r["table"], r["action"], r["billing_mode"],
                     _cell(r["read_capacity"]), _cell(r["write_capacity"]), _cell(r["status"])]
                    for r in rows])
    return EXIT_OK


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
