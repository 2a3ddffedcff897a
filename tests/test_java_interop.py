"""Interop with the real Java KCL 2.5.8 MultiLangDaemon (issue 2, "Interop"), and sharing
with KCL 3.1.3 in its 2.x-compatible mode (issue 15; migration to and from KCL 3 is in
tests/test_kcl3_interop.py).

The Java daemon (tests/java_kcl.py) runs tests/java_child_processor.py per shard; our worker
runs tests/recording_processor.py. Each side appends what it delivered and checkpointed to its
own JSON-lines file, so the tests can tell who delivered what, even after a kill -9.
Endpoints: kinesis-local (the only emulator speaking the Java SDK's HTTP/2) and moto's
DynamoDB. Timings are shortened on both sides alike (failoverTimeMillis = FAILOVER_MS).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import io
import json
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

import emulators
from emulators import Producer, put_batch
from java_kcl import JavaDaemon
from processes import reap
from recording_processor import make_factory, read_events, start_worker
from test_operations_leases import status_shows_every_lease

from kinesis_dstream import cli
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY
from kinesis_dstream.records import ExtendedSequenceNumber
from kinesis_dstream.worker.scheduler import Scheduler

pytestmark = pytest.mark.emulator

FAILOVER_MS = 5000
# Attributes a KCL 2.x writer puts on an item only in some states: resharding
# (parentShardId, childShardIds) and a two-phase checkpoint (pendingCheckpoint*).
STATE_DEPENDENT = {"parentShardId", "childShardIds", "pendingCheckpoint",
                   "pendingCheckpointSubSequenceNumber", "pendingCheckpointState"}


# -- helpers ---------------------------------------------------------------------------------

def java_daemon(tmp_path: Path, name: str, stream: str, application: str, kinesis_local: str,
                dynamodb: str, worker_id: str, **extra: Any) -> JavaDaemon:
    return JavaDaemon(tmp_path, name=name, stream=stream, application=application,
                      kinesis_endpoint=kinesis_local, dynamodb_endpoint=dynamodb,
                      region=DUMMY_REGION, access_key_id=DUMMY_ACCESS_KEY_ID,
                      secret_key=DUMMY_SECRET_ACCESS_KEY, worker_id=worker_id,
                      failover_time_ms=FAILOVER_MS, **extra)


def start_our_worker(config: ConsumerConfig, events_path: Path, tmp_path: Path) -> subprocess.Popen:
    return start_worker(config, events_path, tmp_path, "ours")


def scan(dynamodb: str, table: str) -> list[dict[str, Any]]:
    return emulators.client("dynamodb", dynamodb).scan(TableName=table, ConsistentRead=True)["Items"]


def owners(dynamodb: str, table: str) -> dict[str, str | None]:
    try:
        items = scan(dynamodb, table)
    except Exception:  # noqa: BLE001 - the table may not exist yet
        return {}
    return {item["leaseKey"]["S"]: item.get("leaseOwner", {}).get("S") for item in items}


def wait_for(predicate: Callable[[], bool], timeout: float, what: str,
             on_timeout: Callable[[], str] = lambda: "", interval: float = 0.25) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{on_timeout()}")


def records_of(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "record"]


def esn(event: dict) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(event["seq"], event.get("sub") or 0)


def type_map(items: list[dict[str, Any]]) -> dict[str, str]:
    """attribute name -> DynamoDB type, over all items; a name with two types fails."""
    types: dict[str, set[str]] = {}
    for item in items:
        for name, value in item.items():
            types.setdefault(name, set()).update(value)
    mixed = {name: kinds for name, kinds in types.items() if len(kinds) > 1}
    assert not mixed, f"attributes with more than one type: {mixed}"
    return {name: next(iter(kinds)) for name, kinds in types.items()}


def all_checkpointed(dynamodb: str, table: str, n_shards: int) -> bool:
    try:
        items = scan(dynamodb, table)
    except Exception:  # noqa: BLE001 - not created yet
        return False
    return len(items) == n_shards and all(
        item.get("checkpoint", {}).get("S", "").isdigit() and "leaseOwner" in item for item in items)


# KCL 3.x shares a table with 2.x-protocol workers only in this mode; in its default mode
# its leader never takes a lease back from them (README, "KCL compatibility").
KCL3_COMPATIBLE = {"kcl": 3, "clientVersionConfig": "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X"}


def start_shared_run(kinesis_local: str, dynamodb: str, make_stream, make_config, tmp_path: Path,
                     **java_extra: Any):
    """A 4-shard stream with 400 records, our worker process started first, then a Java daemon
    on the same lease table; also returns two functions for failure messages and deliveries."""
    stream = make_stream(4)
    expected = put_batch(kinesis_local, stream, "before", 400)
    tag = uuid.uuid4().hex[:6]
    our_id, java_id = f"ours-{tag}", f"java-{tag}"
    config = make_config(stream, failover_time_ms=FAILOVER_MS, worker_id=our_id)
    table_name = config.application_name
    our_events = tmp_path / "ours.events.jsonl"
    ours = start_our_worker(config, our_events, tmp_path)
    java = java_daemon(tmp_path, "java", stream, table_name, kinesis_local, dynamodb, java_id,
                       **java_extra)

    def logs() -> str:
        ours_log = (tmp_path / "ours.stderr").read_text(errors="replace")[-4000:]
        return f"owners: {owners(dynamodb, table_name)}\n--- ours.stderr ---\n{ours_log}\n{java.log_tail()}"

    def delivered() -> list[dict]:
        return (records_of(read_events(str(our_events)))
                + records_of(read_events(str(java.events_path))))

    return (stream, expected, our_id, java_id, config, table_name, our_events, ours, java, logs,
            delivered)


def reset_while_java_runs(java: JavaDaemon, app: str, stream: str, kinesis: str,
                          dynamodb: str) -> None:
    """``leases reset`` while the Java KCL 2.5.8 daemon holds every lease (issue 26): one
    shard back to a sequence number (``SEQ``: read again after it), another to a time between
    two puts (written ``SEQ/-1``, the first record at or after it, which the Java worker opens
    with AT_SEQUENCE_NUMBER and delivers). A --dry-run first changes no owner or checkpoint.
    Reading resumes there, every record from there comes again, and over three more
    checkpoints per shard the table never holds a position the daemon had before."""
    def events() -> list[dict]:
        return read_events(str(java.events_path))

    def table() -> dict[str, dict]:
        return {item["leaseKey"]["S"]: item for item in scan(dynamodb, app)}

    def cli_json(*argv: str) -> dict:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["leases", "reset", "--app", app, "--stream", stream, "--json",
                             "--kinesis-endpoint", kinesis, "--dynamodb-endpoint", dynamodb,
                             *argv])
        assert code == 0, out.getvalue()
        return json.loads(out.getvalue())

    first = records_of(events())
    by_shard: dict[str, list[dict]] = {}
    for event in first:
        by_shard.setdefault(event["shard"], []).append(event)
    shard_a, shard_b = sorted(s for s, got in by_shard.items() if len(got) >= 3)[:2]
    moment = time.time()
    time.sleep(1.2)
    later = emulators.put_records(kinesis, stream, [(f"pk-{i}", f"late-{i}") for i in range(40)])
    wait_for(lambda: {e["data"] for e in records_of(events())} >= {p.data.decode() for p in later},
             30, "the Java daemon to read the second put", java.log_tail)
    wait_for(lambda: all(table()[s]["checkpoint"]["S"] == max(
        (p.sequence_number for p in later if p.shard_id == s), key=int,
        default=table()[s]["checkpoint"]["S"]) for s in (shard_a, shard_b)), 30,
        "the Java daemon to checkpoint the second put")
    held = {key: (item.get("leaseOwner"), item["checkpoint"]) for key, item in table().items()}
    assert not any(m["written"] for m in cli_json("--all", "--to", "TRIM_HORIZON", "--dry-run")[
        "leases"])
    assert {key: (item.get("leaseOwner"), item["checkpoint"])
            for key, item in table().items()} == held
    mark = len(events())
    old = {s: ExtendedSequenceNumber(table()[s]["checkpoint"]["S"],
                                     int(table()[s]["checkpointSubSequenceNumber"]["N"]))
           for s in (shard_a, shard_b)}
    target = sorted(by_shard[shard_a], key=lambda e: int(e["seq"]))[1]
    at = _dt.datetime.fromtimestamp(moment, tz=_dt.timezone.utc).isoformat()
    samples: list[tuple[str, str, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for key, item in table().items():
                if key in (shard_a, shard_b):
                    samples.append((key, item["checkpoint"]["S"],
                                    int(item["checkpointSubSequenceNumber"]["N"])))
            time.sleep(0.1)

    assert cli_json("--shard", shard_a, "--to", target["seq"])["leases"][0]["written"]
    (moved,) = cli_json("--shard", shard_b, "--to", f"AT_TIMESTAMP:{at}")["leases"]
    assert moved["written"]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    first_b = min((p for p in later if p.shard_id == shard_b), key=lambda p: int(p.sequence_number))
    assert moved["checkpoint_after"] == {"sequence_number": first_b.sequence_number,
                                         "sub_sequence_number": -1}
    expected = {
        shard_a: {e["data"] for e in by_shard[shard_a] if int(e["seq"]) > int(target["seq"])}
        | {p.data.decode() for p in later if p.shard_id == shard_a},
        shard_b: {p.data.decode() for p in later if p.shard_id == shard_b}}

    def again() -> dict[str, set[str]]:
        seen: dict[str, set[str]] = {shard_a: set(), shard_b: set()}
        for e in records_of(events()[mark:]):
            if e["shard"] in seen:
                seen[e["shard"]].add(e["data"])
        return seen

    try:
        wait_for(lambda: all(again()[s] >= expected[s] for s in expected), 60,
                 "the Java daemon to read again from the new positions", java.log_tail)
        for wave in range(3):
            extra = emulators.put_records(kinesis, stream,
                                          [(f"pk-{i}", f"w{wave}-{i}") for i in range(40)])
            for s in expected:
                expected[s] |= {p.data.decode() for p in extra if p.shard_id == s}
            wait_for(lambda: all(again()[s] >= expected[s] for s in expected), 30,
                     f"wave {wave}", java.log_tail)
        time.sleep(0.5)
    finally:
        stop.set()
        sampler.join(timeout=10)
    after = events()[mark:]
    starts = {(e["shard"], e["seq"], e["sub"]) for e in after if e["event"] == "initialize"}
    assert (shard_a, target["seq"], 0) in starts and (
        shard_b, first_b.sequence_number, -1) in starts, starts
    assert again() == expected
    written = {(e["shard"], e["seq"], e["sub"]) for e in after if e["event"] == "checkpoint"}
    resets = {(shard_a, target["seq"], 0), (shard_b, first_b.sequence_number, -1)}
    assert samples
    for key, seq, sub in samples:
        assert (key, seq, sub) in written | resets, (key, seq, sub, old[key])
    for s in expected:
        assert sum(1 for e in after if e["event"] == "checkpoint" and e["shard"] == s) >= 4


# -- 1. lease item format ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(210)
def test_our_lease_items_carry_the_java_kcl_attribute_names_and_types(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, tmp_path):
    java_stream, our_stream = make_stream(4), make_stream(4)
    for stream in (java_stream, our_stream):
        put_batch(kinesis_local, stream, "fmt", 40)
    java_app = emulators.unique_name("app-java-fmt")
    ddb = emulators.client("dynamodb", dynamodb)
    java = java_daemon(tmp_path, "java", java_stream, java_app, kinesis_local, dynamodb, "java-fmt")
    config = make_config(our_stream, failover_time_ms=FAILOVER_MS, worker_id="ours-fmt")
    scheduler = Scheduler(config, make_factory(str(tmp_path / "ours.events.jsonl")))
    try:
        java.start()  # it alone creates its table and leases (slow: 1-30 s random wait)
        scheduler.start()
        wait_for(lambda: all_checkpointed(dynamodb, config.application_name, 4), 30,
                 "our worker to checkpoint every shard")
        wait_for(lambda: all_checkpointed(dynamodb, java_app, 4), 90,
                 "the Java daemon to checkpoint every shard", java.log_tail)
        # leases status on both tables, their workers running (issue 26)
        status_shows_every_lease(java_app, java_stream, kinesis_local, dynamodb)
        status_shows_every_lease(config.application_name, our_stream, kinesis_local, dynamodb)
        reset_while_java_runs(java, java_app, java_stream, kinesis_local, dynamodb)
        java_items, our_items = scan(dynamodb, java_app), scan(dynamodb, config.application_name)
        java_table = ddb.describe_table(TableName=java_app)["Table"]
        our_table = ddb.describe_table(TableName=config.application_name)["Table"]
    finally:
        scheduler.shutdown(timeout_s=10)
        java.stop()
        try:
            ddb.delete_table(TableName=java_app)
        except ddb.exceptions.ResourceNotFoundException:
            pass

    java_types, our_types = type_map(java_items), type_map(our_items)
    differ = {name: (java_types.get(name), our_types.get(name))
              for name in set(java_types) | set(our_types)
              if name not in STATE_DEPENDENT and java_types.get(name) != our_types.get(name)}
    assert not differ, f"attribute name -> (Java type, our type) that differ: {differ}"
    print(f"lease attributes, Java == ours: {dict(sorted(java_types.items()))}")
    # Item by item too: every lease of ours has exactly the attributes a Java lease has.
    java_names = {frozenset(item) - STATE_DEPENDENT for item in java_items}
    our_names = {frozenset(item) - STATE_DEPENDENT for item in our_items}
    assert our_names == java_names, f"per-item attribute sets: Java {java_names}, ours {our_names}"
    # Same stream layout, so the values that do not depend on timing must be equal.
    by_key = {item["leaseKey"]["S"]: item for item in java_items}
    for item in our_items:
        twin = by_key[item["leaseKey"]["S"]]
        for name in ("startingHashKey", "endingHashKey"):
            assert item[name] == twin[name], f"{item['leaseKey']['S']} {name}"
        assert item["ownerSwitchesSinceCheckpoint"] == twin["ownerSwitchesSinceCheckpoint"] == {"N": "0"}
        assert item["checkpointSubSequenceNumber"] == twin["checkpointSubSequenceNumber"] == {"N": "0"}
    assert our_table["KeySchema"] == java_table["KeySchema"] == [
        {"AttributeName": "leaseKey", "KeyType": "HASH"}]
    assert our_table["AttributeDefinitions"] == java_table["AttributeDefinitions"]
    assert (our_table["BillingModeSummary"]["BillingMode"]
            == java_table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST")
    assert not our_table.get("GlobalSecondaryIndexes") and not java_table.get("GlobalSecondaryIndexes")
    assert not our_table.get("LocalSecondaryIndexes") and not java_table.get("LocalSecondaryIndexes")


# -- 2 + 3. one lease table, shared; kill -9 either side ---------------------------------------

@pytest.mark.slow  # 50-70 s each
@pytest.mark.timeout(240)
@pytest.mark.parametrize("killed, java_extra", [
    ("java", {}), ("ours", {}),
    ("java", KCL3_COMPATIBLE),  # KCL 3.1.3 in compatibility mode: the same split and takeover
], ids=["java-killed", "ours-killed", "kcl3-compatible-killed"])
def test_ours_and_java_share_shards_and_take_over_from_checkpoints_after_kill_9(
        killed, java_extra, aws_env, kinesis_local, dynamodb, make_stream, make_config, tmp_path):
    (stream, expected, our_id, java_id, config, table_name, our_events, ours, java, logs,
     delivered) = start_shared_run(kinesis_local, dynamodb, make_stream, make_config, tmp_path,
                                   **java_extra)

    try:
        # Ours creates the table and leases and takes all four; then the Java daemon joins.
        wait_for(lambda: list(owners(dynamodb, table_name).values()) == [our_id] * 4, 30,
                 "our worker to own all four leases", logs)
        java.start()
        # Records keep coming while the Java daemon steals: steals land mid-batch and
        # mid-checkpoint, as they do in production.
        with Producer(kinesis_local, stream, "during-split") as producer:
            split = wait_for(
                lambda: sorted(owners(dynamodb, table_name).values()) == sorted(
                    [our_id, our_id, java_id, java_id]),
                120, "a 2/2 split between our worker and the Java daemon", logs)
        expected.update(producer.sent)
        expected.update(put_batch(kinesis_local, stream, "shared", 400))
        wait_for(lambda: {e["data"] for e in delivered()} >= set(expected), 30,
                 "every record while sharing", logs)
        # No stealing back and forth: the split holds over a full Java taker period.
        held = owners(dynamodb, table_name)
        stable_until = time.monotonic() + 2 * FAILOVER_MS / 1000 + 1
        while time.monotonic() < stable_until:
            assert owners(dynamodb, table_name) == held, f"ownership moved after the split\n{logs()}"
            time.sleep(0.5)
        java_shards = {shard for shard, owner in held.items() if owner == java_id}
        assert {e["shard"] for e in records_of(read_events(str(java.events_path)))} >= java_shards

        # kill -9 one side while records keep coming.
        victim_id, survivor_id = (java_id, our_id) if killed == "java" else (our_id, java_id)
        victim_events = java.events_path if killed == "java" else our_events
        survivor_events = our_events if killed == "java" else java.events_path
        expected.update(put_batch(kinesis_local, stream, "prekill", 200))
        time.sleep(0.5)
        if killed == "java":
            java.kill()
        else:
            ours.send_signal(signal.SIGKILL)
            ours.wait(timeout=10)
        expected.update(put_batch(kinesis_local, stream, "postkill", 200))
        takeover = wait_for(lambda: set(owners(dynamodb, table_name).values()) == {survivor_id}, 45,
                            f"{survivor_id} to own every lease", logs)
        wait_for(lambda: {e["data"] for e in delivered()} >= set(expected), 30,
                 "every record after the takeover", logs)
    finally:
        java.stop()
        reap(ours)

    # Nothing lost, keys intact.
    everything = delivered()
    assert {e["data"]: e["pk"] for e in everything} == expected

    # The survivor restarted each of the victim's shards from the victim's last checkpoint:
    # no record at or before it came again; only records after it may repeat.
    victim_log, survivor_log = read_events(str(victim_events)), read_events(str(survivor_events))
    victim_checkpoints: dict[str, ExtendedSequenceNumber] = {}
    for e in victim_log:
        if e["event"] == "checkpoint":
            victim_checkpoints[e["shard"]] = max(victim_checkpoints.get(e["shard"], esn(e)), esn(e))
    victim_shards = {shard for shard, owner in held.items() if owner == victim_id}
    assert victim_shards and victim_shards <= set(victim_checkpoints), victim_checkpoints
    for shard in victim_shards:
        last_init = max(i for i, e in enumerate(survivor_log)
                        if e["event"] == "initialize" and e["shard"] == shard)
        start = esn(survivor_log[last_init])
        assert start >= victim_checkpoints[shard], (
            f"{shard}: {survivor_id} started at {start}, before {victim_id}'s checkpoint "
            f"{victim_checkpoints[shard]}")
        after = [e for e in survivor_log[last_init:] if e["event"] == "record" and e["shard"] == shard]
        assert after, f"{survivor_id} delivered nothing on {shard} after taking it over"
        early = [e for e in after if esn(e) <= victim_checkpoints[shard]]
        assert not early, f"{shard}: re-delivered at or before the checkpoint: {early[:3]}"
    print(f"2/2 split {split:.1f} s after the Java daemon started; "
          f"{survivor_id} owned every lease {takeover:.1f} s after the kill of {victim_id}")


# -- 4. graceful stop of ours: leases released, taken by the Java daemon at once ----------------

TOOK = re.compile(r"Worker (\S+) successfully took (\d+) leases: (.*)")


@pytest.mark.timeout(180)
def test_sigterm_of_our_worker_releases_its_leases_and_java_takes_all_of_them_at_once(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, tmp_path):
    """Released, not expired: the Java taker treats an unowned lease it has not seen before
    as never renewed (DynamoDBLeaseTaker.updateAllLeases), so its first taker pass takes all
    four. Leases left owned (the Java KCL's own graceful stop, or a kill -9) are treated as
    just renewed: that pass could steal one at most, the rest only after failoverTimeMillis
    and another taker pass (about 2 x failover later)."""
    (stream, expected, our_id, java_id, config, table_name, our_events, ours, java, logs,
     delivered) = start_shared_run(kinesis_local, dynamodb, make_stream, make_config, tmp_path)

    def java_takes() -> list[tuple[int, list[str]]]:
        text = java.stdout_path.read_text(errors="replace") + java.stderr_path.read_text(errors="replace") \
            if java.stdout_path.exists() and java.stderr_path.exists() else ""
        return [(int(m.group(2)), re.findall(r"shardId-\d+", m.group(3)))
                for m in TOOK.finditer(text) if m.group(1) == java_id]

    try:
        wait_for(lambda: list(owners(dynamodb, table_name).values()) == [our_id] * 4, 30,
                 "our worker to own all four leases", logs)
        wait_for(lambda: {e["data"] for e in delivered()} >= set(expected)
                 and all_checkpointed(dynamodb, table_name, 4), 30,
                 "our worker to process and checkpoint every record", logs)
        ours.send_signal(signal.SIGTERM)
        assert ours.wait(timeout=config.shutdown_grace_ms / 1000 + 15) == 0, logs()
        released = scan(dynamodb, table_name)
        expected.update(put_batch(kinesis_local, stream, "after", 200))
        java.start()
        started = time.monotonic()
        takeover = wait_for(lambda: list(owners(dynamodb, table_name).values()) == [java_id] * 4, 60,
                            "the Java daemon to own every lease", logs)
        wait_for(lambda: {e["data"] for e in delivered()} >= set(expected), 30,
                 "every record after the takeover", logs)
        first_take_s = time.monotonic() - started
        takes = java_takes()
    finally:
        java.stop()
        reap(ours)

    # Released: no owner on any lease the moment our worker exited, checkpoints kept.
    our_log = read_events(str(our_events))
    our_checkpoints: dict[str, ExtendedSequenceNumber] = {}
    for e in our_log:
        if e["event"] == "checkpoint":
            our_checkpoints[e["shard"]] = max(our_checkpoints.get(e["shard"], esn(e)), esn(e))
    assert len(released) == 4
    for item in released:
        shard = item["leaseKey"]["S"]
        assert "leaseOwner" not in item, f"{shard} still owned after a graceful stop: {item}"
        assert ExtendedSequenceNumber(item["checkpoint"]["S"],
                                      int(item["checkpointSubSequenceNumber"]["N"])) == our_checkpoints[shard]
    assert sorted(e["shard"] for e in our_log
                  if e["event"] == "shutdown_requested") == sorted(our_checkpoints)

    # Taken at once: the Java daemon's first successful take was all four leases.
    assert takes, f"no 'successfully took' line from {java_id}\n{java.log_tail()}"
    assert takes[0][0] == 4 and len(takes) == 1, f"Java took them in several passes: {takes}"

    # From our checkpoints: nothing at or before them delivered again, nothing lost.
    everything = delivered()
    assert {e["data"]: e["pk"] for e in everything} == expected
    java_log = read_events(str(java.events_path))
    for shard, checkpoint in our_checkpoints.items():
        inits = [esn(e) for e in java_log if e["event"] == "initialize" and e["shard"] == shard]
        assert inits == [checkpoint], f"{shard}: Java started at {inits}, our checkpoint {checkpoint}"
        early = [e for e in records_of(java_log) if e["shard"] == shard and esn(e) <= checkpoint]
        assert not early, f"{shard}: re-delivered at or before our checkpoint: {early[:3]}"
    print(f"Java daemon owned all four released leases {takeover:.1f} s after its start "
          f"(one taker pass: {takes}); every record {first_take_s:.1f} s after its start")
