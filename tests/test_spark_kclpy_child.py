"""The java-kcl engine's child (``python -m kinesis_dstream.spark.kclpy_child``) without Java.

A scripted daemon writes multilang lines to the child's stdin; a channel server plays the
Spark driver. The driver confirms a position while the child waits for its ack, and the
child must write that checkpoint within the same processRecords callback (the only time the
protocol accepts one); at shutdownRequested it writes what the driver says was processed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.spark import channel, java_engine
from kinesis_dstream.spark.kclpy_child import ARGS_ENV

SHARD = "shardId-000000000000"


def record(seq: str, data: str = "aGVsbG8=") -> dict:
    return {"action": "record", "data": data, "partitionKey": "pk", "sequenceNumber": seq,
            "subSequenceNumber": 0, "approximateArrivalTimestamp": 1700000000123}


def test_child_checkpoints_confirmed_positions_inside_callbacks(tmp_path) -> None:
    got: list[tuple] = []
    lock = threading.Lock()

    def on_message(peer, message):
        with lock:
            got.append(message)
        if message[0] == channel.RECORDS:
            last = message[2][-1]
            peer.send((channel.CHECKPOINT, SHARD, last[2], last[3]))  # the batch completed
            peer.send((channel.ACK, SHARD))
        elif message[0] == channel.DRAIN:
            peer.send((channel.DRAINED, SHARD, "2", 0, True))

    server = channel.ChannelServer(str(tmp_path), on_message, lambda peer: None)
    script = [
        {"action": "initialize", "shardId": SHARD, "sequenceNumber": "TRIM_HORIZON",
         "subSequenceNumber": 0},
        {"action": "processRecords", "records": [record("1"), record("2")],
         "millisBehindLatest": 7},
        {"action": "checkpoint", "sequenceNumber": "2", "subSequenceNumber": 0,
         "error": "IllegalArgumentException"},
        {"action": "shutdownRequested"},
        {"action": "checkpoint", "sequenceNumber": "2", "subSequenceNumber": 0},
        {"action": "leaseLost"},
    ]
    env = dict(os.environ, **{ARGS_ENV: json.dumps(dict(
        address=list(server.address), authkey_file=server.authkey_path, worker_id="daemon-1",
        drain_timeout_s=10))})
    try:
        child = subprocess.run([sys.executable, "-m", "kinesis_dstream.spark.kclpy_child"],
                               input="".join(json.dumps(m) + "\n" for m in script), env=env,
                               capture_output=True, text=True, timeout=60)
        deadline = time.monotonic() + 10  # the driver side reads the last message
        while time.monotonic() < deadline and not any(m[0] == channel.LOST for m in got):
            time.sleep(0.05)
    finally:
        server.close()
    assert child.returncode == 0, child.stderr
    out = [json.loads(line) for line in child.stdout.splitlines() if line.strip()]
    assert out == [
        {"action": "status", "responseFor": "initialize"},
        {"action": "checkpoint", "sequenceNumber": "2", "subSequenceNumber": 0},
        {"action": "status", "responseFor": "processRecords"},
        {"action": "checkpoint", "sequenceNumber": "2", "subSequenceNumber": 0},
        {"action": "status", "responseFor": "shutdownRequested"},
        {"action": "status", "responseFor": "leaseLost"},
    ], child.stderr
    with lock:
        messages = list(got)
    assert messages[0] == (channel.INIT, SHARD, "TRIM_HORIZON", 0)
    assert messages[1] == (channel.RECORDS, SHARD, [(b"hello", "pk", "1", 0, 1700000000123),
                                                    (b"hello", "pk", "2", 0, 1700000000123)], 7)
    # the refused checkpoint is reported, then the drained position is written at shutdown
    assert messages[2:] == [
        (channel.CHECKPOINTED, SHARD, "2", 0, "IllegalArgumentException"),
        (channel.DRAIN, SHARD, "shutdown"),
        (channel.CHECKPOINTED, SHARD, "2", 0, None),
        (channel.LOST, SHARD),
    ]


def test_java_engine_names_a_missing_amazon_kclpy(monkeypatch) -> None:
    monkeypatch.setattr(java_engine.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigurationError, match="amazon_kclpy"):
        java_engine.find_jars()
