"""``kinesis-dstream leases create-table`` and the library on tables made ahead of time,
against moto's DynamoDB server (kinesis-local where a stream is read)."""
from __future__ import annotations

import json
import time
from typing import Any

import pytest

import emulators
from fault_proxy import FaultProxy
from test_multilang_daemon import Daemon, write_properties
from test_operations_leases import run_cli

from kinesis_dstream.aws.range_table import range_table_name

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(180)]


def create(capsys, app: str, dynamodb: str, *extra: str) -> tuple[int, Any, str, float]:
    code, out, err, elapsed = run_cli(capsys, "leases", "create-table", "--app", app,
                                      "--dynamodb-endpoint", dynamodb, "--json", *extra)
    return code, json.loads(out) if out.strip() else None, err, elapsed


def described(dynamodb: str, table: str) -> dict[str, Any]:
    return emulators.client("dynamodb", dynamodb).describe_table(TableName=table)["Table"]


def tables(dynamodb: str) -> set[str]:
    return set(emulators.client("dynamodb", dynamodb).list_tables()["TableNames"])


def keys(table: dict[str, Any]) -> list[tuple[str, str, str]]:
    types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
    return [(k["AttributeName"], k["KeyType"], types[k["AttributeName"]])
            for k in table["KeySchema"]]


def test_on_demand_creates_both_tables_in_their_shapes_and_a_second_run_reports_them(
        aws_env, dynamodb, unique_app_name, capsys):
    app = unique_app_name
    code, doc, err, _ = create(capsys, app, dynamodb)
    assert code == 0, err
    assert [(t["role"], t["table"], t["action"], t["billing_mode"], t["status"])
            for t in doc["tables"]] == [
        ("lease", app, "created", "PAY_PER_REQUEST", "ACTIVE"),
        ("ranges", range_table_name(app), "created", "PAY_PER_REQUEST", "ACTIVE")]
    lease, ranges = described(dynamodb, app), described(dynamodb, range_table_name(app))
    assert keys(lease) == [("leaseKey", "HASH", "S")]
    assert keys(ranges) == [("rangeKey", "HASH", "S"), ("batchTime", "RANGE", "N")]
    for table in (lease, ranges):
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    ttl = emulators.client("dynamodb", dynamodb).describe_time_to_live(
        TableName=range_table_name(app))["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expiresAt")
    code, doc, err, _ = create(capsys, app, dynamodb, "--billing-mode", "PROVISIONED")
    assert code == 0, err  # exists: reported as it is, not changed, not an error
    assert [(t["action"], t["billing_mode"]) for t in doc["tables"]] == \
        [("exists", "PAY_PER_REQUEST")] * 2
    assert described(dynamodb, app)["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"


def test_provisioned_creates_both_tables_with_the_capacities_given(
        aws_env, dynamodb, unique_app_name, capsys):
    app = unique_app_name
    code, doc, err, _ = create(capsys, app, dynamodb, "--billing-mode", "provisioned",
                               "--read-capacity", "3", "--write-capacity", "4")
    assert code == 0, err
    assert [(t["action"], t["billing_mode"], t["read_capacity"], t["write_capacity"])
            for t in doc["tables"]] == [("created", "PROVISIONED", 3, 4)] * 2
    for name in (app, range_table_name(app)):
        table = described(dynamodb, name)
        assert table.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED") == \
            "PROVISIONED"
        throughput = table["ProvisionedThroughput"]
        assert (throughput["ReadCapacityUnits"], throughput["WriteCapacityUnits"]) == (3, 4)


def test_dry_run_and_only_create_what_they_say(aws_env, dynamodb, unique_app_name, capsys):
    app = unique_app_name
    code, doc, err, _ = create(capsys, app, dynamodb, "--dry-run")
    assert code == 0, err
    assert [t["action"] for t in doc["tables"]] == ["would create"] * 2
    assert not {app, range_table_name(app)} & tables(dynamodb)
    code, doc, err, _ = create(capsys, app, dynamodb, "--only", "ranges")
    assert code == 0, err
    assert [(t["role"], t["action"]) for t in doc["tables"]] == [("ranges", "created")]
    assert range_table_name(app) in tables(dynamodb) and app not in tables(dynamodb)


def test_a_table_of_another_shape_is_an_error_and_nothing_is_created(
        aws_env, dynamodb, unique_app_name, capsys):
    app = unique_app_name
    emulators.client("dynamodb", dynamodb).create_table(
        TableName=app, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}])
    code, doc, err, elapsed = create(capsys, app, dynamodb)
    assert code == 2 and doc is None
    assert f"table {app!r} exists but is not a lease table" in err and "leaseKey" in err
    assert range_table_name(app) not in tables(dynamodb)


