"""Helpers shared by the tests and the benchmarks: clients, streams and producers on emulators.

Import as ``from emulators import ...`` inside tests (pytest puts tests/ on sys.path). Every
client carries dummy credentials explicitly, so these helpers work whatever the environment.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Sequence, Union

import boto3
import botocore.config
from aws_kinesis_agg.aggregator import RecordAggregator

from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY

# A record to put: raw data (partition key made up), or (partition_key, data).
RecordSpec = Union[bytes, str, "tuple[str, bytes | str]"]

_CLIENT_CONFIG = botocore.config.Config(
    connect_timeout=5, read_timeout=30, retries={"total_max_attempts": 5, "mode": "standard"},
    max_pool_connections=20,
)


_clients: dict[tuple[str, str], Any] = {}
_clients_lock = threading.Lock()


def client(service: str, endpoint: str) -> Any:
    """One client per service and endpoint in a process, made on first use: the tests' wait
    loops ask the emulators every 0.1 s, and a new client costs 10 ms of CPU (boto3's clients
    are thread-safe, so the threads share it)."""
    with _clients_lock:
        made = _clients.get((service, endpoint))
        if made is None:
            made = _clients[(service, endpoint)] = boto3.client(
                service, endpoint_url=endpoint, region_name=DUMMY_REGION,
                aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                aws_secret_access_key=DUMMY_SECRET_ACCESS_KEY, config=_CLIENT_CONFIG)
        return made


def unique_name(prefix: str) -> str:
    """Stream / table / app names valid for Kinesis and DynamoDB, unique per call."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in prefix)[:60]
    return f"{safe}-{uuid.uuid4().hex[:10]}"


def wait_stream_active(kinesis: Any, stream: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        summary = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
        if summary["StreamStatus"] == "ACTIVE":
            return summary
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream} still {summary['StreamStatus']} after {timeout} s")
        time.sleep(0.05)


def create_stream(endpoint: str, stream: str, shards: int, timeout: float = 30.0) -> None:
    """Create and wait ACTIVE."""
    kinesis = client("kinesis", endpoint)
    kinesis.create_stream(StreamName=stream, ShardCount=shards)
    wait_stream_active(kinesis, stream, timeout)


def delete_stream(endpoint: str, stream: str) -> None:
    kinesis = client("kinesis", endpoint)
    try:
        kinesis.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)
    except kinesis.exceptions.ResourceNotFoundException:
        pass


def list_shard_ids(endpoint: str, stream: str) -> list[str]:
    kinesis = client("kinesis", endpoint)
    shards: list[str] = []
    kwargs: dict[str, Any] = {"StreamName": stream}
    while True:
        page = kinesis.list_shards(**kwargs)
        shards += [s["ShardId"] for s in page["Shards"]]
        token = page.get("NextToken")
        if not token:
            return shards
        kwargs = {"NextToken": token}


def register_consumer(endpoint: str, stream: str, name: str, active: bool = True,
                      timeout: float = 30.0) -> str:
    """Register a fan-out consumer on ``stream``; its ARN, once ACTIVE unless ``active`` is False."""
    kinesis = client("kinesis", endpoint)
    stream_arn = kinesis.describe_stream_summary(StreamName=stream)[
        "StreamDescriptionSummary"]["StreamARN"]
    arn = kinesis.register_stream_consumer(StreamARN=stream_arn, ConsumerName=name)[
        "Consumer"]["ConsumerARN"]
    deadline = time.monotonic() + timeout
    while active:
        status = kinesis.describe_stream_consumer(ConsumerARN=arn)[
            "ConsumerDescription"]["ConsumerStatus"]
        if status == "ACTIVE":
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"consumer {name} still {status} after {timeout} s")
        time.sleep(0.05)
    return str(arn)


@dataclass(frozen=True)
class PutResult:
    """Where one put Kinesis record landed."""

    partition_key: str
    data: bytes
    shard_id: str
    sequence_number: str


def _as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


def _normalise(records: Iterable[RecordSpec]) -> list[tuple[str, bytes]]:
    out = []
    for i, record in enumerate(records):
        if isinstance(record, tuple):
            key, data = record
            out.append((str(key), _as_bytes(data)))
        else:
            out.append((f"pk-{i}-{uuid.uuid4().hex[:6]}", _as_bytes(record)))
    return out


def _put_entries(kinesis: Any, stream: str, entries: list[dict[str, Any]],
                 timeout: float = 60.0) -> list[dict[str, Any]]:
    """PutRecords in batches of 500, re-putting failed entries; results in input order."""
    results: list[dict[str, Any] | None] = [None] * len(entries)
    deadline = time.monotonic() + timeout
    for start in range(0, len(entries), 500):
        pending = list(range(start, min(start + 500, len(entries))))
        while pending:
            reply = kinesis.put_records(StreamName=stream, Records=[entries[i] for i in pending])
            failed = []
            for index, result in zip(pending, reply["Records"]):
                if "ErrorCode" in result:
                    failed.append(index)
                else:
                    results[index] = result
            if failed and time.monotonic() > deadline:
                raise TimeoutError(f"{len(failed)} records still failing to put into {stream}")
            if failed:
                time.sleep(0.1)
            pending = failed
    return [r for r in results if r is not None]


