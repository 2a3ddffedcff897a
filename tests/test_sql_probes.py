"""The SQL source's driver: what it asks Kinesis before planning a reading (no Spark).

The reader's driver methods and the executors' ``read()`` run here in one process, against
kinesis-local and the moto server behind counting proxies, so every call is counted: a shard
read last time is read again without a probe, a quiet shard is probed by time (the background
prober), never once per trigger, and a throttled probe is tried once and plans its shard.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Iterator

import pytest

from spark_helpers import wait_until

from kinesis_dstream.sql import prober
from kinesis_dstream.sql.offsets import is_read
from kinesis_dstream.sql.options import parse_source_options
from kinesis_dstream.sql.reader import KinesisStreamReader

pytestmark = pytest.mark.emulator


@pytest.fixture
def proxies(aws_env: dict[str, str], kinesis_local: str, dynamodb: str, make_fault_proxy: Any
            ) -> tuple[Any, Any]:
    """Counting proxies (nothing injected) in front of kinesis-local and the moto server."""
    return (make_fault_proxy(share=0.0, upstream=kinesis_local),
            make_fault_proxy(share=0.0, upstream=dynamodb))


@pytest.fixture
def make_reader(proxies: tuple[Any, Any], unique_app_name: str
                ) -> Iterator[Any]:
    readers: list[KinesisStreamReader] = []

    def make(stream: str, kinesis: Any = None, read_timeout_s: float | None = None,
             **extra: str) -> KinesisStreamReader:
        opts = {"kinesis.streamName": stream,
                "kinesis.endpointUrl": (kinesis or proxies[0]).endpoint,
                "kinesis.region": "us-east-1", "kinesis.dynamodb.endpointUrl": proxies[1].endpoint,
                "kinesis.dynamodb.tableName": unique_app_name,
                "kinesis.startingPosition": "TRIM_HORIZON", **extra}
        options = parse_source_options(opts)
        if read_timeout_s is not None:
            options = dataclasses.replace(
                options, config=options.config.replace(read_timeout_s=read_timeout_s))
        reader = KinesisStreamReader(options)
        readers.append(reader)
        return reader

    yield make
    for reader in readers:
        reader.stop()


@pytest.fixture
def slow_prober(monkeypatch: pytest.MonkeyPatch) -> None:
    """No background probe within the test: every call counted is latestOffset's own."""
    monkeypatch.setattr(prober, "PROBE_INTERVAL_S", 3600.0)
    monkeypatch.setattr(prober, "PROBE_STALE_S", 3600.0)


def calls(proxy: Any, operation: str) -> int:
    with proxy._lock:
        return sum(n for (op, _), n in proxy.calls.items() if op == operation)


def run_reading(reader: Any, start: dict, end: dict) -> list[bytes]:
    """Plan the reading, compute its partitions as executors would, commit it."""
    rows: list[bytes] = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            rows.extend(batch.column(0).to_pylist())
    reader.commit(end)
    return rows


def read_shards(offset: dict) -> set[str]:
    return {s for s, e in offset["shards"].items() if is_read(e)}


def test_a_shard_read_last_time_is_not_probed_and_quiet_shards_not_per_trigger(
        make_stream, put_records, make_reader, proxies, slow_prober):
    kinesis, tables = proxies
    stream = make_stream(4)
    busy = put_records(stream, [("k", f"a{i}") for i in range(5)])[0].shard_id
    reader = make_reader(stream)
    start = reader.initialOffset()
    first = reader.latestOffset(start)
    assert calls(kinesis, "GetRecords") == 4  # the first trigger asks every shard once
    assert read_shards(first) == {busy}
    assert sorted(run_reading(reader, start, first)) == sorted(f"a{i}".encode() for i in range(5))

    put_records(stream, [("k", f"b{i}") for i in range(3)])
    before = calls(kinesis, "GetRecords"), calls(kinesis, "GetShardIterator")
    second = reader.latestOffset(first)
    # the busy shard is read again unasked, the quiet ones were asked a moment ago
    assert (calls(kinesis, "GetRecords"), calls(kinesis, "GetShardIterator")) == before
    assert read_shards(second) == {busy}
    assert sorted(run_reading(reader, first, second)) == sorted(f"b{i}".encode() for i in range(3))

    third = reader.latestOffset(second)  # read again: finds nothing, records that once
    assert read_shards(third) == {busy}
    assert run_reading(reader, second, third) == []
    counts = lambda: (calls(kinesis, "GetRecords"), calls(kinesis, "GetShardIterator"),  # noqa: E731
                      calls(tables, "GetItem"), calls(tables, "PutItem"))
    gets, iterators, items, puts = counts()
    # the empty read says what a probe would: the shard joins the quiet ones unasked
    assert reader.latestOffset(third) == third
    assert counts() == (gets, iterators, items + 1, puts)  # reading 3's range, looked up once
    for _ in range(20):  # more triggers with nothing to read: no Kinesis or DynamoDB call
        assert reader.latestOffset(third) == third
    assert counts() == (gets, iterators, items + 1, puts)


def test_the_background_prober_finds_records_on_a_quiet_shard(
        make_stream, put_records, make_reader, proxies, monkeypatch):
    monkeypatch.setattr(prober, "PROBE_INTERVAL_S", 0.2)
    monkeypatch.setattr(prober, "PROBE_STALE_S", 600.0)
    kinesis = proxies[0]
    stream = make_stream(2)
    reader = make_reader(stream)
    start = reader.initialOffset()
    assert reader.latestOffset(start) == start
    busy = put_records(stream, [("k", "late")])[0].shard_id
    floor = calls(kinesis, "GetRecords")
    # no trigger in between: the prober asks each quiet shard again, by itself
    wait_until(lambda: calls(kinesis, "GetRecords") >= floor + 2 * 2, 60, "background probes")
    wait_until(lambda: reader.latestOffset(start) != start, 30, "a reading planned")
    end = reader.latestOffset(start)
    assert read_shards(end) == {busy}
    assert run_reading(reader, start, end) == [b"late"]


