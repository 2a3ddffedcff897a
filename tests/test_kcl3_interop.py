"""KCL 3.x tables (issue 15): migration between the real KCL 3.1.3 MultiLangDaemon and our
worker, both ways, on one lease table; and KCL 3's properties keys.

The KCL 3.1.3 jars come from the kclpy-ext wheel that `make setup` installs into .kcl3/
(tests/java_kcl.py, ``kcl=3``). Sharing a table side by side with KCL 3 in its 2.x-compatible
mode is one case of tests/test_java_interop.py. Endpoints: kinesis-local (the Java SDK's HTTP/2)
and moto's DynamoDB. A migration here is what a team does: stop one fleet (SIGTERM, graceful),
start the other on the same application name.
"""
from __future__ import annotations

import re
import signal
import subprocess
import uuid

import pytest

import emulators
from emulators import put_batch
from java_kcl import kcl3_jars
from processes import reap
from recording_processor import read_events, start_worker
from test_java_interop import FAILOVER_MS, esn, java_daemon, owners, records_of, scan, wait_for
from test_operations_leases import status_shows_every_lease

from kinesis_dstream.multilang.property_keys import KNOWN_KEYS, canonical_key
from kinesis_dstream.records import ExtendedSequenceNumber

pytestmark = pytest.mark.emulator

# KCL 3.5's single-table format: items that are not leases, in the lease table.
KCL35_ITEMS = [
    {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "COORDINATOR_STATE"},
     "cv": {"S": "CLIENT_VERSION_3X"}},
    {"leaseKey": {"S": "WorkerMetricStats#kcl3-old"}, "entityType": {"S": "WORKER_METRICS"},
     "wid": {"S": "kcl3-old"}, "leaseCounter": {"N": "7"}},
]


