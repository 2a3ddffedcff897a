"""createStream's coordinator and a Java KCL 2.5.8 worker on one lease table (issue 15).

A Spark application (tests/spark_driver.py: a real StreamingContext with
kinesis_dstream.KinesisUtils.createStream, master local[2], its own process) and the Java
MultiLangDaemon (tests/java_kcl.py) share a 4-shard stream's shards under one application name,
and take over from each other:

    driver A owns all four -> the Java worker joins, 2/2 -> graceful stop of A: the Java worker
    takes A's released leases at A's last checkpoints -> driver B joins, 2/2 -> kill -9 of the
    Java worker: B takes its shards from its last checkpoints.

Nothing is lost; a record comes twice only when it lies after the last checkpoint of the
worker that lost its shard. kinesis-local (the Java SDK's HTTP/2) and moto's DynamoDB; both
sides use failoverTimeMillis = FAILOVER_MS.
"""
from __future__ import annotations

import signal
import time
import uuid
from collections import Counter

import pytest

from emulators import Producer, put_batch
from recording_processor import read_events
from spark_helpers import leases_at, read_rows, start_driver
from test_java_interop import FAILOVER_MS, esn, java_daemon, records_of, wait_for

from kinesis_dstream.records import ExtendedSequenceNumber

pytestmark = pytest.mark.spark


def owners(dynamodb: str, app: str) -> dict[str, str | None]:
    return {shard: item.get("leaseOwner", {}).get("S") for shard, item in leases_at(dynamodb, app).items()}


def split_with(held: dict[str, str | None], worker: str) -> str | None:
    """The other owner when ``worker`` and one other hold two leases each."""
    counts = Counter(held.values())
    if len(held) == 4 and counts.get(worker) == 2 and len(counts) == 2 and None not in counts:
        return next(owner for owner in counts if owner != worker)
    return None


