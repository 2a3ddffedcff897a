"""The local emulator harness, the CLI `kinesis-dstream local`, and the shared test fixtures."""
from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import botocore.config
import pytest
from aws_kinesis_agg.deaggregator import iter_deaggregate_records

import emulators
from processes import reap

from kinesis_dstream.local import Emulator, EmulatorError, LocalStack, find_node_modules

REPO = Path(__file__).resolve().parents[1]


# ---- /proc helpers: which sockets a process listens on, its children --------------------------

def _listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(ip, port) of every TCP socket ``pid`` listens on, read from /proc (no ss/psutil)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A = LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            raw = bytes.fromhex(hex_ip)
            if width == 4:
                ip = ".".join(str(b) for b in reversed(raw))
            else:
                words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
                ip = ":".join(b.hex() for b in words)
            found.append((ip, int(hex_port, 16)))
    return found


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            kids.append(int(entry.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_dead(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


# ---- fixtures and emulators ----------------------------------------------------------------

@pytest.mark.emulator
def test_kinesis_local_stream_goes_active_and_round_trips(make_stream, put_records, kinesis_client):
    stream = make_stream(2)
    summary = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    assert summary["StreamStatus"] == "ACTIVE"
    assert summary["OpenShardCount"] == 2

    put = put_records(stream, [("key-a", b"one"), ("key-b", "two"), b"three"])
    assert [p.data for p in put] == [b"one", b"two", b"three"]
    got = emulators.read_all(kinesis_client.meta.endpoint_url, stream)
    assert sorted((r["PartitionKey"], r["Data"]) for r in got) == sorted(
        (p.partition_key, p.data) for p in put)
    by_seq = {r["SequenceNumber"]: r["ShardId"] for r in got}
    assert by_seq == {p.sequence_number: p.shard_id for p in put}


@pytest.mark.emulator
def test_kpl_aggregated_put_round_trips_through_deaggregation(make_stream, put_aggregated,
                                                              kinesis_local):
    stream = make_stream(1)
    user_records = [(f"pk-{i % 7}", f"record-{i}".encode()) for i in range(250)]
    aggregates = put_aggregated(stream, user_records, per_aggregate=100)
    assert [len(a.user_records) for a in aggregates] == [100, 100, 50]
    assert [r for a in aggregates for r in a.user_records] == user_records

    raw = emulators.read_all(kinesis_local, stream)
    assert len(raw) == 3
    seen = []
    for record in iter_deaggregate_records(raw, data_format="Boto3"):
        inner = record["kinesis"]
        assert inner["aggregated"] is True
        seen.append((inner["partitionKey"], base64.b64decode(inner["data"]),
                     inner["sequenceNumber"], int(inner["subSequenceNumber"])))
    assert [(k, d) for k, d, _, _ in seen] == user_records
    first = aggregates[0]
    assert [(s, sub) for _, _, s, sub in seen[:100]] == [
        (first.sequence_number, i) for i in range(100)]


@pytest.mark.emulator
def test_kinesalite_and_dynalite_answer(make_stream, put_records, kinesalite, dynalite):
    stream = make_stream(1, endpoint=kinesalite)
    put = put_records(stream, [b"x"], endpoint=kinesalite)
    assert emulators.read_all(kinesalite, stream)[0]["SequenceNumber"] == put[0].sequence_number

    ddb = emulators.client("dynamodb", dynalite)
    table = emulators.unique_name("t")
    ddb.create_table(TableName=table, KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
                     BillingMode="PAY_PER_REQUEST")
    ddb.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 0.1})
    ddb.delete_table(TableName=table)


@pytest.mark.emulator
def test_moto_dynamodb_creates_a_kcl_style_lease_table(dynamodb_client, unique_app_name):
    dynamodb_client.create_table(
        TableName=unique_app_name, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
    )
    dynamodb_client.put_item(TableName=unique_app_name,
                             Item={"leaseKey": {"S": "shardId-000000000000"},
                                   "leaseCounter": {"N": "1"}},
                             ConditionExpression="attribute_not_exists(leaseKey)")
    with pytest.raises(dynamodb_client.exceptions.ConditionalCheckFailedException):
        dynamodb_client.put_item(TableName=unique_app_name,
                                 Item={"leaseKey": {"S": "shardId-000000000000"}},
                                 ConditionExpression="attribute_not_exists(leaseKey)")


@pytest.mark.emulator
@pytest.mark.timeout(120)
def test_moto_guarded_writes_to_one_item_never_both_win(tmp_path, monkeypatch):
    """Eight writers race read-then-conditional-increment on one item, as a checkpoint and a
    lease take race on one lease. Each win must show in the final counter: with two wins on
    one expected value, a lease would have two owners. The server's thread switches are made
    very frequent (sitecustomize) so that an unguarded check-then-write shows within seconds."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.setswitchinterval(1e-6)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    emulator = Emulator("moto").start()
    try:
        def client():
            return emulators.client("dynamodb", emulator.endpoint)

        ddb = client()
        ddb.create_table(TableName="race", BillingMode="PAY_PER_REQUEST",
                         KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                         AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}])
        key = {"k": {"S": "lease"}}
        ddb.put_item(TableName="race", Item={**key, "n": {"N": "0"}})
        wins: list[int] = []

        def race(attempts: int) -> None:
            own = client()
            for _ in range(attempts):
                seen = int(own.get_item(TableName="race", Key=key,
                                        ConsistentRead=True)["Item"]["n"]["N"])
                try:
                    own.update_item(TableName="race", Key=key, UpdateExpression="SET n = :next",
                                    ConditionExpression="n = :seen",
                                    ExpressionAttributeValues={":next": {"N": str(seen + 1)},
                                                               ":seen": {"N": str(seen)}})
                    wins.append(seen)
                except own.exceptions.ConditionalCheckFailedException:
                    pass

        threads = [threading.Thread(target=race, args=(150,)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        final = int(ddb.get_item(TableName="race", Key=key, ConsistentRead=True)["Item"]["n"]["N"])
    finally:
        emulator.stop()
    doubled = len(wins) - len(set(wins))
    assert doubled == 0 and len(wins) == final, (
        f"{doubled} expected values were won twice ({len(wins)} wins, counter {final})")


@pytest.mark.emulator
def test_make_config_points_at_the_emulators(make_config, make_stream, kinesis_local, dynamodb):
    stream = make_stream(1)
    config = make_config(stream, max_records=500)
    assert (config.kinesis_endpoint, config.dynamodb_endpoint) == (kinesis_local, dynamodb)
    assert config.stream_name == stream and config.max_records == 500
    assert config.failover_time_ms == 3000 and config.initial_position == "TRIM_HORIZON"


@pytest.mark.unit
def test_aws_env_sets_dummy_credentials_and_region(aws_env):
    session = boto3.session.Session()
    assert session.region_name == "us-east-1"
    assert session.get_credentials().access_key == aws_env["AWS_ACCESS_KEY_ID"]
    assert "AWS_ENDPOINT_URL_KINESIS" not in os.environ


@pytest.mark.emulator
@pytest.mark.parametrize("kind", ["kinesis-local", "kinesalite", "dynalite", "moto"])
def test_emulators_listen_on_loopback_only(kind):
    with Emulator(kind) as emulator:
        listening = _listening_addresses(emulator.pid)
        assert listening, f"{kind} listens on nothing"
        assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening
        assert emulator.port in {port for _, port in listening}
        if kind == "kinesis-local":
            assert len(listening) == 2  # plain HTTP and TLS


@pytest.mark.emulator
def test_stop_kills_the_emulator_and_is_idempotent():
    emulator = Emulator("kinesis-local").start()
    pid = emulator.pid
    started = time.monotonic()
    emulator.stop()
    assert time.monotonic() - started < 10
    assert not _alive(pid)
    emulator.stop()
    assert emulator.process is None


@pytest.mark.emulator
def test_emulator_exits_when_its_parent_is_killed(tmp_path):
    script = (
        "import sys, time\n"
        "from kinesis_dstream.local import Emulator\n"
        "e = Emulator(sys.argv[1]).start()\n"
        "print(e.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    for kind in ("kinesis-local", "moto"):
        parent = subprocess.Popen([sys.executable, "-c", script, kind], stdout=subprocess.PIPE,
                                  text=True)
        try:
            child = int(parent.stdout.readline())
            assert _alive(child)
        finally:
            reap(parent)
        assert _wait_dead([child], timeout=10) == [], f"{kind} outlived its killed parent"


@pytest.mark.unit
def test_missing_node_modules_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KINESIS_DSTREAM_NODE_MODULES", str(tmp_path))
    with pytest.raises(EmulatorError, match="make setup"):
        Emulator("kinesalite").start()
    monkeypatch.setenv("KINESIS_DSTREAM_NODE_MODULES", str(tmp_path / "absent"))
    with pytest.raises(EmulatorError, match="not a directory"):
        find_node_modules()


@pytest.mark.emulator
def test_local_stack_environment_reaches_both_emulators(monkeypatch):
    with LocalStack("kinesalite", "dynalite") as stack:
        env = stack.environment()
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        kinesis = boto3.client("kinesis")
        ddb = boto3.client("dynamodb")
        assert kinesis.meta.endpoint_url == stack.kinesis.endpoint
        assert kinesis.list_streams()["StreamNames"] == []
        assert ddb.list_tables()["TableNames"] == []
        # dynalite has no CloudWatch: a moto server is started for it
        assert env["AWS_ENDPOINT_URL_CLOUDWATCH"] not in (env["AWS_ENDPOINT_URL_DYNAMODB"],
                                                           env["AWS_ENDPOINT_URL_KINESIS"])
        assert boto3.client("cloudwatch").list_metrics()["Metrics"] == []


# ---- the CLI -------------------------------------------------------------------------------

def _start_cli(*args: str) -> tuple[subprocess.Popen, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    cli = subprocess.Popen([sys.executable, "-m", "kinesis_dstream", "local", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           cwd=REPO)
    exports: dict[str, str] = {}
    while len(exports) < 7:
        line = cli.stdout.readline()
        if not line:
            cli.wait(timeout=10)
            raise AssertionError(f"CLI ended early: {cli.returncode}: {cli.stderr.read()}")
        assert line.startswith("export "), line
        name, _, value = line[len("export "):].strip().partition("=")
        exports[name] = value
    return cli, exports


@pytest.mark.emulator
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_prints_exports_and_stops_cleanly(sig):
    cli, exports = _start_cli()
    try:
        assert set(exports) == {"AWS_ENDPOINT_URL_KINESIS", "AWS_ENDPOINT_URL_DYNAMODB",
                                "AWS_ENDPOINT_URL_CLOUDWATCH", "AWS_DEFAULT_REGION", "AWS_REGION",
                                "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        assert exports["AWS_DEFAULT_REGION"] == exports["AWS_REGION"] == "us-east-1"
        children = _children(cli.pid)
        assert len(children) == 2

        kinesis = emulators.client("kinesis", exports["AWS_ENDPOINT_URL_KINESIS"])
        stream = emulators.unique_name("cli")
        kinesis.create_stream(StreamName=stream, ShardCount=1)
        emulators.wait_stream_active(kinesis, stream)
        ddb = emulators.client("dynamodb", exports["AWS_ENDPOINT_URL_DYNAMODB"])
        assert ddb.list_tables()["TableNames"] == []
        assert exports["AWS_ENDPOINT_URL_CLOUDWATCH"] == exports["AWS_ENDPOINT_URL_DYNAMODB"]
        cloudwatch = emulators.client("cloudwatch", exports["AWS_ENDPOINT_URL_CLOUDWATCH"])
        assert cloudwatch.list_metrics()["Metrics"] == []

        cli.send_signal(sig)
        assert cli.wait(timeout=20) == 0
        assert _wait_dead(children, timeout=5) == []
    finally:
        reap(cli)


@pytest.mark.emulator
def test_cli_with_kinesalite_and_dynalite():
    cli, exports = _start_cli("--kinesis", "kinesalite", "--dynamodb", "dynalite")
    try:
        children = _children(cli.pid)
        assert len(children) == 3  # kinesalite, dynalite and moto for CloudWatch
        kinesis = emulators.client("kinesis", exports["AWS_ENDPOINT_URL_KINESIS"])
        assert kinesis.list_streams()["StreamNames"] == []
        cloudwatch = emulators.client("cloudwatch", exports["AWS_ENDPOINT_URL_CLOUDWATCH"])
        assert cloudwatch.list_metrics()["Metrics"] == []
        cli.terminate()
        assert cli.wait(timeout=20) == 0
        assert _wait_dead(children, timeout=5) == []
    finally:
        reap(cli)


# ---- the fault proxy -----------------------------------------------------------------------

def _no_retry_client(endpoint: str):
    return boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="y",
                        config=botocore.config.Config(retries={"total_max_attempts": 1}))


@pytest.mark.emulator
def test_fault_proxy_throttles_the_configured_share_of_get_records(make_stream, put_records,
                                                                   make_fault_proxy):
    stream = make_stream(1)
    put_records(stream, [b"a", b"b"])
    proxy = make_fault_proxy(share=1.0, seed=1)
    kinesis = _no_retry_client(proxy.endpoint)
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    for _ in range(3):
        with pytest.raises(kinesis.exceptions.ProvisionedThroughputExceededException):
            kinesis.get_records(ShardIterator=iterator)
    assert proxy.injected == 3 and proxy.get_records_forwarded == 0

    proxy.share = 0.0
    assert [r["Data"] for r in kinesis.get_records(ShardIterator=iterator)["Records"]] == [b"a", b"b"]
    assert proxy.get_records_forwarded == 1 and proxy.injected == 3

    proxy.share = 0.5
    proxy.max_injections = 10
    outcomes = []
    for _ in range(40):
        try:
            kinesis.get_records(ShardIterator=iterator)
            outcomes.append("ok")
        except kinesis.exceptions.ProvisionedThroughputExceededException:
            outcomes.append("throttled")
    assert outcomes.count("throttled") == proxy.injected - 3 == 7  # capped at 10 in all
    assert outcomes.count("ok") == 33


@pytest.mark.emulator
def test_fault_proxy_stops(kinesis_local):
    from fault_proxy import FaultProxy

    proxy = FaultProxy(kinesis_local, share=0.0).start()
    endpoint = proxy.endpoint
    assert _no_retry_client(endpoint).list_streams()["StreamNames"] is not None
    proxy.stop()
    with pytest.raises(Exception):  # noqa: B017 - whatever botocore raises for a closed port
        _no_retry_client(endpoint).list_streams()


@pytest.mark.emulator
def test_local_env_points_plain_boto3_clients_at_the_emulators(local_env, make_stream):
    stream = make_stream(1)
    assert stream in boto3.client("kinesis").list_streams()["StreamNames"]
    assert boto3.client("dynamodb").meta.endpoint_url == local_env["AWS_ENDPOINT_URL_DYNAMODB"]
