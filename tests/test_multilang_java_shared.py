"""One KCL properties file, two MultiLangDaemons, one lease table (issue 4).

The same file (same applicationName, same executableName: tests/java_child_processor.py,
an amazon-kclpy v3 processor that logs every record and checkpoint and checkpoints each
batch) runs under the Java KCL 2.5.8 MultiLangDaemon and under ``python -m kinesis_dstream
multilang``, against kinesis-local and moto's DynamoDB, on a 4-shard stream. Each daemon
picks its own worker id (the file sets none). One JVM start covers both directions:

    ours #1 owns all four -> the Java daemon joins, 2/2 -> kill -9 ours #1 -> Java owns all
    -> ours #2 joins (same file), 2/2 -> kill -9 Java -> ours #2 owns all -> SIGTERM, exit 0.

After each kill: every record is delivered, and the survivor starts each of the victim's
shards at or after the victim's last checkpoint, delivering nothing at or before it again.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

import pytest

import emulators
from emulators import Producer, put_batch
from java_kcl import CHILD
from multilang_shared_helpers import DaemonProcess, write_properties
from recording_processor import read_events

from kinesis_dstream.multilang.java_properties import read_properties_file
from kinesis_dstream.multilang.properties import load_properties
from kinesis_dstream.multilang.property_keys import KNOWN_KEYS
from kinesis_dstream.records import ExtendedSequenceNumber

FAILOVER_MS = 5000


def shared_properties(path: Path, stream: str, app: str, kinesis: str, dynamodb: str) -> Path:
    return write_properties(path, {
        "executableName": f"{sys.executable} {CHILD}",
        "streamName": stream,
        "applicationName": app,
        "AWSCredentialsProvider": "DefaultAWSCredentialsProviderChain",
        "processingLanguage": "python/3",
        "regionName": "us-east-1",
        "initialPositionInStream": "TRIM_HORIZON",
        "kinesisEndpoint": kinesis,
        "dynamoDBEndpoint": dynamodb,
        "metricsLevel": "NONE",
        "retrievalMode": "POLLING",
        "failoverTimeMillis": FAILOVER_MS,
        "shardSyncIntervalMillis": 10000,
        "parentShardPollIntervalMillis": 1000,
        "idleTimeBetweenReadsInMillis": 250,
        "maxRecords": 1000,
        "maxLeasesToStealAtOneTime": 1,
        "shutdownGraceMillis": 5000,
        "timeoutInSeconds": 30,
    })


def owners(dynamodb: str, table: str) -> dict[str, str | None]:
    ddb = emulators.client("dynamodb", dynamodb)
    try:
        items = ddb.scan(TableName=table, ConsistentRead=True)["Items"]
    except ddb.exceptions.ResourceNotFoundException:
        return {}
    return {item["leaseKey"]["S"]: item.get("leaseOwner", {}).get("S") for item in items}


def wait_for(predicate: Callable[[], bool], timeout: float, what: str,
             on_timeout: Callable[[], str]) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{on_timeout()}")


def esn(event: dict) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(event["seq"], event.get("sub") or 0)


def split_two_two(current: dict[str, str | None], first: str) -> str | None:
    """The other owner when ``first`` and one other worker hold two leases each."""
    values = list(current.values())
    others = set(values) - {first}
    if len(values) == 4 and values.count(first) == 2 and len(others) == 1 and None not in others:
        other = others.pop()
        return other if values.count(other) == 2 else None
    return None


def assert_took_over_from_checkpoints(victim: DaemonProcess, survivor: DaemonProcess,
                                      victim_shards: set[str]) -> None:
    victim_log, survivor_log = read_events(str(victim.events_path)), read_events(str(survivor.events_path))
    checkpoints: dict[str, ExtendedSequenceNumber] = {}
    for e in victim_log:
        if e["event"] == "checkpoint":
            checkpoints[e["shard"]] = max(checkpoints.get(e["shard"], esn(e)), esn(e))
    assert victim_shards and victim_shards <= set(checkpoints), (victim_shards, checkpoints)
    for shard in victim_shards:
        inits = [i for i, e in enumerate(survivor_log) if e["event"] == "initialize" and e["shard"] == shard]
        assert inits, f"{survivor.name} never initialized {shard}"
        start = esn(survivor_log[inits[-1]])
        assert start >= checkpoints[shard], (
            f"{shard}: {survivor.name} started at {start}, before {victim.name}'s last checkpoint "
            f"{checkpoints[shard]}")
        after = [e for e in survivor_log[inits[-1]:] if e["event"] == "record" and e["shard"] == shard]
        assert after, f"{survivor.name} delivered nothing on {shard} after taking it over"
        again = [e for e in after if esn(e) <= checkpoints[shard]]
        assert not again, f"{shard}: {survivor.name} re-delivered checkpointed records: {again[:3]}"


@pytest.mark.emulator
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_one_properties_file_java_and_ours_share_shards_and_take_over_both_ways(
        aws_env, kinesis_local, dynamodb, make_stream, unique_app_name, tmp_path):
    stream = make_stream(4)
    app = unique_app_name
    properties = shared_properties(tmp_path / "shared.properties", stream, app, kinesis_local, dynamodb)
    # Every key of the file is one our reader uses (none unknown, none ignored); the Java
    # daemon has a setter for each (MultiLangDaemonConfiguration of KCL 2.5.8).
    assert set(read_properties_file(properties)) <= KNOWN_KEYS
    assert load_properties(properties).ignored_keys == ()
    expected = put_batch(kinesis_local, stream, "before", 400)
    started: list[DaemonProcess] = []

    def daemon(kind: str, name: str) -> DaemonProcess:
        started.append(DaemonProcess(kind, properties, tmp_path, name))
        return started[-1]

    def delivered() -> list[dict]:
        return [e for d in started for e in read_events(str(d.events_path)) if e["event"] == "record"]

    def logs() -> str:
        return f"owners: {owners(dynamodb, app)}\n" + "\n".join(d.log() for d in started)

    def all_delivered() -> bool:
        return {e["data"] for e in delivered()} >= set(expected)

    try:
        # 1. Ours alone creates the table and leases and takes all four.
        ours1 = daemon("ours", "ours1")
        wait_for(lambda: len(set(owners(dynamodb, app).values()) - {None}) == 1
                 and len(owners(dynamodb, app)) == 4 and None not in owners(dynamodb, app).values(),
                 30, "our daemon to own all four leases", logs)
        ours1_id = next(iter(owners(dynamodb, app).values()))
        wait_for(all_delivered, 30, "the first records through our daemon", logs)

        # 2. The Java daemon, same file, joins and steals two while records keep coming.
        java = daemon("java", "java")
        java_id: list[str] = []

        def java_split() -> bool:
            other = split_two_two(owners(dynamodb, app), ours1_id)
            if other:
                java_id[:] = [other]
            return other is not None

        with Producer(kinesis_local, stream, "during-split1") as producer:
            split1 = wait_for(java_split, 150, "a 2/2 split between ours and the Java daemon", logs)
        expected.update(producer.sent)
        expected.update(put_batch(kinesis_local, stream, "shared1", 200))
        wait_for(all_delivered, 40, "every record while sharing (1)", logs)
        # Records put now land on the Java daemon's shards too: its children deliver them.
        java_shards = {s for s, o in owners(dynamodb, app).items() if o == java_id[0]}
        expected.update(put_batch(kinesis_local, stream, "shared1b", 100))
        wait_for(lambda: {e["shard"] for e in read_events(str(java.events_path))
                          if e["event"] == "record"} >= java_shards, 40,
                 f"the Java daemon's children to deliver on {java_shards}", logs)

        # 3. kill -9 ours #1: the Java daemon takes its shards from its checkpoints.
        expected.update(put_batch(kinesis_local, stream, "prekill1", 200))
        time.sleep(0.5)
        held = owners(dynamodb, app)
        ours1.kill()
        expected.update(put_batch(kinesis_local, stream, "postkill1", 200))
        takeover1 = wait_for(lambda: set(owners(dynamodb, app).values()) == {java_id[0]}, 60,
                             "the Java daemon to own every lease", logs)
        wait_for(all_delivered, 40, "every record after the Java daemon took over", logs)
        assert_took_over_from_checkpoints(ours1, java, {s for s, o in held.items() if o == ours1_id})

        # 4. Ours #2, same file again, joins the Java daemon: 2/2.
        ours2 = daemon("ours", "ours2")
        ours2_id: list[str] = []

        def ours_split() -> bool:
            other = split_two_two(owners(dynamodb, app), java_id[0])
            if other:
                ours2_id[:] = [other]
            return other is not None

        with Producer(kinesis_local, stream, "during-split2") as producer:
            split2 = wait_for(ours_split, 60, "a 2/2 split between the Java daemon and ours #2", logs)
        expected.update(producer.sent)
        expected.update(put_batch(kinesis_local, stream, "shared2", 200))
        wait_for(all_delivered, 40, "every record while sharing (2)", logs)

        # 5. kill -9 the Java daemon: ours #2 takes its shards from its checkpoints.
        expected.update(put_batch(kinesis_local, stream, "prekill2", 200))
        time.sleep(0.5)
        held = owners(dynamodb, app)
        java.kill()
        expected.update(put_batch(kinesis_local, stream, "postkill2", 200))
        takeover2 = wait_for(lambda: set(owners(dynamodb, app).values()) == {ours2_id[0]}, 45,
                             "our daemon to own every lease", logs)
        wait_for(all_delivered, 40, "every record after our daemon took over", logs)
        assert_took_over_from_checkpoints(java, ours2, {s for s, o in held.items() if o == java_id[0]})

        # Graceful stop of ours #2: exit 0, leases released.
        assert ours2.terminate() == 0, ours2.log()
        assert set(owners(dynamodb, app).values()) == {None}
    finally:
        for d in started:
            d.close()

    everything = delivered()
    assert {e["data"]: e["pk"] for e in everything} == expected  # nothing lost, keys intact
    for d in started:
        text = d.log_path.read_text(errors="replace")
        if d.kind == "ours":
            assert "unknown property" not in text, d.log()
    assert ours1_id != ours2_id[0] != java_id[0]
    print(f"split 1 (Java joins ours) {split1:.1f} s; Java owned all {takeover1:.1f} s after kill -9 "
          f"of ours; split 2 (ours joins Java) {split2:.1f} s; ours owned all {takeover2:.1f} s "
          f"after kill -9 of Java")



@pytest.mark.unit
def test_an_interpreter_symlink_in_executable_name_is_run_as_written(tmp_path):
    """A venv's bin/python is a symlink; resolving it would run the base interpreter,
    without the venv's amazon_kclpy. The Java daemon runs the path as written; so do we."""
    target = tmp_path / "real-python"
    target.write_text("#!/bin/sh\n")
    link = tmp_path / "venv-python"
    link.symlink_to(target)
    path = write_properties(tmp_path / "p.properties", {
        "executableName": f"{link} {CHILD}", "streamName": "s", "applicationName": "a"})
    assert load_properties(path).command == (str(link), str(CHILD))