@pytest.mark.timeout(600)
def test_create_stream_and_a_java_kcl_worker_share_shards_and_take_over_from_each_other(
        aws_env, kinesis_local, dynamodb, make_stream, unique_app_name, tmp_path, monkeypatch):
    monkeypatch.setenv("RECOVERY_FAILOVER_MS", str(FAILOVER_MS))
    stream, app = make_stream(4), unique_app_name
    java_id = f"java-{uuid.uuid4().hex[:6]}"
    java = java_daemon(tmp_path, "java", stream, app, kinesis_local, dynamodb, java_id)
    expected = put_batch(kinesis_local, stream, "a", 400)
    drivers: dict[str, tuple] = {}

    def driver_rows(name: str) -> list[tuple[str, int, int, str]]:
        return read_rows(drivers[name][1]) if name in drivers else []

    def delivered() -> set[str]:
        return ({row[3] for name in drivers for row in driver_rows(name)}
                | {e["data"] for e in records_of(read_events(str(java.events_path)))})

    def all_delivered() -> bool:
        return delivered() >= set(expected)

    def logs() -> str:
        parts = [f"owners: {owners(dynamodb, app)}"]
        for name in drivers:
            parts.append(f"--- driver-{name}.log ---\n"
                         + (tmp_path / f"driver-{name}.log").read_text(errors="replace")[-3000:])
        return "\n".join(parts) + "\n" + java.log_tail()

    def start(name: str):
        drivers[name] = start_driver(tmp_path, name, app, stream, kinesis_local, dynamodb,
                                     checkpoint_interval="1")
        return drivers[name][0]

    try:
        # 1. Driver A alone: creates the table and leases, owns all four, reads everything.
        a = start("a")
        wait_for(lambda: len(owners(dynamodb, app)) == 4 and len(set(owners(dynamodb, app).values())) == 1
                 and None not in owners(dynamodb, app).values() and all_delivered(), 180,
                 "driver A to own every lease and read every record", logs)
        a_id = next(iter(owners(dynamodb, app).values()))

        # 2. The Java worker joins and steals two while records keep coming.
        java.start()
        with Producer(kinesis_local, stream, "split1") as producer:
            wait_for(lambda: split_with(owners(dynamodb, app), a_id) == java_id, 180,
                     "a 2/2 split between driver A and the Java worker", logs)
        expected.update(producer.sent)
        expected.update(put_batch(kinesis_local, stream, "shared1", 200))
        wait_for(all_delivered, 60, "every record while A and Java share", logs)

        # 3. Graceful stop of A, once its checkpoints cover all it read: Java takes A's
        #    released leases there, and nothing of A's comes again.
        a_shards = {s for s, o in owners(dynamodb, app).items() if o == a_id}

        def a_last(shard: str) -> ExtendedSequenceNumber:
            return max(ExtendedSequenceNumber(str(q), u) for s, q, u, _ in driver_rows("a") if s == shard)

        def a_checkpointed() -> bool:
            items = leases_at(dynamodb, app)
            return all(ExtendedSequenceNumber(items[s]["checkpoint"]["S"],
                                              int(items[s]["checkpointSubSequenceNumber"]["N"])) == a_last(s)
                       for s in a_shards)

        wait_for(a_checkpointed, 60, "driver A to checkpoint all it read", logs)
        a_checkpoints = {s: a_last(s) for s in a_shards}
        drivers["a"][2].touch()
        assert a.wait(90) == 0, logs()
        expected.update(put_batch(kinesis_local, stream, "after-a", 200))
        wait_for(lambda: set(owners(dynamodb, app).values()) == {java_id} and all_delivered(), 90,
                 "the Java worker to take A's released leases and read on", logs)
        java_events = read_events(str(java.events_path))
        for shard, checkpoint in a_checkpoints.items():
            inits = [esn(e) for e in java_events if e["event"] == "initialize" and e["shard"] == shard]
            assert inits == [checkpoint], f"{shard}: Java started at {inits}, A's checkpoint {checkpoint}"

        # 4. Driver B joins the Java worker: 2/2 again.
        b = start("b")
        b_id: list[str] = []

        def b_split() -> bool:
            other = split_with(owners(dynamodb, app), java_id)
            b_id[:] = [other] if other else []
            return other is not None and other != a_id

        with Producer(kinesis_local, stream, "split2") as producer:
            wait_for(b_split, 180, "a 2/2 split between the Java worker and driver B", logs)
        expected.update(producer.sent)
        expected.update(put_batch(kinesis_local, stream, "shared2", 200))
        wait_for(all_delivered, 60, "every record while Java and B share", logs)

        # 5. kill -9 of the Java worker while records keep coming: B takes its shards.
        expected.update(put_batch(kinesis_local, stream, "prekill", 200))
        time.sleep(0.5)
        java.kill()
        expected.update(put_batch(kinesis_local, stream, "postkill", 200))
        wait_for(lambda: set(owners(dynamodb, app).values()) == {b_id[0]} and all_delivered(), 120,
                 "driver B to take the Java worker's leases and read every record", logs)
        drivers["b"][2].touch()
        assert b.wait(90) == 0, logs()
    finally:
        java.stop()
        for proc, _, _ in drivers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()

    # Nothing lost.
    assert delivered() == set(expected)
    # A graceful hand-over is exactly once: Java delivered nothing of A's shards at or
    # before A's last checkpoint.
    java_events = read_events(str(java.events_path))
    for shard, checkpoint in a_checkpoints.items():
        again = [e for e in records_of(java_events) if e["shard"] == shard and esn(e) <= checkpoint]
        assert not again, f"{shard}: Java re-delivered A's records: {again[:3]}"
    # What B delivered again of Java's lies after Java's last checkpoint on that shard (Java
    # never got a shard back from B, so its last logged checkpoint is the hand-over's).
    java_checkpoints: dict[str, ExtendedSequenceNumber] = {}
    for e in java_events:
        if e["event"] == "checkpoint":
            java_checkpoints[e["shard"]] = max(java_checkpoints.get(e["shard"], esn(e)), esn(e))
    java_seen = {(e["shard"], esn(e)) for e in records_of(java_events)}
    b_rows = [(s, ExtendedSequenceNumber(str(q), u)) for s, q, u, _ in driver_rows("b")]
    assert {s for s, _ in b_rows} == set(a_checkpoints) | set(java_checkpoints), "B read every shard"
    again = [(s, q) for s, q in b_rows if (s, q) in java_seen and q <= java_checkpoints[s]]
    assert not again, f"B re-delivered records at or before Java's checkpoint: {again[:3]}"
    # Within one driver, each record once.
    for name in drivers:
        twice = [r for r, n in Counter((s, q, u) for s, q, u, _ in driver_rows(name)).items() if n > 1]
        assert not twice, f"driver {name} delivered records twice: {twice[:3]}"
