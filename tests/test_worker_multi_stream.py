"""A multi-stream worker against kinesis-local and moto: streams added and removed while it runs.

The must-show of the multi-stream worker: three streams, one added while it runs and one
removed; every record reaches the processors once; the leases are keyed as the KCL keys them
(``account:stream:creationEpoch:shardId``, with ``streamName`` and ``shardId``); the removed
stream's leases are deleted after the grace period, not before.
"""
from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any

import pytest

import emulators
from test_scheduler import lease_items, wait_for

from kinesis_dstream import cli
from kinesis_dstream.aws.stream_identifier import parse_lease_key
from kinesis_dstream.worker.processor import RecordProcessor
from kinesis_dstream.worker.scheduler import Scheduler
from kinesis_dstream.worker.streams import MultiStreamTracker, StreamConfig

GRACE_MS = 3000


class Recorder(RecordProcessor):
    """Records (stream, data) per record; the stream as the lease key and initialize name it."""

    def __init__(self, seen: list, inits: list, lease_key: str, lock: threading.Lock):
        self.seen, self.inits, self.lease_key, self.lock = seen, inits, lease_key, lock

    def initialize(self, i) -> None:
        with self.lock:
            self.inits.append((self.lease_key, i.shard_id, i.stream_identifier))

    def process_records(self, i) -> None:
        stream = parse_lease_key(self.lease_key)[0].stream_name
        with self.lock:
            self.seen.extend((stream, r.binary_data.decode()) for r in i.records)
        i.checkpointer.checkpoint()


def put(endpoint: str, stream: str, prefix: str, count: int) -> set[tuple[str, str]]:
    emulators.put_records(endpoint, stream, [(f"k{i}", f"{prefix}-{i}") for i in range(count)])
    return {(stream, f"{prefix}-{i}") for i in range(count)}


@pytest.mark.emulator
@pytest.mark.timeout(90)
def test_three_streams_one_added_one_removed_every_record_once_kcl_keys_deferred_deletion(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, capsys):
    a, b, c = make_stream(2), make_stream(1), make_stream(2)
    kinesis = emulators.client("kinesis", kinesis_local)
    expected = put(kinesis_local, a, "a1", 20) | put(kinesis_local, b, "b1", 10)
    listed: list[Any] = [StreamConfig(a, initial_position="TRIM_HORIZON"), b]
    seen: list[tuple[str, str]] = []
    inits: list[tuple[str, str, Any]] = []
    lock = threading.Lock()
    config = make_config("unused-in-multi-stream-mode")
    tracker = MultiStreamTracker(lambda: list(listed), stream_check_interval_ms=300,
                                 wait_period_to_delete_former_streams_ms=GRACE_MS)
    scheduler = Scheduler(config, lambda key: Recorder(seen, inits, key, lock), streams=tracker)
    table = config.application_name

    def got() -> set:
        with lock:
            return set(seen)

    try:
        scheduler.start()
        wait_for(lambda: got() >= expected, 30, "the records of the first two streams")

        listed.append(c)  # added while it runs
        expected |= put(kinesis_local, c, "c1", 20) | put(kinesis_local, a, "a2", 10)
        wait_for(lambda: got() >= expected, 30, "the added stream's records")

        # Leases keyed as the KCL keys them, with streamName and shardId.
        items = lease_items(dynamodb, table)
        for name in (a, b, c):
            summary = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
            account = summary["StreamARN"].split(":")[4]
            epoch = int(summary["StreamCreationTimestamp"].timestamp())
            ident = f"{account}:{name}:{epoch}"
            shards = [s["ShardId"] for s in kinesis.list_shards(StreamName=name)["Shards"]]
            for shard in shards:
                item = items[f"{ident}:{shard}"]
                assert item["streamName"] == {"S": ident} and item["shardId"] == {"S": shard}
        assert len(items) == 5
        # The processor learns the stream: factory gets the lease key, initialize the shard
        # id and the stream identifier.
        with lock:
            for key, shard_id, stream in inits:
                assert key == stream.lease_key(shard_id)

        expected |= put(kinesis_local, b, "b2", 10)
        wait_for(lambda: got() >= expected, 30, "the records put before the removal")
        listed.remove(b)
        removed_at = time.monotonic()
        b_keys = {k for k in items if parse_lease_key(k)[0].stream_name == b}
        wait_for(lambda: b_keys.isdisjoint(lease_items(dynamodb, table)), 20,
                 "the removed stream's leases to be deleted")
        assert time.monotonic() - removed_at >= GRACE_MS / 1000.0 * 0.9
        remaining = lease_items(dynamodb, table)
        assert {parse_lease_key(k)[0].stream_name for k in remaining} == {a, c}

        expected |= put(kinesis_local, a, "a3", 5)
        wait_for(lambda: got() >= expected, 30, "records after the removal")
    finally:
        scheduler.shutdown(timeout_s=5)
    counts = collections.Counter(seen)
    assert set(counts) == expected
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1]

    # `leases status` shows the multi-stream keys as stream and shard, with each stream's lag.
    capsys.readouterr()
    assert cli.main(["leases", "status", "--app", table, "--kinesis-endpoint", kinesis_local,
                     "--dynamodb-endpoint", dynamodb, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["shards"]
    assert sorted((row["stream"], row["shard"]) for row in rows) == sorted(
        (parse_lease_key(key)[0].stream_name, parse_lease_key(key)[1]) for key in remaining)
    assert all(row["lag_ms"] is not None for row in rows), rows


@pytest.mark.emulator
@pytest.mark.timeout(90)
def test_fan_out_per_stream_one_consumer_each_every_record_once(
        aws_env, kinesis_local, make_stream, make_config, make_fanout_front):
    """Fan-out in multi-stream mode: the application's consumer registered on each stream,
    every shard read through its own stream's subscription, no GetRecords."""
    streams = [make_stream(1), make_stream(2)]
    front = make_fanout_front(lifetime_s=6.0, heartbeat_s=1)
    expected: set[tuple[str, str]] = set()
    for stream in streams:
        expected |= put(kinesis_local, stream, stream, 20)
    seen: list[tuple[str, str]] = []
    inits: list = []
    lock = threading.Lock()
    config = make_config("unused-in-multi-stream-mode", kinesis_endpoint=front.endpoint,
                         retrieval_mode="FANOUT")
    scheduler = Scheduler(config, lambda key: Recorder(seen, inits, key, lock), streams=streams)
    try:
        scheduler.start()
        wait_for(lambda: set(seen) >= expected, 40, "every record by fan-out")
    finally:
        scheduler.shutdown(timeout_s=5)
    assert set(seen) == expected and len(seen) == len(expected)
    assert front.count("GetRecords") == 0 and front.count("SubscribeToShard") >= 3
    kinesis = emulators.client("kinesis", kinesis_local)
    for stream in streams:
        arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
        consumers = kinesis.list_stream_consumers(StreamARN=arn)["Consumers"]
        assert [c["ConsumerName"] for c in consumers] == [config.application_name]