def test_every_kcl3_multilang_setting_is_a_key_we_accept(tmp_path):
    """The bean properties of KCL 3.1.3's MultiLangDaemonConfiguration, read from its jar."""
    jars = kcl3_jars()
    out = subprocess.run(["javap", "-cp", f"{jars}/*",
                          "software.amazon.kinesis.multilang.config.MultiLangDaemonConfiguration"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    setters = set(re.findall(r"public void set(\w+)\(", out))
    assert len(setters) > 70, out[:2000]
    keys = {name if name[:2].isupper() else name[0].lower() + name[1:] for name in setters}
    missing = {key for key in keys if canonical_key(key) not in KNOWN_KEYS}
    assert not missing, f"KCL 3.1.3 keys our properties reader would warn about: {sorted(missing)}"


def last_checkpoints(events: list[dict]) -> dict[str, ExtendedSequenceNumber]:
    checkpoints: dict[str, ExtendedSequenceNumber] = {}
    for e in events:
        if e["event"] == "checkpoint":
            checkpoints[e["shard"]] = max(checkpoints.get(e["shard"], esn(e)), esn(e))
    return checkpoints


def assert_resumed_at(checkpoints: dict[str, ExtendedSequenceNumber], events: list[dict],
                      who: str) -> None:
    """``who`` started every shard at (or after) the previous fleet's last checkpoint and
    delivered nothing at or before it again; it delivered something on every shard."""
    assert len(checkpoints) == 4, checkpoints
    for shard, checkpoint in checkpoints.items():
        inits = [esn(e) for e in events if e["event"] == "initialize" and e["shard"] == shard]
        assert inits and min(inits) >= checkpoint, \
            f"{who} {shard}: started at {inits}, checkpoint {checkpoint}"
        again = [e for e in records_of(events) if e["shard"] == shard and esn(e) <= checkpoint]
        assert not again, f"{who} {shard}: re-delivered at or before {checkpoint}: {again[:3]}"
        assert any(e["shard"] == shard for e in records_of(events)), f"{who} read nothing on {shard}"


@pytest.mark.timeout(420)
def test_migration_ours_to_kcl3_and_kcl3_to_ours_keeps_every_checkpoint(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, tmp_path):
    """ours (creates the KCL 2.x table) -> SIGTERM -> KCL 3.1.3, default 3.x mode (upgrades
    the table) -> SIGTERM -> ours again, on a table that also holds KCL 3.5 items."""
    stream = make_stream(4)
    expected = put_batch(kinesis_local, stream, "ours1", 400)
    tag = uuid.uuid4().hex[:6]
    ours_ids = [f"ours-{tag}", f"ours2-{tag}"]
    kcl3_id = f"kcl3-{tag}"
    configs = [make_config(stream, failover_time_ms=FAILOVER_MS, worker_id=i) for i in ours_ids]
    app = configs[0].application_name
    events = [tmp_path / "ours1.events.jsonl", tmp_path / "ours2.events.jsonl"]
    kcl3 = java_daemon(tmp_path, "kcl3", stream, app, kinesis_local, dynamodb, kcl3_id, kcl=3)
    workers: list[subprocess.Popen] = []
    ddb = emulators.client("dynamodb", dynamodb)

    def logs() -> str:
        ours = "".join(f"--- ours{i + 1}.stderr ---\n"
                       + (tmp_path / f"ours{i + 1}.stderr").read_text(errors="replace")[-3000:]
                       for i in range(len(workers)))
        return f"owners: {owners(dynamodb, app)}\n{ours}\n{kcl3.log_tail()}"

    def delivered() -> list[dict]:
        return [e for path in (*events, kcl3.events_path) for e in records_of(read_events(str(path)))]

    def all_delivered() -> bool:
        return {e["data"] for e in delivered()} >= set(expected)

    def owned_by(worker_id: str) -> bool:
        held = owners(dynamodb, app)
        return len(held) == 4 and set(held.values()) == {worker_id}

    try:
        # 1. Ours alone: creates the table, reads and checkpoints everything, stops gracefully.
        workers.append(start_worker(configs[0], events[0], tmp_path, "ours1"))
        wait_for(lambda: owned_by(ours_ids[0]) and all_delivered(), 60, "our worker to read all", logs)
        workers[0].send_signal(signal.SIGTERM)
        assert workers[0].wait(timeout=30) == 0, logs()
        ours_checkpoints = last_checkpoints(read_events(str(events[0])))

        # 2. KCL 3.1.3 in its default mode on our table: takes all four at our checkpoints.
        expected.update(put_batch(kinesis_local, stream, "kcl3", 400))
        kcl3.start()
        wait_for(lambda: owned_by(kcl3_id) and all_delivered(), 180, "KCL 3 to read all", logs)
        status_shows_every_lease(app, stream, kinesis_local, dynamodb)  # KCL 3 running (issue 26)
        kcl3_table = ddb.describe_table(TableName=app)["Table"]
        kcl3_items = scan(dynamodb, app)
        tables = set(ddb.list_tables(Limit=100)["TableNames"])
        assert kcl3.terminate(timeout=60) is not None, logs()
        kcl3_checkpoints = last_checkpoints(read_events(str(kcl3.events_path)))

        # 3. Ours again, on the table KCL 3 upgraded, with KCL 3.5's extra items in it.
        for item in KCL35_ITEMS:
            ddb.put_item(TableName=app, Item=item)
        expected.update(put_batch(kinesis_local, stream, "ours2", 400))
        workers.append(start_worker(configs[1], events[1], tmp_path, "ours2"))
        wait_for(lambda: {s: o for s, o in owners(dynamodb, app).items() if s.startswith("shardId-")}
                 == {s: ours_ids[1] for s in ours_checkpoints} and all_delivered(), 90,
                 "our worker to take every lease back from KCL 3 and read all", logs)
        workers[1].send_signal(signal.SIGTERM)
        assert workers[1].wait(timeout=30) == 0, logs()
        final = {item["leaseKey"]["S"]: item for item in scan(dynamodb, app)}
    finally:
        kcl3.stop()
        for worker in workers:
            reap(worker)

    # What KCL 3 added: a GSI on the lease table, two tables, throughputKBps on leases.
    assert [i["IndexName"] for i in kcl3_table.get("GlobalSecondaryIndexes", [])] == \
        ["LeaseOwnerToLeaseKeyIndex"]
    assert {f"{app}-CoordinatorState", f"{app}-WorkerMetricStats"} <= tables
    print(f"KCL 3 lease attributes: {sorted({name for item in kcl3_items for name in item})}")

    # Both hand-overs kept every checkpoint: nothing lost, nothing at or before it again.
    everything = delivered()
    assert {e["data"]: e["pk"] for e in everything} == expected
    assert_resumed_at(ours_checkpoints, read_events(str(kcl3.events_path)), "KCL 3")
    assert_resumed_at(kcl3_checkpoints, read_events(str(events[1])), "ours #2")
    # KCL 3.5's items: never taken, never written, not counted (ours took all four shards).
    for item in KCL35_ITEMS:
        assert final[item["leaseKey"]["S"]] == item
    assert "Migration3.0" not in (tmp_path / "ours2.stderr").read_text(errors="replace")
    # Our graceful stop released every lease, KCL 3's checkpoint owner gone with it.
    for shard in ours_checkpoints:
        assert "leaseOwner" not in final[shard] and "checkpointOwner" not in final[shard], final[shard]