@pytest.mark.parametrize("extra, code, message", [
    (("--billing-mode", "ON_DEMAND"), 2, "expected one of PAY_PER_REQUEST, PROVISIONED"),
    (("--read-capacity", "5"), 2, "--read-capacity needs --billing-mode PROVISIONED"),
    (("--billing-mode", "PAY_PER_REQUEST", "--read-capacity", "5", "--write-capacity", "5"), 2,
     "--read-capacity and --write-capacity need --billing-mode PROVISIONED"),
    (("--billing-mode", "PROVISIONED", "--read-capacity", "0"), 2, "capacity units >= 1"),
    (("--dynamodb-endpoint", "http://127.0.0.1:9"), 3, "endpoint unreachable"),
])
def test_bad_input_is_a_clear_error_fast_and_nothing_is_written(
        aws_env, dynamodb, unique_app_name, capsys, extra, code, message):
    app = unique_app_name
    got, doc, err, elapsed = create(capsys, app, dynamodb, *extra)
    assert (got, doc) == (code, None), err
    assert message in err
    assert elapsed < 10
    assert not {app, range_table_name(app)} & tables(dynamodb)


@pytest.mark.parametrize("billing", [
    ("--billing-mode", "PROVISIONED", "--read-capacity", "2", "--write-capacity", "2"),
    ("--billing-mode", "PAY_PER_REQUEST"),
], ids=["provisioned", "on-demand"])
def test_the_library_starts_on_created_tables_without_creating_any(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, unique_app_name, capsys,
        billing):
    """The worker, the DStream driver's coordinator and the SQL source's driver, each through
    a counting proxy: DescribeTable, and no CreateTable or UpdateTimeToLive; the tables keep
    the billing create-table gave them."""
    from kinesis_dstream.spark.coordinator import ShardCoordinator
    from kinesis_dstream.sql.driver_state import DriverState
    from kinesis_dstream.worker.processor import RecordProcessor
    from kinesis_dstream.worker.scheduler import Scheduler

    app = unique_app_name
    code, _, err, _ = create(capsys, app, dynamodb, *billing)
    assert code == 0, err
    stream = make_stream(1)

    class Idle(RecordProcessor):
        def process_records(self, process_records_input):
            pass

    with FaultProxy(dynamodb, share=0.0) as proxy:
        config = make_config(stream, dynamodb_endpoint=proxy.endpoint)
        scheduler = Scheduler(config, lambda shard_id: Idle())
        scheduler.start()
        try:
            deadline = time.monotonic() + 30
            while not scheduler.metrics():
                assert time.monotonic() < deadline, "the worker took no lease"
                time.sleep(0.1)
        finally:
            scheduler.shutdown()
        coordinator = ShardCoordinator(config.replace(worker_id="driver"))
        coordinator.add_member("input-stream")
        coordinator.start()
        try:
            assert coordinator.fatal is None and coordinator._up
        finally:
            coordinator.stop()
        DriverState(config).ranges  # noqa: B018 - what the SQL source does before a batch
        calls = dict(proxy.calls)
    assert calls.get(("DescribeTable", app), 0) >= 2
    assert calls.get(("DescribeTable", range_table_name(app)), 0) >= 2
    assert not [c for c in calls if c[0] in ("CreateTable", "UpdateTimeToLive",
                                             "UpdateContinuousBackups", "UpdateTable")], calls
    for name in (app, range_table_name(app)):
        table = described(dynamodb, name)
        mode = table.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED")
        assert mode == billing[1], (name, table)
        if mode == "PROVISIONED":
            assert table["ProvisionedThroughput"]["ReadCapacityUnits"] == 2


def test_a_properties_files_billing_mode_reaches_the_table_the_daemon_creates(
        aws_env, kinesis_local, dynamodb, make_stream, unique_app_name, tmp_path, daemons):
    stream = make_stream(1)
    properties = write_properties(tmp_path, stream, unique_app_name, kinesis_local, dynamodb,
                                  billingMode="PROVISIONED", initialLeaseTableReadCapacity="3",
                                  initialLeaseTableWriteCapacity="4")
    daemon = Daemon(properties, tmp_path, "billing")
    daemons.append(daemon)
    ddb = emulators.client("dynamodb", dynamodb)
    deadline = time.monotonic() + 60
    while not (unique_app_name in tables(dynamodb)
               and ddb.scan(TableName=unique_app_name)["Items"]):
        assert daemon.proc.poll() is None, daemon.log()[-3000:]
        assert time.monotonic() < deadline, daemon.log()[-3000:]
        time.sleep(0.2)
    table = described(dynamodb, unique_app_name)
    assert table.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED") == "PROVISIONED"
    assert (table["ProvisionedThroughput"]["ReadCapacityUnits"],
            table["ProvisionedThroughput"]["WriteCapacityUnits"]) == (3, 4)
    assert daemon.stop() == 0