def test_a_throttled_probe_is_tried_once_and_plans_its_shard(
        make_stream, put_records, make_reader, make_fault_proxy, kinesis_local, slow_prober):
    stream = make_stream(3)
    throttling = make_fault_proxy(share=1.0, upstream=kinesis_local)
    # the awslabs retry defaults: 1 s doubling, 5 retries, for a probe 25 s and 6 calls
    reader = make_reader(stream, throttling)
    start = reader.initialOffset()
    end = reader.latestOffset(start)
    assert throttling.injected == 3  # one GetRecords a shard, not retried
    assert read_shards(end) == set(start["shards"])  # the tasks find out, waiting it out


def test_at_the_read_limits_every_record_comes_once_and_a_probe_is_one_call(
        make_stream, put_records, make_reader, make_fault_proxy, kinesis_local, slow_prober):
    """Through the limits proxy with a small byte budget (25 kB/s: a 50-record page of
    1,000-byte records costs 2 s), readings after readings: the tasks' reads are refused
    often, some hand out nothing and record that; the driver asks Kinesis at most once per
    trigger (one shard, one try), and every record comes once, in order."""
    from fault_proxy import ShardLimits

    stream = make_stream(1)
    limits = ShardLimits(bytes_per_s=25_000, burst_bytes=25_000)
    proxy = make_fault_proxy(share=0.0, upstream=kinesis_local, limits=limits)
    sent = [f"{i:04d}".ljust(1000, "x").encode() for i in range(150)]
    put_records(stream, [("k", v.decode()) for v in sent])
    reader = make_reader(stream, proxy, **{"kinesis.getRecords.numberOfRecordsPerFetch": "50"})
    asked = lambda: (calls(proxy, "GetRecords")  # noqa: E731
                     + sum(n for (op, _), n in limits.refused.items() if op == "GetRecords"))
    got: list[bytes] = []
    start, triggers = reader.initialOffset(), 0
    while len(got) < len(sent):
        triggers += 1
        assert triggers < 200, f"only {len(got)} records read"
        before = asked()
        end = reader.latestOffset(start)
        assert asked() - before <= 1
        if end != start:
            got.extend(run_reading(reader, start, end))
            start = end
    assert got == sent
    assert sum(limits.refused.values()) >= 3


@pytest.mark.emulator
def test_a_reader_pickled_mid_query_reads_without_the_driver_state(
        make_stream, put_records, make_reader, slow_prober):
    """Spark pickles the reader for the executors' read(): the copy carries the options and
    where the query stands, none of the driver's clients, threads or watches."""
    from pyspark import cloudpickle

    stream = make_stream(2)
    busy = put_records(stream, [("k", "x")])[0].shard_id
    reader = make_reader(stream)
    start = reader.initialOffset()
    end = reader.latestOffset(start)  # the other shard is quiet: the prober's thread runs
    assert read_shards(end) == {busy}
    assert any(t.name == f"kinesis-source-prober-{stream}" for t in threading.enumerate())
    copy = cloudpickle.loads(cloudpickle.dumps(reader))
    assert copy._driver is None and copy._last_end == end
    rows = [row for partition in reader.partitions(start, end)
            for batch in copy.read(partition) for row in batch.column(0).to_pylist()]
    assert rows == [b"x"]
    assert copy._driver is None  # read() makes none either


def test_a_reading_after_one_that_spent_its_shards_budget_waits_for_it_unrefused(
        make_stream, put_records, make_reader, make_fault_proxy, kinesis_local, slow_prober):
    """At Kinesis' limits (2 MiB/s a shard, a second's burst), a reading of 400 records of
    10,000 bytes puts its shard nearly a second into debt (10 KB records: kinesis-local puts
    and serves 10 MB in a third of the time of 1 KB ones). The next reading, planned at once,
    carries the first one's ready time: its task waits for it and is served at its first
    call. No GetRecords is refused, no reading after the first hands out nothing, and every
    record comes once, in order."""
    from fault_proxy import ShardLimits

    stream = make_stream(1)
    limits = ShardLimits()
    proxy = make_fault_proxy(share=0.0, upstream=kinesis_local, limits=limits)
    sent = [f"{i:05d}".ljust(10_000, "x").encode() for i in range(1_000)]
    put_records(stream, [("k", v.decode()) for v in sent])
    # A 4 MB page from kinesis-local on a loaded CI machine took longer than the client's
    # 10 s read timeout: the proxy charged the shard for an answer that never arrived, and
    # the next call was refused, as Kinesis would. That is the timeout's cost, not the ready
    # time's that this test is about. So is a reading's time budget (5 s): a page read
    # ahead for the next reading that took kinesis-local longer (5-6 s for 4 MB in CI) is
    # left to the reading after it, which then hands out nothing.
    reader = make_reader(stream, proxy, read_timeout_s=120.0,
                         **{"kinesis.maxFetchRecordsPerShard": "400",
                            "kinesis.maxFetchTimePerShardMs": "60000"})
    got: list[bytes] = []
    start = reader.initialOffset()
    per_reading = []
    while len(got) < len(sent):
        assert len(per_reading) < 10, per_reading
        end = reader.latestOffset(start)
        assert end != start  # a backlog: every trigger plans the shard
        rows = run_reading(reader, start, end)
        per_reading.append(len(rows))
        got.extend(rows)
        start = end
    assert got == sent
    assert all(per_reading[1:]), per_reading
    assert not limits.refused, dict(limits.refused)
