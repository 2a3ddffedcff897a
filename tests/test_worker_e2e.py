"""The worker engine against real emulators (kinesis-local + moto's DynamoDB server).

Workers run as OS processes where the issue asks for processes (sharing, kill -9), in
process otherwise. Every record a processor sees is appended to a JSON-lines file by
tests/recording_processor.py, so a test can check deliveries even after a kill -9.
"""
from __future__ import annotations

import signal
import subprocess
import threading
import time

import pytest

import emulators
from recording_processor import read_events, start_worker
from waiting import wait_for

from kinesis_dstream.errors import CredentialsError, EndpointUnreachableError, StreamNotFoundError
from kinesis_dstream.records import ExtendedSequenceNumber
from kinesis_dstream.worker.processor import RecordProcessor
from kinesis_dstream.worker.scheduler import Scheduler

pytestmark = pytest.mark.emulator


def stop_all(processes: list[subprocess.Popen]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def lease_items(dynamodb: str, table: str) -> dict[str, dict]:
    items = emulators.client("dynamodb", dynamodb).scan(TableName=table, ConsistentRead=True)["Items"]
    return {item["leaseKey"]["S"]: item for item in items}


def owners(dynamodb: str, table: str) -> dict[str, str | None]:
    try:
        items = lease_items(dynamodb, table)
    except Exception:  # noqa: BLE001 - table not there yet
        return {}
    return {key: item.get("leaseOwner", {}).get("S") for key, item in items.items()}


def records_of(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "record"]


def esn(event: dict) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(event["seq"], event["sub"])


def put_mixed(endpoint: str, stream: str, total: int, aggregated_share: float = 0.8,
              prefix: str = "rec") -> dict[str, str]:
    """Put ``total`` user records, most of them KPL-aggregated; returns data -> partition key."""
    expected = {f"{prefix}-{i}": f"pk-{i % 97}" for i in range(total)}
    items = list(expected.items())
    n_agg = int(total * aggregated_share)
    emulators.put_aggregated(endpoint, stream, [(pk, data) for data, pk in items[:n_agg]],
                             per_aggregate=100)
    emulators.put_records(endpoint, stream, [(pk, data) for data, pk in items[n_agg:]])
    return expected


@pytest.mark.timeout(240)
def test_two_worker_processes_share_four_shards_and_deliver_every_record(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, tmp_path):
    stream = make_stream(4)
    expected = put_mixed(kinesis_local, stream, 20_000)
    config = make_config(stream)
    log_path = tmp_path / "events.jsonl"
    workers = [start_worker(config.replace(worker_id="worker-a"), log_path, tmp_path, "a"),
               start_worker(config.replace(worker_id="worker-b"), log_path, tmp_path, "b")]
    try:
        spread = wait_for(
            lambda: sorted(list(owners(dynamodb, config.application_name).values()).count(w)
                           for w in ("worker-a", "worker-b")) == [2, 2],
            timeout=30, what="a 2/2 split of the shards")
        wait_for(lambda: {e["data"] for e in records_of(read_events(str(log_path)))} >= set(expected),
                 timeout=120, interval=1, what="every record")
    finally:
        stop_all(workers)
    delivered = records_of(read_events(str(log_path)))
    assert {e["data"]: e["pk"] for e in delivered} == expected
    aggregated_subs = [e for e in delivered if e["sub"] > 0]
    assert aggregated_subs, "KPL sub-records must carry their sub-sequence numbers"
    assert all(e["seq"].isdigit() and e["ts"] > 0 for e in delivered)
    print(f"2/2 split after {spread:.1f} s")


@pytest.mark.timeout(240)
def test_kill_9_of_a_worker_moves_its_shards_without_loss(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, tmp_path):
    stream = make_stream(4)
    expected = put_mixed(kinesis_local, stream, 2_000, prefix="before")
    config = make_config(stream)
    log_path = tmp_path / "events.jsonl"
    a = start_worker(config.replace(worker_id="worker-a"), log_path, tmp_path, "a")
    b = start_worker(config.replace(worker_id="worker-b"), log_path, tmp_path, "b")
    try:
        wait_for(lambda: sorted(list(owners(dynamodb, config.application_name).values()).count(w)
                                for w in ("worker-a", "worker-b")) == [2, 2],
                 timeout=30, what="a 2/2 split")
        wait_for(lambda: {e["data"] for e in records_of(read_events(str(log_path)))} >= set(expected),
                 timeout=60, what="the first records")
        # Keep records flowing while B dies.
        more = {f"after-{i}": f"pk-{i % 13}" for i in range(600)}
        items = list(more.items())
        emulators.put_records(kinesis_local, stream, [(pk, d) for d, pk in items[:300]])
        time.sleep(0.5)
        b.send_signal(signal.SIGKILL)
        b.wait(timeout=10)
        killed_at = time.monotonic()
        emulators.put_records(kinesis_local, stream, [(pk, d) for d, pk in items[300:]])
        wait_for(lambda: set(owners(dynamodb, config.application_name).values()) == {"worker-a"},
                 timeout=30, interval=0.1, what="worker-a owning every shard")
        takeover = time.monotonic() - killed_at
        expected.update(more)
        wait_for(lambda: {e["data"] for e in records_of(read_events(str(log_path)))} >= set(expected),
                 timeout=60, what="every record after the takeover")
    finally:
        stop_all([a, b])
    bound = (config.failover_time_ms + 2 * config.renew_interval_ms) / 1000.0
    assert takeover <= bound + 1.0, f"takeover took {takeover:.1f} s, bound {bound:.1f} s"

    events = read_events(str(log_path))
    b_checkpoints: dict[str, ExtendedSequenceNumber] = {}
    last_b_event: dict[str, int] = {}
    for index, e in enumerate(events):
        if e["pid"] == b.pid:
            last_b_event[e["shard"]] = index
            if e["event"] == "checkpoint":
                b_checkpoints[e["shard"]] = max(b_checkpoints.get(e["shard"], esn(e)), esn(e))
    assert b_checkpoints, "worker-b checkpointed nothing before it was killed"
    for shard, checkpoint in b_checkpoints.items():
        after_kill = [e for e in events[last_b_event[shard] + 1:]
                      if e["event"] == "record" and e["shard"] == shard]
        assert after_kill, f"nobody read {shard} after worker-b died"
        assert all(e["pid"] == a.pid for e in after_kill)
        again = [e for e in after_kill if esn(e) <= checkpoint]
        assert not again, (f"{len(again)} records of {shard} at or before worker-b's checkpoint "
                           f"{checkpoint} were delivered again, e.g. {again[0]['data']}")


class _OrderedRecorder(RecordProcessor):
    """In-process recorder: one shared list, in processing order."""

    def __init__(self, out: list, lock: threading.Lock, shard_id: str, stop_after: int | None = None):
        self.out, self.lock, self.shard_id, self.stop_after = out, lock, shard_id, stop_after

    def process_records(self, process_records_input) -> None:
        records = process_records_input.records
        with self.lock:
            self.out.extend((self.shard_id, r) for r in records)
        if records:
            last = records[-1]
            process_records_input.checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)


