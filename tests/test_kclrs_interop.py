"""kcl-rs (PyPI ``kcl-rs``, the Rust KCL) and our multi-stream worker share one lease table.

Both read two streams in the KCL's multi-stream mode on kinesis-local and moto (kcl-rs takes
its endpoints from AWS_ENDPOINT_URL_KINESIS / _DYNAMODB). Ours reads first and stops; kcl-rs
takes the table over and resumes at our checkpoints (it reads none of our records again);
then ours takes it back and resumes at kcl-rs's. The stream identifiers kcl-rs is given are
the ones our worker derived (account from the ARN, creation epoch in seconds).
kcl-rs is a KCL 3.x port: its cold start takes tens of seconds (its leader assigns leases).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import emulators
from test_scheduler import item_checkpoint, lease_items, wait_for

from kinesis_dstream.aws.stream_identifier import parse_lease_key
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.worker.processor import RecordProcessor
from kinesis_dstream.worker.scheduler import Scheduler

CHILD = Path(__file__).with_name("kclrs_child.py")


class Ours(RecordProcessor):
    def __init__(self, seen: list, inits: dict, key: str, lock: threading.Lock):
        self.seen, self.inits, self.key, self.lock = seen, inits, key, lock

    def initialize(self, i) -> None:
        with self.lock:
            self.inits[self.key] = ESN(i.sequence_number, i.sub_sequence_number or 0)

    def process_records(self, i) -> None:
        with self.lock:
            self.seen.extend(r.binary_data.decode() for r in i.records)
        i.checkpointer.checkpoint()

    def shutdown_requested(self, i) -> None:
        i.checkpointer.checkpoint()


def put(endpoint: str, streams: list[str], prefix: str, count: int) -> dict[str, str]:
    """data -> (stream key-less) last sequence number per shard is read from the results."""
    placed: dict[str, str] = {}
    for stream in streams:
        for r in emulators.put_records(endpoint, stream,
                                       [(f"k{i}", f"{prefix}-{stream}-{i}") for i in range(count)]):
            placed[r.data.decode()] = r.sequence_number
    return placed


def run_ours(config: Any, streams: list[str], expected: set[str], worker: str
             ) -> tuple[list[str], dict[str, ESN], list[str]]:
    seen: list[str] = []
    inits: dict[str, ESN] = {}
    lock = threading.Lock()
    scheduler = Scheduler(config.replace(worker_id=worker),
                          lambda key: Ours(seen, inits, key, lock), streams=streams)
    try:
        scheduler.start()
        identifiers = [str(i) for i in sorted(scheduler.streams.listed)]
        wait_for(lambda: expected <= set(seen), 60, f"{worker} to read {len(expected)} records")
    finally:
        assert scheduler.shutdown(timeout_s=10)
    return seen, inits, identifiers


def checkpoints(dynamodb: str, table: str) -> dict[str, ESN]:
    return {k: item_checkpoint(v) for k, v in lease_items(dynamodb, table).items()}


def ours_first(kinesis: str, dynamodb: str, make_stream: Any, make_config: Any
               ) -> tuple[list[str], Any, dict[str, str], list[str], dict[str, ESN]]:
    """Two streams (2 and 1 shards) read and checkpointed by our multi-stream worker first:
    the streams, the config, the records put, the stream identifiers, the checkpoints."""
    streams = [make_stream(2), make_stream(1)]
    config = make_config("unused-in-multi-stream-mode")
    first = put(kinesis, streams, "first", 10)
    _, _, identifiers = run_ours(config, streams, set(first), "ours-1")
    ours_done = checkpoints(dynamodb, config.application_name)
    assert len(ours_done) == 3 and all(parse_lease_key(k) for k in ours_done)
    assert all(not c.is_sentinel for c in ours_done.values())
    return streams, config, first, identifiers, ours_done


@pytest.mark.emulator
@pytest.mark.timeout(300)
def test_kclrs_takes_over_our_table_and_we_take_it_back(
        local_env, kinesis_local, dynamodb, make_stream, make_config, tmp_path):
    streams, config, first, identifiers, ours_done = ours_first(
        kinesis_local, dynamodb, make_stream, make_config)
    table = config.application_name

    second = put(kinesis_local, streams, "second", 10)
    out = tmp_path / "kclrs.jsonl"
    child = subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps({"ids": identifiers, "app": table,
                                                 "out": str(out), "worker": "kclrs"})],
        env=dict(os.environ), stderr=open(tmp_path / "kclrs.err", "w"))

    def events() -> list[dict]:
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []

    try:
        wait_for(lambda: set(second) <= {e["data"] for e in events() if e["e"] == "rec"}
                 or child.poll() is not None, 150, "kcl-rs to read the second batch")
        assert child.poll() is None, (tmp_path / "kclrs.err").read_text()[-3000:]
        # kcl-rs resumed at our checkpoints: it initialized every shard at them and
        # delivered none of the records we had processed.
        rust = [e["data"] for e in events() if e["e"] == "rec"]
        assert not set(rust) & set(first), "kcl-rs read records our worker had checkpointed"
        inits = {e["seq"] for e in events() if e["e"] == "init"}
        assert inits == {c.sequence_number for c in ours_done.values()}
        # Its checkpoints reach the second batch's last record in every shard.
        last = max(second.values(), key=int)
        wait_for(lambda: all(c.sequence_number in second.values() or
                             int(c.sequence_number) >= int(last) for c in
                             checkpoints(dynamodb, table).values()), 30,
                 "kcl-rs to checkpoint the second batch")
    finally:
        child.terminate()
        child.wait(60)
    rust_done = checkpoints(dynamodb, table)
    assert set(rust_done) == set(ours_done)

    third = put(kinesis_local, streams, "third", 10)
    seen, inits, _ = run_ours(config, streams, set(third), "ours-2")
    # Ours resumed at kcl-rs's checkpoints: nothing of the second batch again.
    assert not set(seen) & set(second), "our worker read records kcl-rs had checkpointed"
    assert inits == rust_done