def put_records(endpoint: str, stream: str, records: Sequence[RecordSpec]) -> list[PutResult]:
    """Put plain (not aggregated) records; returns where each landed, in input order."""
    pairs = _normalise(records)
    entries = [{"PartitionKey": key, "Data": data} for key, data in pairs]
    replies = _put_entries(client("kinesis", endpoint), stream, entries)
    return [PutResult(key, data, r["ShardId"], r["SequenceNumber"])
            for (key, data), r in zip(pairs, replies)]


@dataclass(frozen=True)
class AggregatedPut:
    """One KPL aggregate as put: its Kinesis record plus the user records inside, in order."""

    partition_key: str
    explicit_hash_key: str | None
    shard_id: str
    sequence_number: str
    user_records: tuple[tuple[str, bytes], ...]  # (partition key, data); sub-sequence = index


def put_aggregated(endpoint: str, stream: str, records: Sequence[RecordSpec],
                   per_aggregate: int = 100) -> list[AggregatedPut]:
    """Put records KPL-aggregated, ``per_aggregate`` user records per Kinesis record at most.

    The aggregator routes a whole aggregate by its first record's partition key (see
    emulators.md), so user record i of an aggregate has sub-sequence number i.
    """
    if per_aggregate < 1:
        raise ValueError("per_aggregate must be >= 1")
    pairs = _normalise(records)
    aggregates: list[tuple[str, str | None, bytes, tuple[tuple[str, bytes], ...]]] = []
    for start in range(0, len(pairs), per_aggregate):
        group = pairs[start:start + per_aggregate]
        aggregator = RecordAggregator()
        inside: list[tuple[str, bytes]] = []
        for key, data in group:
            full = aggregator.add_user_record(key, data)
            if full is not None:  # size limit hit: ship what was full, keep going
                pk, ehk, blob = full.get_contents()
                aggregates.append((pk, ehk, blob, tuple(inside)))
                inside = []
            inside.append((key, data))
        last = aggregator.clear_and_get()
        if last is not None and last.get_num_user_records():
            pk, ehk, blob = last.get_contents()
            aggregates.append((pk, ehk, blob, tuple(inside)))
    entries = []
    for pk, ehk, blob, _ in aggregates:
        entry: dict[str, Any] = {"PartitionKey": pk, "Data": blob}
        if ehk:
            entry["ExplicitHashKey"] = ehk
        entries.append(entry)
    replies = _put_entries(client("kinesis", endpoint), stream, entries)
    return [AggregatedPut(pk, ehk or None, r["ShardId"], r["SequenceNumber"], inside)
            for (pk, ehk, _, inside), r in zip(aggregates, replies)]


def read_all(endpoint: str, stream: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every Kinesis record now in the stream, TRIM_HORIZON to the tip, shard by shard.

    A check helper for tests (a shard is read until an empty page at the tip), not a consumer.
    """
    kinesis = client("kinesis", endpoint)
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    for shard_id in list_shard_ids(endpoint, stream):
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator and time.monotonic() < deadline:
            page = kinesis.get_records(ShardIterator=iterator, Limit=10000)
            for record in page["Records"]:
                out.append({**record, "ShardId": shard_id})
            iterator = page.get("NextShardIterator")
            if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                break
    return out


class Producer:
    """Puts ``batch`` records every ``interval_s`` on a thread while the block runs;
    ``sent`` maps data -> partition key."""

    def __init__(self, endpoint: str, stream: str, prefix: str, batch: int = 10,
                 interval_s: float = 0.25) -> None:
        self.endpoint, self.stream, self.prefix = endpoint, stream, prefix
        self.batch, self.interval_s = batch, interval_s
        self.sent: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def _run(self) -> None:
        round_no = 0
        while not self._stop.wait(self.interval_s):
            self.sent.update(put_batch(self.endpoint, self.stream, f"{self.prefix}{round_no}",
                                       self.batch))
            round_no += 1

    def __enter__(self) -> "Producer":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def put_batch(endpoint: str, stream: str, prefix: str, count: int) -> dict[str, str]:
    """``count`` records with distinct data and 37 partition keys; returns data -> key."""
    batch = {f"{prefix}-{i}": f"pk-{prefix}-{i % 37}" for i in range(count)}
    put_records(endpoint, stream, [(pk, data) for data, pk in batch.items()])
    return batch