@pytest.mark.timeout(240)
def test_split_and_merge_while_consuming_keeps_every_record_and_per_key_order(
        aws_env, kinesis_local, dynamodb, make_stream, make_config):
    stream = make_stream(2)
    kinesis = emulators.client("kinesis", kinesis_local)
    config = make_config(stream)
    delivered: list = []
    lock = threading.Lock()
    scheduler = Scheduler(config, lambda shard_id: _OrderedRecorder(delivered, lock, shard_id))
    scheduler.start()
    keys = [f"key-{k}" for k in range(20)]
    counter = 0

    def put_round(n: int) -> None:
        nonlocal counter
        batch = []
        for _ in range(n):
            batch.append((keys[counter % len(keys)], f"{counter}"))
            counter += 1
        emulators.put_records(kinesis_local, stream, batch)

    try:
        put_round(300)
        shards = kinesis.list_shards(StreamName=stream)["Shards"]
        first = shards[0]
        low, high = int(first["HashKeyRange"]["StartingHashKey"]), int(first["HashKeyRange"]["EndingHashKey"])
        kinesis.split_shard(StreamName=stream, ShardToSplit=first["ShardId"],
                            NewStartingHashKey=str((low + high) // 2))
        emulators.wait_stream_active(kinesis, stream)
        put_round(300)
        open_shards = [s for s in kinesis.list_shards(StreamName=stream)["Shards"]
                       if "EndingSequenceNumber" not in s["SequenceNumberRange"]]
        open_shards.sort(key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
        kinesis.merge_shards(StreamName=stream, ShardToMerge=open_shards[0]["ShardId"],
                             AdjacentShardToMerge=open_shards[1]["ShardId"])
        emulators.wait_stream_active(kinesis, stream)
        put_round(300)
        wait_for(lambda: len({r.binary_data for _, r in list(delivered)}) >= counter, timeout=90,
                 what="every record across parents and children")
    finally:
        scheduler.shutdown(timeout_s=10)
    values = [int(r.binary_data) for _, r in delivered]
    assert set(values) == set(range(counter))
    by_key: dict[str, list[int]] = {}
    first_seen = []
    seen = set()
    for v, (_, r) in zip(values, delivered):
        if v not in seen:
            seen.add(v)
            first_seen.append((r.partition_key, v))
    for key, v in first_seen:
        by_key.setdefault(key, []).append(v)
    for key, order in by_key.items():
        assert order == sorted(order), f"records of {key} arrived out of order: {order}"
    leases = lease_items(dynamodb, config.application_name)
    assert len(leases) == 5  # 2 original, 2 children of the split, 1 merged
    finished = [k for k, item in leases.items() if item["checkpoint"]["S"] == "SHARD_END"]
    assert len(finished) == 3
    assert all("childShardIds" in leases[k] for k in finished)
    assert sum("parentShardId" in item for item in leases.values()) == 3


class _StopAfter(RecordProcessor):
    """Checkpoints exactly once, inside an aggregate, after ``at`` records of its shard."""

    def __init__(self, out: list, shard_id: str, at: int, marks: dict):
        self.out, self.shard_id, self.at, self.marks = out, shard_id, at, marks
        self.count = 0

    def process_records(self, process_records_input) -> None:
        for record in process_records_input.records:
            self.out.append((self.shard_id, record))
            self.count += 1
            if self.count == self.at:
                process_records_input.checkpointer.checkpoint(record.sequence_number,
                                                              record.sub_sequence_number)
                self.marks[self.shard_id] = record.extended_sequence_number


@pytest.mark.timeout(180)
def test_restart_resumes_from_checkpoints_inside_aggregates(
        aws_env, kinesis_local, dynamodb, make_stream, make_config):
    stream = make_stream(1)
    emulators.put_aggregated(kinesis_local, stream,
                             [(f"pk-{i % 5}", f"v{i}") for i in range(1000)], per_aggregate=100)
    config = make_config(stream)
    first_run: list = []
    marks: dict = {}
    scheduler = Scheduler(config, lambda shard_id: _StopAfter(first_run, shard_id, 250, marks))
    scheduler.start()
    try:
        wait_for(lambda: len(first_run) >= 1000, timeout=30, what="the first run")
    finally:
        scheduler.shutdown(timeout_s=10)
    (shard_id, mark), = marks.items()
    assert mark.sub_sequence_number == 49  # the 250th record: 3rd aggregate, sub 49
    item = lease_items(dynamodb, config.application_name)[shard_id]
    assert item["checkpoint"]["S"] == mark.sequence_number
    assert item["checkpointSubSequenceNumber"]["N"] == "49"
    assert "leaseOwner" not in item  # released on graceful shutdown

    second_run: list = []
    scheduler = Scheduler(config.replace(worker_id="second"),
                          lambda shard_id: _StopAfter(second_run, shard_id, 10**9, {}))
    scheduler.start()
    try:
        wait_for(lambda: len(second_run) >= 750, timeout=30, what="the rest after restart")
        time.sleep(1)
    finally:
        scheduler.shutdown(timeout_s=10)
    values = [r.binary_data.decode() for _, r in second_run]
    assert values == [f"v{i}" for i in range(250, 1000)]


@pytest.mark.timeout(180)
def test_throttled_get_records_slow_consumption_but_lose_nothing(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, make_fault_proxy, caplog):
    stream = make_stream(2)
    expected = put_mixed(kinesis_local, stream, 2000, aggregated_share=0.5)
    proxy = make_fault_proxy(share=0.5, seed=7)
    config = make_config(stream, kinesis_endpoint=proxy.endpoint, retry_wait_time_ms=20,
                         retry_max_attempts=2, max_records=50)
    delivered: list = []
    lock = threading.Lock()
    caplog.set_level("WARNING", logger="kinesis_dstream")
    scheduler = Scheduler(config, lambda shard_id: _OrderedRecorder(delivered, lock, shard_id))
    scheduler.start()
    try:
        wait_for(lambda: {r.binary_data.decode() for _, r in list(delivered)} >= set(expected),
                 timeout=120, what="every record through the throttling proxy")
    finally:
        scheduler.shutdown(timeout_s=10)
    assert proxy.injected > 0
    assert {r.binary_data.decode(): r.partition_key for _, r in delivered} == expected
    assert any("Gave up after 2 attempts" in m for m in caplog.messages), \
        "with maxAttempts 2, two throttles in a row must exhaust one round of retries"


@pytest.mark.timeout(60)
def test_wrong_stream_name_fails_fast_naming_the_stream(aws_env, kinesis_local, dynamodb, make_config):
    config = make_config("no-such-stream-xyz")
    started = time.monotonic()
    with pytest.raises(StreamNotFoundError, match="no-such-stream-xyz"):
        Scheduler(config, lambda shard_id: RecordProcessor()).start()
    assert time.monotonic() - started < 15


@pytest.mark.timeout(60)
def test_unreachable_endpoint_fails_within_bounded_time(aws_env, dynamodb, make_config):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = make_config("any-stream", kinesis_endpoint=f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(EndpointUnreachableError, match=str(port)):
        Scheduler(config, lambda shard_id: RecordProcessor()).start()
    assert time.monotonic() - started < 15


@pytest.mark.timeout(60)
def test_missing_credentials_fail_with_a_clear_error(monkeypatch, kinesis_local, dynamodb, make_config,
                                                      tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    config = make_config("any-stream", aws_access_key_id=None, aws_secret_key=None)
    with pytest.raises(CredentialsError, match="credentials"):
        Scheduler(config, lambda shard_id: RecordProcessor()).start()


@pytest.mark.timeout(120)
def test_sigterm_stops_a_worker_gracefully_and_releases_its_leases(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, tmp_path):
    stream = make_stream(2)
    expected = put_mixed(kinesis_local, stream, 500, aggregated_share=0.5)
    config = make_config(stream, worker_id="graceful")
    log_path = tmp_path / "events.jsonl"
    worker = start_worker(config, log_path, tmp_path, "graceful")
    try:
        wait_for(lambda: {e["data"] for e in records_of(read_events(str(log_path)))} >= set(expected),
                 timeout=60, what="every record")
        assert set(owners(dynamodb, config.application_name).values()) == {"graceful"}
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=config.shutdown_grace_ms / 1000 + 10) == 0
    finally:
        stop_all([worker])
    events = read_events(str(log_path))
    assert sorted(e["shard"] for e in events if e["event"] == "shutdown_requested") == \
        sorted(owners(dynamodb, config.application_name))
    assert set(owners(dynamodb, config.application_name).values()) == {None}
    items = lease_items(dynamodb, config.application_name)
    last = {}
    for e in records_of(events):
        last[e["shard"]] = max(last.get(e["shard"], esn(e)), esn(e))
    for shard, item in items.items():
        assert ExtendedSequenceNumber(item["checkpoint"]["S"],
                                      int(item["checkpointSubSequenceNumber"]["N"])) == last[shard]


@pytest.mark.timeout(60)
def test_worker_process_with_a_wrong_stream_exits_naming_it(
        aws_env, kinesis_local, dynamodb, make_config, tmp_path):
    config = make_config("missing-stream-for-process")
    worker = start_worker(config, tmp_path / "events.jsonl", tmp_path, "bad")
    assert worker.wait(timeout=30) == 3
    assert "missing-stream-for-process" in (tmp_path / "bad.stderr").read_text()
