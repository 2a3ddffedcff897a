"""spark.readStream.format("aws-kinesis"): the Structured Streaming source, end to end.

Real Spark (the session's local-cluster: executors in processes of their own), kinesis-local
for Kinesis (resharding, shard end) and the moto server for the range table. Every query
collects its rows per micro-batch id through foreachBatch: a batch that runs again replaces
its rows, and the test checks that it brought the same ones. Run as a script
(``python tests/test_sql_source.py driver ...``) this file is the subprocess driver of the
kill -9 test.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pytest

from spark_helpers import wait_until

if __name__ != "__main__":  # the subprocess driver needs none of the emulator helpers
    from emulators import client, list_shard_ids
    from emulators import put_records as put_at

import pyspark  # noqa: E402
from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import ConfigurationError, DataLossError
from kinesis_dstream.records import ExtendedSequenceNumber
from kinesis_dstream.sql.datasource import KinesisDataSource as KinesisSource
from kinesis_dstream.sql.datasource import register
from kinesis_dstream.sql.offsets import (
    advance,
    is_read,
    is_readable,
    make_offset,
    next_shards,
    position_of,
    stream_key,
)
from kinesis_dstream.sql.options import parse_options, parse_source_options
from kinesis_dstream.sql.partition_reader import _to_tuples, arrow_schema, spark_schema, to_arrow
from kinesis_dstream.sql.reader import FIRST_READING_MAX_RECORDS, KinesisStreamReader

# Admission control, Trigger.AvailableNow and the offset a restarted query stands at reach
# a Python source from pyspark 4.2 on (the Spark matrix runs this file on 4.0 too).
PYSPARK_4_2 = tuple(int(x) for x in pyspark.__version__.split(".")[:2]) >= (4, 2)
needs_4_2 = pytest.mark.skipif(not PYSPARK_4_2, reason="pyspark < 4.2 has no admission "
                               "control or Trigger.AvailableNow for Python sources")

TRIGGER = "1 second"


# -- helpers -----------------------------------------------------------------------------------
class Batches:
    """foreachBatch target: rows by batch id, each the ``columns`` then the data; a batch run
    again must bring the same rows."""

    def __init__(self, columns: tuple[str, ...] = ("shardId", "sequenceNumber",
                                                   "subSequenceNumber", "partitionKey")) -> None:
        self.columns = columns
        self.lock = threading.Lock()
        self.by_batch: dict[int, list[tuple]] = {}
        self.reruns_differing: list[int] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = sorted(tuple(r[c] for c in self.columns) + (bytes(r.data),)
                      for r in df.collect())
        with self.lock:
            if batch_id in self.by_batch and self.by_batch[batch_id] != rows:
                self.reruns_differing.append(batch_id)
            self.by_batch[batch_id] = rows

    def rows(self) -> list[tuple]:
        with self.lock:
            return [r for rows in self.by_batch.values() for r in rows]

    def data(self) -> Counter:
        return Counter(r[-1] for r in self.rows())


def options(stream: str, kinesis: str, dynamodb: str, app: str, **extra: str) -> dict[str, str]:
    opts = {"kinesis.streamName": stream, "kinesis.endpointUrl": kinesis,
            "kinesis.region": "us-east-1", "kinesis.dynamodb.endpointUrl": dynamodb,
            "kinesis.dynamodb.tableName": app, "kinesis.startingPosition": "TRIM_HORIZON",
            "kinesis.clientRetryIntervalsMs": "100"}
    opts.update(extra)
    return opts


def start_query(spark: Any, opts: dict[str, str], checkpoint: str, sink: Batches,
                trigger: dict[str, Any] | None = None) -> Any:
    df = spark.readStream.format("aws-kinesis").options(**opts).load()
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    writer = writer.trigger(**(trigger or {"processingTime": TRIGGER}))
    return writer.start()


def stop(query: Any) -> None:
    query.stop()
    assert query.exception() is None, query.exception()


# -- fixtures ----------------------------------------------------------------------------------
if __name__ != "__main__":

    @pytest.fixture
    def env(aws_env: dict[str, str], kinesis_local: str, dynamodb: str,
            unique_app_name: str) -> dict[str, str]:
        return {"kinesis": kinesis_local, "dynamodb": dynamodb, "app": unique_app_name}

    @pytest.fixture
    def checkpoint(tmp_path: Path) -> str:
        return str(tmp_path / "checkpoint")


# -- reading -----------------------------------------------------------------------------------
@pytest.mark.matrix
@pytest.mark.spark
def test_reads_plain_and_aggregated_records_on_executors(spark, env, make_stream, put_records,
                                                          put_aggregated, checkpoint):
    stream = make_stream(2)
    plain = put_records(stream, [(f"pk{i % 7}", f"plain-{i}") for i in range(300)])
    aggregated = put_aggregated(stream, [(f"ak{i % 5}", f"agg-{i}") for i in range(400)],
                                per_aggregate=50)
    expected = Counter([p.data for p in plain] +
                       [d for a in aggregated for _, d in a.user_records])
    sink = Batches()
    query = start_query(spark, options(stream, env["kinesis"], env["dynamodb"], env["app"]),
                        checkpoint, sink)
    try:
        wait_until(lambda: sum(sink.data().values()) >= len(expected), 120, "700 records")
        later = put_aggregated(stream, [("late", f"late-{i}") for i in range(30)], per_aggregate=10)
        expected.update(d for a in later for _, d in a.user_records)
        wait_until(lambda: sum(sink.data().values()) >= sum(expected.values()), 60, "late records")
    finally:
        stop(query)
    assert sink.data() == expected
    assert not sink.reruns_differing
    rows = sink.rows()
    # KPL user records keep their aggregate's sequence number and their own sub-sequence.
    where = {(a.shard_id, a.sequence_number, i): d for a in aggregated
             for i, (_, d) in enumerate(a.user_records)}
    got = {(r[0], r[1], r[2]): r[4] for r in rows if r[4].startswith(b"agg-")}
    assert got == where
    # Within a shard, rows come in sequence order across batches.
    for shard in {r[0] for r in rows}:
        order = [ExtendedSequenceNumber(r[1], r[2]) for b in sorted(sink.by_batch)
                 for r in sink.by_batch[b] if r[0] == shard]
        assert order == sorted(order)


def offsets_logged(checkpoint: str) -> list[dict[str, Any]]:
    """The source offsets in the query's offset log, by batch id."""
    out = []
    folder = Path(checkpoint) / "offsets"
    for path in sorted(folder.glob("[0-9]*"), key=lambda p: int(p.name)):
        out.append(json.loads(path.read_text().strip().splitlines()[-1]))
    return out


def read_on_exactly_once(query: Any, producer: "KeyedProducer", sink: Batches, until_sent: int,
                         *, sent_within_s: float = 30.0, read_within_s: float = 120.0,
                         also: Iterable[bytes] = ()) -> None:
    """A query reading while the producer goes on until it has sent ``until_sent`` records:
    every record put (and ``also``), each exactly once, and no batch that ran again brought
    other rows. Stops the producer and the query."""
    try:
        wait_until(lambda: len(producer.sent) >= until_sent, sent_within_s, "more records")
        sent = producer.finish()
        wait_until(lambda: set(sink.data()) >= set(sent) or not query.isActive, read_within_s,
                   f"every record put ({len(sent)}; {len(sink.data())} read in "
                   f"{len(sink.by_batch)} batches so far)")
    finally:
        producer.halt.set()
        stop(query)
    got, want = sink.data(), Counter(sent) + Counter(also)
    assert got == want, (len(got), len(want), [d for d, n in got.items() if n > 1][:5])
    assert not sink.reruns_differing


class KeyedProducer(threading.Thread):
    """Puts 10 records every ``every_s`` under 6 fixed partition keys, data unique (``prefix``
    and a count); ``sent`` in order."""

    def __init__(self, endpoint: str, stream: str, *, prefix: str = "rec",
                 every_s: float = 0.2) -> None:
        super().__init__(name="keyed-producer", daemon=True)
        self.endpoint, self.stream = endpoint, stream
        self.prefix, self.every_s = prefix, every_s
        self.sent: list[bytes] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.halt.wait(self.every_s):
                batch = [(f"key{(n + i) % 6}", f"{self.prefix}-{n + i:06d}") for i in range(10)]
                put_at(self.endpoint, self.stream, batch)
                self.sent.extend(d.encode() for _, d in batch)
                n += 10
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            self.error = exc

    def finish(self) -> list[bytes]:
        self.halt.set()
        self.join(30)
        if self.error is not None:
            raise self.error
        return list(self.sent)


@pytest.mark.spark
def test_a_quiet_shard_costs_the_query_no_iterator_and_no_dynamodb_call(
        spark, env, make_stream, make_fault_proxy, put_records, checkpoint):
    """The driver's background prober finds a shard quiet with the iterator its last probe
    kept, and the readings leave that shard out: no GetShardIterator, no task, no DynamoDB
    call for it (how often it is probed: test_sql_probes.py)."""
    stream = make_stream(4)
    kinesis = make_fault_proxy(share=0.0, upstream=env["kinesis"])
    tables = make_fault_proxy(share=0.0, upstream=env["dynamodb"])
    busy = put_records(stream, [("k", "first")])[0].shard_id
    sink = Batches()
    query = start_query(spark, options(stream, kinesis.endpoint, tables.endpoint, env["app"]),
                        checkpoint, sink)
    probes = lambda: kinesis.calls[("GetRecords", "")]  # noqa: E731
    try:
        wait_until(lambda: sum(sink.data().values()) == 1, 120, "the first record")
        floor = probes()
        wait_until(lambda: probes() >= floor + 4 * 3, 60, "three more probes of each shard")
        with kinesis._lock, tables._lock:
            before = dict(kinesis.shard_calls), dict(tables.shard_calls)
        put_records(stream, [("k", f"r{i}") for i in range(20)])
        wait_until(lambda: sum(sink.data().values()) == 21, 60, "the new records")
        floor = probes()
        wait_until(lambda: probes() >= floor + 4 * 5, 60, "five more probes of each shard")
        with kinesis._lock, tables._lock:
            calls = {**{k: n - before[0].get(k, 0) for k, n in kinesis.shard_calls.items()},
                     **{k: n - before[1].get(k, 0) for k, n in tables.shard_calls.items()}}
    finally:
        stop(query)
    quiet = {f"shardId-{i:012d}" for i in range(4)} - {busy}
    assert {k: n for k, n in calls.items() if n and k[2] in quiet} == {}
    assert any(n for k, n in calls.items() if k[2] == busy)  # the busy shard's reading
    # ... which went on with the iterator its last read recorded: no GetShardIterator either
    assert calls.get(("GetShardIterator", "", busy), 0) == 0, calls


def shared_environment(spark: Any, name: str) -> set[str]:
    """The keys of the environment map that every query of the registered source ``name``
    shares (Spark's own object, through py4j)."""
    source = spark._jsparkSession.sessionState().dataSourceManager().lookupDataSource(name)
    return set(source.dataSourceCls().envVars().keySet())


@pytest.mark.spark
def test_a_query_s_start_adds_no_key_to_the_environment_its_source_shares(
        spark, env, make_stream, put_records, checkpoint):
    """Spark's source runner writes into that map unlocked while other queries serialize it
    into their tasks: a new key there, added by two starts at once, broke every query of the
    source (``source_runner_environment``). A value replaced is harmless; a key added is not."""
    register(spark)  # a registration of its own: a map that no query has started on yet
    before = shared_environment(spark, "aws-kinesis")
    stream = make_stream(1)
    put_records(stream, [("k", "only")])
    sink = Batches()
    query = start_query(spark, options(stream, env["kinesis"], env["dynamodb"], env["app"]),
                        checkpoint, sink)
    try:
        wait_until(lambda: sum(sink.data().values()) == 1, 120, "the record")
    finally:
        stop(query)
    added = shared_environment(spark, "aws-kinesis") - before
    assert not added, f"the query's start added {sorted(added)} to {sorted(before)}"


@pytest.mark.unit
def test_commit_deletes_each_old_range_once_and_only_of_the_shards_read():
    class Ranges:
        deleted: list[tuple[str, str, int]] = []

        def delete(self, ranges):
            self.deleted.extend(ranges)

    reader = KinesisStreamReader(parse_source_options(
        {"kinesis.streamName": "s", "kinesis.endpointUrl": "http://127.0.0.1:9",
         "kinesis.region": "us-east-1"}))
    reader.driver.ranges = table = Ranges()
    reader.driver.read_in = {t: reader_shards(t) for t in range(1, 31)}
    shards = {"shardId-a": {"after": "1", "sub": 0}, "shardId-b": {"after": "2", "sub": 0}}
    for batch in range(1, 31):
        reader.commit(make_offset("q", batch, 10, shards))
    reader.stop()
    key = stream_key("s", "q")
    expected = [(key, s, t) for t in range(1, 20) for s in reader_shards(t)]
    assert sorted(table.deleted) == sorted(expected)  # readings 20..30 are recent: kept


def reader_shards(t: int) -> list[str]:
    return ["shardId-a"] if t % 2 else ["shardId-a", "shardId-b"]


def _unit_reader(monkeypatch: pytest.MonkeyPatch, shards: int = 2,
                 gate: threading.Event | None = None) -> tuple[Any, list[str]]:
    """A reader whose driver lists ``shards`` shards and whose probes are counted (each
    takes a moment, or waits for ``gate``, and finds records); no endpoint is called."""
    from kinesis_dstream.aws.kinesis import Shard
    from kinesis_dstream.sql.prober import Probe

    reader = KinesisStreamReader(parse_source_options(
        {"kinesis.streamName": "s", "kinesis.endpointUrl": "http://127.0.0.1:9",
         "kinesis.region": "us-east-1", "kinesis.startingPosition": "TRIM_HORIZON"}))
    driver, probed = reader.driver, []
    listing = [Shard(f"shardId-{i}", None, None, "0", "1", "1", None) for i in range(shards)]
    monkeypatch.setattr(driver, "list_shards", lambda: {"s": listing})

    def probe(shard_id: str, entry: dict, target_ms: Any) -> Probe:
        probed.append(shard_id)
        if gate is not None:
            assert gate.wait(30)
        else:
            time.sleep(0.2)  # a round trip: still under way when latestOffset asks
        return driver.prober._found(shard_id, entry, Probe(True, 5))
    monkeypatch.setattr(driver.prober, "_probe", probe)
    return reader, probed


@pytest.mark.unit
def test_polling_readings_read_ahead_and_name_where_the_previous_one_left_its_page(
        monkeypatch):
    """A polling task that leaves its shard on a backlog reads the next page ahead
    (``retrieval.prefetch``): its ranges ask for pages of ``maxFetchRecordsPerShard`` and
    carry the query's peer key, and the next reading's range names the process its previous
    recorded range named, wherever the next task runs. Under fan-out the subscription is
    what is held: nothing is read ahead."""
    from kinesis_dstream.aws.range_table import BatchRange

    reader, _ = _unit_reader(monkeypatch)
    driver = reader.driver
    monkeypatch.setattr(driver, "_make_ranges", lambda: object())
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        first = [r for p in reader.partitions(start, end) for r in p.ranges]
        assert {r.ahead_records for r in first} == {reader.options.max_fetch_records_per_shard}
        assert all(r.peer_key is driver.peer_key and r.subscriber is None for r in first)
        held = {r.shard_id: BatchRange(r.stream_key, r.shard_id, r.batch_ms,
                                       ExtendedSequenceNumber("1"), None,
                                       ExtendedSequenceNumber("2"), 1,
                                       subscriber=f"10.0.0.{i}:4000")
                for i, r in enumerate(first)}
        monkeypatch.setattr(driver, "recorded", (end["query"], int(end["batch"]), held))
        nxt = dict(end, batch=int(end["batch"]) + 1)
        second = [r for p in reader.partitions(end, nxt) for r in p.ranges]
        assert {r.shard_id: r.subscriber for r in second} == {
            s: b.subscriber for s, b in held.items()}
        monkeypatch.setattr(type(reader.options), "fan_out", property(lambda self: True))
        monkeypatch.setattr(driver, "consumer_arn", lambda stream, name, query:
                            f"arn:aws:kinesis:us-east-1:1:stream/{stream}/consumer/{name}:1")
        assert {r.ahead_records for p in reader.partitions(end, nxt) for r in p.ranges} == {0}
    finally:
        reader.stop()


@pytest.mark.unit
def test_a_query_start_waits_for_its_range_table_only_where_a_reading_needs_it(monkeypatch):
    """A new DynamoDB table takes seconds to become ACTIVE: the query's start lists its
    shards and plans its first reading meanwhile, and only the first partitions wait."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    reader, _ = _unit_reader(monkeypatch)
    made, table = threading.Event(), object()
    monkeypatch.setattr(reader.driver, "_make_ranges", lambda: (made.wait(60), table)[1])
    caller = ThreadPoolExecutor(max_workers=1)
    try:
        start = caller.submit(reader.initialOffset).result(timeout=30)
        end = caller.submit(reader.latestOffset, start, None).result(timeout=30)
        assert end["batch"] == 1 and not made.is_set()
        planned = caller.submit(reader.partitions, start, end)
        with pytest.raises(FutureTimeout):  # the tasks would write ranges: it waits
            planned.result(timeout=0.5)
        made.set()
        assert len(planned.result(timeout=30)) == 2
        assert reader.driver.ranges is table
    finally:
        made.set()
        caller.shutdown()
        reader.stop()


@pytest.mark.unit
def test_the_first_reading_s_probes_go_out_at_the_query_start_and_once(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    gate = threading.Event()  # the probes' answers are held back until it is set
    reader, probed = _unit_reader(monkeypatch, shards=3, gate=gate)
    monkeypatch.setattr(reader.driver, "_make_ranges", lambda: object())
    caller = ThreadPoolExecutor(max_workers=1)
    try:
        # initialOffset sends the probes and returns without their answers
        start = caller.submit(reader.initialOffset).result(timeout=20)
        wait_until(lambda: probed, 10, "a probe under way")
        gate.set()
        end = reader.latestOffset(start, None)  # takes their answers: no probe again
        assert sorted(probed) == ["shardId-0", "shardId-1", "shardId-2"]
        assert {s for s, e in end["shards"].items() if is_read(e)} == {
            "shardId-0", "shardId-1", "shardId-2"}
    finally:
        gate.set()
        caller.shutdown(wait=False)
        reader.stop()


@pytest.mark.matrix
@pytest.mark.spark
def test_latest_reads_only_what_arrives_after_the_query_started(spark, env, make_stream,
                                                                put_records, checkpoint):
    stream = make_stream(2)
    put_records(stream, [f"before-{i}" for i in range(50)])
    sink = Batches()
    opts = options(stream, env["kinesis"], env["dynamodb"], env["app"],
                   **{"kinesis.startingPosition": "LATEST"})
    query = start_query(spark, opts, checkpoint, sink)
    try:
        wait_until(lambda: query.lastProgress is not None, 60, "the first trigger")
        after = [p.data for p in put_records(stream, [f"after-{i}" for i in range(40)])]
        wait_until(lambda: sum(sink.data().values()) >= len(after), 60, "40 records")
        if PYSPARK_4_2:  # the progress shows what the last reading cost, and the lag
            wait_until(lambda: reading_reported(query), 30, "a reading's costs in progress")
    finally:
        stop(query)
    assert sink.data() == Counter(after)
    # The first reading a query plans is small (rows within seconds on a backlog), where
    # availableNow reads in several batches (pyspark >= 4.2); before, it is one batch.
    limits = [o["limit"] for o in offsets_logged(checkpoint) if o["batch"] > 0]
    first = FIRST_READING_MAX_RECORDS if PYSPARK_4_2 else 100_000
    assert limits[0] == first and set(limits[1:]) <= {100_000}


def reading_reported(query: Any) -> dict[str, Any] | None:
    """The source's ``latestOffset`` in a progress that reports a reading with records and
    its read, wait and convert times, with Databricks' lag metrics."""
    for progress in query.recentProgress:
        reported = json.loads(progress["sources"][0]["latestOffset"] or "null") or {}
        last = reported.get("lastReading") or {}
        if last.get("records") and all(isinstance(last.get(k), float)
                                       for k in ("readMs", "waitMs", "convertMs")) and \
                {"avgMsBehindLatest", "maxMsBehindLatest", "minMsBehindLatest"} <= set(reported):
            return reported
    return None


# -- restart -----------------------------------------------------------------------------------
@pytest.mark.matrix
@pytest.mark.spark
def test_restart_from_checkpoint_while_data_arrives_loses_and_repeats_nothing(
        spark, env, make_stream, checkpoint):
    stream = make_stream(2)
    opts = options(stream, env["kinesis"], env["dynamodb"], env["app"])
    producer = KeyedProducer(env["kinesis"], stream)
    producer.start()
    sink = Batches()
    query = start_query(spark, opts, checkpoint, sink)
    try:
        wait_until(lambda: len(sink.by_batch) >= 3 and sum(sink.data().values()) >= 60, 120,
                   "three batches with data")
    finally:
        stop(query)
    sent_at_stop = len(producer.sent)
    wait_until(lambda: len(producer.sent) >= sent_at_stop + 60, 30, "records put while stopped")
    query = start_query(spark, opts, checkpoint, sink)
    if not PYSPARK_4_2 and _failed_naming_4_2(query):
        producer.halt.set()  # pyspark < 4.2 cannot tell the source where the query stands
        return
    read_on_exactly_once(query, producer, sink, sent_at_stop + 150)
    # One query id across both runs: the restarted query found its ranges.
    assert len({o["query"] for o in offsets_logged(checkpoint)}) == 1


class FailsFirstBatchOnce(Batches):
    """foreachBatch that fails micro-batch 0 the first time it runs: the query dies with that
    batch in its offset log and not in its commit log, the window between plan and commit that
    a user's stop() can land in, held open on purpose instead of by luck."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = True

    def __call__(self, df: Any, batch_id: int) -> None:
        if batch_id == 0 and self.armed:
            self.armed = False
            raise RuntimeError("batch 0 held back by the test")
        super().__call__(df, batch_id)


@pytest.mark.matrix
@pytest.mark.spark
@pytest.mark.parametrize("position", ["TRIM_HORIZON", "LATEST"])
def test_a_query_stopped_between_its_first_plan_and_commit_restarts_exactly_once(
        spark, env, make_stream, checkpoint, position):
    stream = make_stream(2)
    opts = options(stream, env["kinesis"], env["dynamodb"], env["app"],
                   **{"kinesis.startingPosition": position})
    producer = KeyedProducer(env["kinesis"], stream)
    sink = FailsFirstBatchOnce()
    if position == "TRIM_HORIZON":
        producer.start()
    query = start_query(spark, opts, checkpoint, sink)
    try:
        if position == "LATEST":  # LATEST is pinned by the first trigger: send after it
            wait_until(lambda: query.lastProgress is not None or not query.isActive, 60,
                       "the first trigger")
            producer.start()
        wait_until(lambda: not query.isActive, 120, "batch 0 to fail the query")
    finally:
        query.stop()
    assert "batch 0 held back" in str(query.exception()), query.exception()
    folder = Path(checkpoint)
    assert (folder / "offsets" / "0").exists() and not (folder / "commits" / "0").exists()
    sent_at_stop = len(producer.sent)
    wait_until(lambda: len(producer.sent) >= sent_at_stop + 60, 30, "records put while stopped")
    query = start_query(spark, opts, checkpoint, sink)
    read_on_exactly_once(query, producer, sink, sent_at_stop + 150)
    assert 0 in sink.by_batch  # the held batch itself ran again
    # The checkpoint kept its query: the first reading's id and, for LATEST, its pinned time.
    assert len({o["query"] for o in offsets_logged(checkpoint)}) == 1


# A checkpoint that main's code as of c452a39 (offset format v1) wrote when its query was
# stopped after planning its first reading and before committing it: Spark's metadata and
# offsets/0, whose source offset reads both shards of a 2-shard stream from TRIM_HORIZON.
KEPT_CHECKPOINT = Path(__file__).parent / "data" / "sql-checkpoint-planned-not-committed"
KEPT_QUERY = "358471332ca84c45bbfde14a56b50019"


@pytest.mark.spark
def test_a_checkpoint_kept_from_an_earlier_version_resumes_its_query(
        spark, env, make_stream, put_records, tmp_path):
    import shutil

    stream = make_stream(2)
    sent = [d.encode() for _, d in ((f"k{i}", f"kept-{i}") for i in range(200))]
    put_records(stream, [(f"k{i % 7}", d.decode()) for i, d in enumerate(sent)])
    checkpoint = str(tmp_path / "checkpoint")
    shutil.copytree(KEPT_CHECKPOINT, checkpoint)
    sink = Batches()
    query = start_query(spark, options(stream, env["kinesis"], env["dynamodb"], env["app"]),
                        checkpoint, sink)
    try:
        wait_until(lambda: set(sink.data()) >= set(sent) or not query.isActive, 120,
                   "every record put")
    finally:
        stop(query)
    assert sink.data() == Counter(sent)
    assert 0 in sink.by_batch  # the planned batch ran, under the query id it was born with
    assert {o["query"] for o in offsets_logged(checkpoint)} == {KEPT_QUERY}


def _failed_naming_4_2(query: Any) -> bool:
    """On pyspark < 4.2 a query restarted after its last batch was committed must fail, saying
    so (it would otherwise start over under a new query id); one whose last batch was not
    committed re-runs it first and goes on."""
    wait_until(lambda: not query.isActive or query.lastProgress is not None, 60,
               "the restarted query's first trigger")
    if query.isActive:
        return False
    assert "pyspark >= 4.2" in str(query.exception()), query.exception()
    return True


# -- resharding --------------------------------------------------------------------------------
def ancestors_of(kinesis: str, stream: str) -> dict[str, set[str]]:
    shards = client("kinesis", kinesis).list_shards(StreamName=stream)["Shards"]
    parents = {s["ShardId"]: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId"))
                              if p] for s in shards}

    def up(shard: str) -> set[str]:
        out: set[str] = set()
        for p in parents.get(shard, []):
            out |= {p} | up(p)
        return out

    return {s: up(s) for s in parents}


def reshard(kinesis: str, stream: str, action: Callable[[Any], None]) -> None:
    from emulators import wait_stream_active

    k = client("kinesis", kinesis)
    before = len(k.list_shards(StreamName=stream)["Shards"])
    action(k)
    # the stream turns UPDATING a moment after the call returns: done once the new shards
    # are listed and it is ACTIVE again
    wait_until(lambda: len(k.list_shards(StreamName=stream)["Shards"]) > before, 60,
               "the resharding's new shards")
    wait_stream_active(k, stream, 60)


def open_shards(kinesis: str, stream: str) -> list[dict[str, Any]]:
    shards = client("kinesis", kinesis).list_shards(StreamName=stream)["Shards"]
    return sorted((s for s in shards if "EndingSequenceNumber" not in s["SequenceNumberRange"]),
                  key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))


@pytest.mark.spark
def test_split_and_merge_during_a_query_lose_nothing_and_parents_come_first(
        spark, env, make_stream, checkpoint):
    stream = make_stream(1)
    producer = KeyedProducer(env["kinesis"], stream)
    producer.start()
    sink = Batches()
    query = start_query(spark, options(stream, env["kinesis"], env["dynamodb"], env["app"]),
                        checkpoint, sink)
    try:
        wait_until(lambda: sum(sink.data().values()) >= 40, 120, "records before the split")
        split_and_merge(env["kinesis"], stream, sink)
        sent = producer.finish()
        wait_until(lambda: set(sink.data()) >= set(sent), 120, "every record put")
    finally:
        producer.halt.set()
        stop(query)
    assert sink.data() == Counter(sent)
    assert not sink.reruns_differing
    assert_parents_first(sink, ancestors_of(env["kinesis"], stream))


def split_and_merge(kinesis: str, stream: str, sink: Batches, within_s: float = 120) -> None:
    """Split the stream's one open shard, wait for records of both children in ``sink``,
    merge them back, and wait for records of the merged shard."""
    (parent,) = open_shards(kinesis, stream)
    reshard(kinesis, stream, lambda k: k.split_shard(
        StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str(2 ** 127)))
    children = [s["ShardId"] for s in open_shards(kinesis, stream)]
    wait_until(lambda: {r[0] for r in sink.rows()} >= set(children), within_s,
               "records from both children")
    reshard(kinesis, stream, lambda k: k.merge_shards(
        StreamName=stream, ShardToMerge=children[0], AdjacentShardToMerge=children[1]))
    (merged,) = open_shards(kinesis, stream)
    wait_until(lambda: merged["ShardId"] in {r[0] for r in sink.rows()}, within_s,
               "records from the merged shard")


def assert_parents_first(sink: Batches, ancestors: dict[str, set[str]]) -> None:
    """One split and one merge (four shards): for each key, every record of an ancestor
    shard came in an earlier batch than any record of its descendants (a batch reads a
    child only once its parents ended in earlier batches)."""
    assert len(ancestors) == 4
    first_batch: dict[tuple[str, str], int] = {}
    last_batch: dict[tuple[str, str], int] = {}
    for batch_id, rows in sink.by_batch.items():
        for shard, _, _, key, _ in rows:
            first_batch[(key, shard)] = min(first_batch.get((key, shard), batch_id), batch_id)
            last_batch[(key, shard)] = max(last_batch.get((key, shard), batch_id), batch_id)
    checked = 0
    for (key, shard), first in first_batch.items():
        for ancestor in ancestors[shard]:
            if (key, ancestor) in last_batch:
                assert last_batch[(key, ancestor)] < first, (key, ancestor, shard)
                checked += 1
    assert checked >= 6


# -- a task that fails after recording its range -----------------------------------------------
class FaultySource(KinesisSource):
    """Test-only: the first read with records of reading >= 2 fails after its range is recorded,
    having written what it read to ``kinesis.test.faultDir``/failed.json."""

    @classmethod
    def name(cls) -> str:
        return "aws-kinesis-faulty"

    def streamReader(self, schema: Any) -> Any:  # noqa: N802
        opts = {k: v for k, v in self.options.items() if k.lower() != "kinesis.test.faultdir"}
        reader = FaultyReader(parse_source_options(opts))
        reader.fault_dir = self.options["kinesis.test.faultDir"]
        return reader


class FaultyReader(KinesisStreamReader):
    fault_dir = ""

    def read(self, partition: Any) -> Iterator[Any]:
        batches = list(super().read(partition))
        rows = [(s, q, u) for b in batches for s, q, u in zip(
            b.column("shardId").to_pylist(), b.column("sequenceNumber").to_pylist(),
            b.column("subSequenceNumber").to_pylist())]
        if rows and partition.ranges[0].batch_ms >= 2:
            try:
                fd = os.open(os.path.join(self.fault_dir, "failed.json"),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    json.dump({"reading": partition.ranges[0].batch_ms, "pid": os.getpid(),
                               "rows": rows}, f)
                raise RuntimeError("injected fault: the range is recorded, the task dies")
        yield from batches


@pytest.mark.matrix
@pytest.mark.spark
def test_task_failing_after_recording_its_range_gives_the_same_records_on_retry(
        spark, env, make_stream, checkpoint, tmp_path):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(FaultySource)
    stream = make_stream(2)
    producer = KeyedProducer(env["kinesis"], stream)
    producer.start()
    sink = Batches()
    opts = options(stream, env["kinesis"], env["dynamodb"], env["app"])
    opts["kinesis.test.faultDir"] = str(tmp_path)
    df = spark.readStream.format("aws-kinesis-faulty").options(**opts).load()
    query = (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
             .trigger(processingTime=TRIGGER).start())
    failed = tmp_path / "failed.json"
    try:
        wait_until(failed.exists, 120, "the injected fault")
        wait_until(lambda: len(sink.by_batch) >= 3, 60, "batches after the fault")
        sent = producer.finish()
        wait_until(lambda: set(sink.data()) >= set(sent), 120, "every record put")
    finally:
        producer.halt.set()
        stop(query)
    assert sink.data() == Counter(sent)
    fault = json.loads(failed.read_text())
    shards = {row[0] for row in fault["rows"]}  # the failed task's shards
    # Reading n is micro-batch n - 1: the retried task delivered exactly what the failed one read.
    delivered = sorted((s, q, u) for s, q, u, _, _ in sink.by_batch[fault["reading"] - 1]
                       if s in shards)
    assert delivered == sorted(tuple(r) for r in fault["rows"])



# -- admission control and Trigger.AvailableNow ------------------------------------------------
@pytest.mark.matrix
@pytest.mark.spark
@needs_4_2
def test_max_records_per_trigger_splits_the_row_limit_across_shards(spark, env, make_stream,
                                                                    put_records, checkpoint):
    stream = make_stream(2)
    sent = [p.data for p in put_records(stream, [f"m-{i}" for i in range(400)])]
    sink = Batches()
    opts = options(stream, env["kinesis"], env["dynamodb"], env["app"],
                   **{"kinesis.maxRecordsPerTrigger": "60"})
    query = start_query(spark, opts, checkpoint, sink, {"processingTime": "200 milliseconds"})
    try:
        wait_until(lambda: sum(sink.data().values()) >= len(sent), 120, "400 records")
    finally:
        stop(query)
    assert sink.data() == Counter(sent)
    assert max(len(rows) for rows in sink.by_batch.values()) <= 60
    # split over the shards each reading reads (a shard the probe found quiet sits out)
    assert all(o["limit"] == 60 // sum(is_read(e) for e in o["shards"].values())
               for o in offsets_logged(checkpoint))


@pytest.mark.matrix
@pytest.mark.spark
@needs_4_2
def test_available_now_reads_what_was_there_and_stops(spark, env, make_stream, put_records,
                                                      checkpoint):
    stream = make_stream(2)
    first = [p.data for p in put_records(stream, [f"a-{i}" for i in range(250)])]
    sink = Batches()
    opts = options(stream, env["kinesis"], env["dynamodb"], env["app"],
                   **{"kinesis.maxFetchRecordsPerShard": "40"})
    query = start_query(spark, opts, checkpoint, sink, {"availableNow": True})
    assert query.awaitTermination(120), "an AvailableNow query stops by itself"
    assert query.exception() is None
    assert sink.data() == Counter(first)
    assert len(sink.by_batch) >= 250 // 80  # 40 per shard and batch: several batches
    second = [p.data for p in put_records(stream, [f"b-{i}" for i in range(30)])]
    query = start_query(spark, opts, checkpoint, sink, {"availableNow": True})
    assert query.awaitTermination(120)
    assert sink.data() == Counter(first + second)


# -- options -----------------------------------------------------------------------------------
BASE = {"kinesis.streamName": "s", "kinesis.endpointUrl": "http://127.0.0.1:1"}


@pytest.mark.unit
def test_unknown_option_is_warned_by_name(caplog):
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.sql"):
        parsed = parse_source_options({**BASE, "kinesis.maxFetchRecordz": "5",
                                       "KINESIS.STARTINGPOSITION": "earliest"})
    assert "kinesis.maxFetchRecordz" in caplog.text            # named as given
    assert "startingposition" not in caplog.text.lower()
    assert parsed.starting_position.type == "TRIM_HORIZON"  # keys are case-insensitive


@pytest.mark.unit
@pytest.mark.parametrize("key,value", [
    ("kinesis.maxFetchRecordsPerShard", "lots"), ("kinesis.maxFetchRecordsPerShard", "0"),
    ("kinesis.startingPosition", "YESTERDAY"), ("kinesis.startingPosition", "AT_TIMESTAMP soon"),
    ("kinesis.failOnDataLoss", "maybe"), ("kinesis.describeShardInterval", "often"),
    ("kinesis.getRecords.numberOfRecordsPerFetch", "20000"), ("kinesis.metadataCommitterType", "S3"),
    ("kinesis.consumerType", "Push"), ("kinesis.clientNumRetries", "-1"),
])
def test_invalid_value_names_the_option(key, value):
    # Keys are case-insensitive; messages spell them as the awslabs README does.
    with pytest.raises(ConfigurationError, match=key.replace(".", r"\.")):
        parse_source_options({**BASE, key.lower(): value})


@pytest.mark.unit
def test_options_map_onto_the_reader_config():
    parsed = parse_source_options({
        **BASE, "kinesis.region": "eu-west-1",
        "kinesis.startingPosition": "AT_TIMESTAMP 2024-05-01T10:00:00Z",
        "kinesis.getRecords.numberOfRecordsPerFetch": "500", "kinesis.clientNumRetries": "2",
        "kinesis.clientRetryIntervalsMs": "250", "kinesis.dynamodb.tableName": "tbl",
        "kinesis.maxFetchRecordsPerShard": "7", "kinesis.failOnDataLoss": "TRUE"})
    assert parsed.config.region_name == "eu-west-1"
    assert parsed.config.max_records == 500
    assert (parsed.config.retry_max_attempts, parsed.config.retry_wait_time_ms) == (3, 250)
    assert parsed.range_table_name == "tbl-kinesis-dstream-ranges"
    assert parsed.starting_position.timestamp == 1714557600.0
    assert parsed.max_fetch_records_per_shard == 7 and parsed.fail_on_data_loss
    assert parsed.config.fail_on_data_loss  # the executors' readers decide on a trimmed start
    assert not parse_source_options(BASE).config.fail_on_data_loss  # the awslabs default


@pytest.mark.unit
def test_sink_options_are_warned_about_as_not_applying_to_a_read(caplog):
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.sql"):
        parsed = parse_source_options({**BASE, "kinesis.sink.maxConnections": "4",
                                       "kinesis.getRecordz.fetchIntervalMs": "1"})
    assert parsed.unknown == ("kinesis.sink.maxConnections", "kinesis.getRecordz.fetchIntervalMs")
    sink_line, typo_line = [r.getMessage() for r in caplog.records]
    assert "'kinesis.sink.maxConnections' is a sink option" in sink_line
    assert "does not apply to reading" in sink_line
    assert "unknown option 'kinesis.getRecordz.fetchIntervalMs'" in typo_line
    assert "did you mean kinesis.getRecords.fetchIntervalMs" in typo_line


@pytest.mark.unit
def test_a_role_with_or_without_an_external_id_reaches_the_reader_config():
    role = {"kinesis.stsRoleArn": "arn:aws:iam::1:role/r", "kinesis.stsSessionName": "sess"}
    config = parse_source_options({**BASE, **role}).config
    assert (config.sts_assume_role_arn, config.sts_session_name, config.sts_external_id) == \
        ("arn:aws:iam::1:role/r", "sess", None)
    config = parse_source_options({**BASE, **role, "kinesis.stsExternalId": "ext",
                                   "kinesis.stsEndpointUrl": "http://127.0.0.1:2"}).config
    assert (config.sts_external_id, config.sts_endpoint) == ("ext", "http://127.0.0.1:2")
    for given, named in (({"kinesis.stsExternalId": "ext"}, "kinesis.stsExternalId"),
                         ({"kinesis.stsSessionName": "sess"}, "kinesis.stsSessionName"),
                         ({**role, "kinesis.stsSessionName": "s"}, "kinesis.stsSessionName")):
        with pytest.raises(ConfigurationError, match=named.replace(".", r"\.")):
            parse_source_options({**BASE, **given})


@pytest.mark.unit
def test_qubole_short_names_are_aliases():
    parsed = parse_source_options({
        "streamName": "s", "endpointUrl": "http://127.0.0.1:1", "regionName": "eu-west-2",
        "awsAccessKeyId": "AK", "awsSecretKey": "SK", "awsSTSRoleARN": "arn:aws:iam::1:role/r",
        "awsSTSSessionName": "reader", "startingposition": "earliest"})
    config = parsed.config
    assert (config.stream_name, config.kinesis_endpoint, config.region_name) == \
        ("s", "http://127.0.0.1:1", "eu-west-2")
    assert (config.aws_access_key_id, config.aws_secret_key) == ("AK", "SK")
    assert (config.sts_assume_role_arn, config.sts_session_name) == ("arn:aws:iam::1:role/r",
                                                                     "reader")
    assert parsed.starting_position.type == "TRIM_HORIZON" and parsed.unknown == ()
    with pytest.raises(ConfigurationError, match=r"kinesis\.startingPosition \(as startingPosition\)"):
        parse_source_options({**BASE, "startingPosition": "YESTERDAY"})
    with pytest.raises(ConfigurationError, match=r"kinesis\.streamName: given twice"):
        parse_source_options({**BASE, "streamName": "other"})


@pytest.mark.unit
def test_required_options_and_subscribe_to_shard(monkeypatch, tmp_path):
    with pytest.raises(ConfigurationError, match=r"kinesis\.streamName \(or kinesis\.streamArn\) "
                       "is required"):
        parse_source_options({"kinesis.endpointUrl": "http://x"})
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_KINESIS", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ConfigurationError, match=r"kinesis\.region is required.*AWS_REGION"):
        parse_source_options({"kinesis.streamName": "s"})
    with pytest.raises(ConfigurationError, match=r"consumerName is required.*SubscribeToShard"):
        parse_source_options({**BASE, "kinesis.consumerType": "SubscribeToShard"})


@pytest.mark.unit
def test_the_region_comes_from_the_environment_then_the_profile(monkeypatch, tmp_path):
    """Databricks' streamName alone: the region of AWS_REGION, AWS_DEFAULT_REGION or the
    profile, and its public endpoint (or AWS_ENDPOINT_URL_KINESIS, as boto3 reads it)."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_KINESIS", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    profile = tmp_path / "config"
    profile.write_text("[default]\nregion = ap-south-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(profile))

    def read() -> tuple[str, str | None]:
        config = parse_source_options({"streamName": "s"}).config
        return config.region_name, config.kinesis_endpoint

    assert read() == ("ap-south-1", "https://kinesis.ap-south-1.amazonaws.com")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    assert read() == ("eu-west-3", "https://kinesis.eu-west-3.amazonaws.com")
    monkeypatch.setenv("AWS_REGION", "eu-north-1")
    assert read() == ("eu-north-1", "https://kinesis.eu-north-1.amazonaws.com")
    monkeypatch.setenv("AWS_ENDPOINT_URL_KINESIS", "http://127.0.0.1:4567")
    assert read() == ("eu-north-1", "http://127.0.0.1:4567")
    # an option wins over the environment
    config = parse_source_options({"streamName": "s", "region": "us-west-2"}).config
    assert config.region_name == "us-west-2"


ARN = "arn:aws:kinesis:eu-west-1:111122223333:stream/orders"


@pytest.mark.unit
def test_a_stream_arn_names_the_stream_and_the_kinesis_region(monkeypatch):
    """Databricks' streamARN: the stream's name and Kinesis' region come from the ARN; the
    region of DynamoDB and STS is kinesis.region's when given, else the ARN's too."""
    monkeypatch.delenv("AWS_ENDPOINT_URL_KINESIS", raising=False)
    config = parse_source_options({"streamARN": ARN}).config
    assert (config.stream_name, config.stream_arn, config.region_name, config.kinesis_region,
            config.kinesis_endpoint) == ("orders", ARN, "eu-west-1", "eu-west-1",
                                         "https://kinesis.eu-west-1.amazonaws.com")
    config = parse_source_options({"streamARN": ARN, "region": "us-east-2"}).config
    assert (config.region_name, config.kinesis_region) == ("us-east-2", "eu-west-1")
    assert config.kinesis_endpoint == "https://kinesis.eu-west-1.amazonaws.com"
    # the same stream named twice is fine; two different ones are refused
    assert parse_source_options({"streamARN": ARN, "streamName": "orders"}).config.stream_arn == ARN
    with pytest.raises(ConfigurationError, match=r"kinesis\.streamName 'other' and "
                       r"kinesis\.streamArn .* name different streams"):
        parse_source_options({"streamARN": ARN, "streamName": "other"})
    with pytest.raises(ConfigurationError, match=r"kinesis\.streamArn: 'orders' is not a Kinesis "
                       "stream ARN"):
        parse_source_options({"streamARN": "orders"})
    # a list: each stream's reader config carries its own ARN
    second = "arn:aws:kinesis:eu-west-1:444455556666:stream/refunds"
    source = parse_source_options({"kinesis.streamArn": f"{ARN}, {second}"})
    assert {name: c.stream_arn for name, c in source.stream_configs.items()} == \
        {"orders": ARN, "refunds": second}
    with pytest.raises(ConfigurationError, match="one query reads the streams of one region"):
        parse_source_options({"streamARN": f"{ARN},{second.replace('eu-west-1', 'us-east-1')}"})
    # the sink writes by ARN too, to one stream
    sink = parse_options({"streamARN": ARN}).config
    assert (sink.stream_name, sink.stream_arn, sink.kinesis_region) == ("orders", ARN, "eu-west-1")
    with pytest.raises(ConfigurationError, match="a write goes to one stream"):
        parse_options({"streamARN": f"{ARN},{second}"})


@pytest.mark.unit
def test_kinesis_region_is_kept_apart_from_the_region_of_dynamodb_and_sts(monkeypatch):
    """awslabs' kinesis.kinesisRegion signs Kinesis; kinesis.region DynamoDB and STS."""
    monkeypatch.delenv("AWS_ENDPOINT_URL_KINESIS", raising=False)
    config = parse_source_options({"kinesis.streamName": "s", "kinesis.region": "us-east-1",
                                   "kinesis.kinesisRegion": "eu-central-1"}).config
    assert (config.region_name, config.kinesis_region, config.kinesis_endpoint) == \
        ("us-east-1", "eu-central-1", "https://kinesis.eu-central-1.amazonaws.com")
    alone = parse_source_options({"kinesis.streamName": "s",
                                  "kinesis.kinesisRegion": "eu-central-1"}).config
    assert (alone.region_name, alone.kinesis_region) == ("eu-central-1", "eu-central-1")


@pytest.mark.matrix
@pytest.mark.spark
def test_bad_option_fails_the_load_in_spark_naming_it(spark):
    reader = spark.readStream.format("aws-kinesis").options(
        **BASE, **{"kinesis.maxFetchRecordsPerShard": "lots"})
    with pytest.raises(Exception, match=r"kinesis\.maxFetchRecordsPerShard: not a whole"):
        reader.load()
    reader = spark.readStream.format("aws-kinesis").options(
        **BASE, **{"kinesis.consumerType": "SubscribeToShard"})
    with pytest.raises(Exception, match=r"kinesis\.consumerName is required"):
        reader.load()


# -- offsets: pure logic -----------------------------------------------------------------------
def shard(shard_id: str, *parents: str, closed: bool = False) -> Any:
    from kinesis_dstream.aws.kinesis import Shard

    return Shard(shard_id, parents[0] if parents else None, parents[1] if len(parents) > 1 else None,
                 "0", "1", "1", "2" if closed else None)


@pytest.mark.unit
def test_children_wait_until_every_parent_ended():
    start = {"at": "TRIM_HORIZON"}
    listing = [shard("a", closed=True), shard("b", closed=True), shard("c", "a", "b")]
    shards = next_shards({"a": {"after": "5", "sub": 0}, "b": {"ended": True}},
                                    listing, start, False)
    assert shards["c"] == {"at": "TRIM_HORIZON", "wait": ["a"]}
    assert [s for s, e in shards.items() if is_readable(e)] == ["a"]
    shards = next_shards({**shards, "a": {"ended": True}}, listing, start, False)
    assert shards["c"] == {"at": "TRIM_HORIZON"}
    # A grandchild waits for its parent even while that parent itself still waits.
    listing.append(shard("d", "c"))
    shards = next_shards({"a": {"after": "5", "sub": 0}, "b": {"ended": True},
                                     "c": {"at": "TRIM_HORIZON", "wait": ["a"]}}, listing, start,
                                    False)
    assert shards["d"]["wait"] == ["c"]


@pytest.mark.unit
def test_a_shard_gone_before_its_end_is_data_loss():
    with pytest.raises(DataLossError, match="shard x"):
        next_shards({"x": {"after": "5", "sub": 0}}, [], {"at": "TRIM_HORIZON"}, True)
    assert next_shards({"x": {"after": "5", "sub": 0}}, [], {}, False) == \
        {"x": {"ended": True}}
    assert next_shards({"x": {"ended": True}}, [], {}, True) == {}


@pytest.mark.unit
def test_offsets_are_plain_json_in_a_fixed_order():
    from kinesis_dstream.aws.range_table import BatchRange

    seq = "49654826129375727396155516464345066431716066104036425730"
    entry = advance({"at": "TRIM_HORIZON"}, BatchRange(
        "k", "s", 1, ExtendedSequenceNumber("TRIM_HORIZON"), None, ExtendedSequenceNumber(seq, 3), 9))
    assert entry == {"after": seq, "sub": 3}
    offset = make_offset("q", 2, 10, {"z": entry, "a": {"ended": True}})
    assert json.dumps(offset) == json.dumps(json.loads(json.dumps(offset)))
    assert list(offset) == ["v", "query", "batch", "limit", "shards"]
    assert list(offset["shards"]) == ["a", "z"]
    assert position_of(entry) == (ExtendedSequenceNumber(seq, 3), None)


# The awslabs connector's source schema (its KinesisClientFactory.kinesisSchema): StructFields
# with Spark's default nullability.
AWSLABS_SCHEMA = StructType([
    StructField("data", BinaryType()), StructField("streamName", StringType()),
    StructField("partitionKey", StringType()), StructField("sequenceNumber", StringType()),
    StructField("approximateArrivalTimestamp", TimestampType())])


@pytest.mark.unit
@pytest.mark.matrix
def test_aws_kinesis_rows_start_with_the_awslabs_schema_exactly():
    import pyarrow as pa

    from kinesis_dstream.records import Record

    declared = spark_schema("awslabs")
    assert declared.fields[:5] == AWSLABS_SCHEMA.fields  # names, order, types, nullability
    assert declared.fieldNames()[5:] == ["shardId", "subSequenceNumber"]
    assert declared["subSequenceNumber"].dataType == LongType()
    assert KinesisSource({"kinesis.streamName": "s", "kinesis.region": "us-east-1"}).schema() \
        == declared
    # The Arrow batches read() yields: the declared schema, nullability included.
    assert arrow_schema() == pa.schema(
        [pa.field(f.name, t, nullable=True) for f, t in zip(declared.fields, [
            pa.binary(), pa.string(), pa.string(), pa.string(), pa.timestamp("us", tz="UTC"),
            pa.string(), pa.int64()])])
    record = Record(b"x", "pk", "1", 2, 1_700_000_000_123, "shardId-0")
    batch = to_arrow([record], "s", arrow_schema())
    assert batch.schema.equals(arrow_schema())
    arrow_row = batch.to_pylist()[0]
    assert arrow_row["approximateArrivalTimestamp"].timestamp() == 1_700_000_000.123
    # kinesis.arrowBatches false: tuples in the same order.
    (row,) = _to_tuples("awslabs")([record], ConsumerConfig("a", "s", region_name="us-east-1"))
    assert row == tuple(arrow_row.values())
    assert row[:4] == (b"x", "s", "pk", "1") and row[5:] == ("shardId-0", 2)


@pytest.mark.spark
def test_aws_kinesis_df_schema_is_the_awslabs_schema_in_its_first_five_fields(spark, env):
    """What Spark declares for a query on the registered source, not only our function."""
    opts = {"kinesis.streamName": "s", "kinesis.endpointUrl": env["kinesis"],
            "kinesis.region": "us-east-1"}  # load() reads nothing
    df = spark.readStream.format("aws-kinesis").options(**opts).load()
    assert df.schema.fields[:5] == AWSLABS_SCHEMA.fields
    assert df.columns[5:] == ["shardId", "subSequenceNumber"]


@pytest.mark.matrix
@pytest.mark.spark  # a Spark driver in a process of its own
def test_a_query_naming_only_its_stream_reads_with_region_and_endpoint_from_the_environment(
        env, make_stream, put_records, tmp_path, monkeypatch):
    """kinesis.streamName alone: the region from AWS_REGION, the endpoints from
    AWS_ENDPOINT_URL_KINESIS / _DYNAMODB, LATEST by default; every record put after the first
    trigger is read once. The source's driver side runs in a Python process that Spark's JVM
    starts, with the JVM's environment: the variables are set before the job starts, as a user
    exports them, so the driver is a process of its own (the session's JVM started earlier)."""
    stream = make_stream(2)
    monkeypatch.delenv("AWS_DEFAULT_REGION")  # AWS_REGION alone names it
    monkeypatch.setenv("AWS_ENDPOINT_URL_KINESIS", env["kinesis"])
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", env["dynamodb"])
    opts = {"kinesis.streamName": stream}
    source = parse_source_options(opts)
    assert (source.config.region_name, source.config.kinesis_endpoint) == ("us-east-1",
                                                                           env["kinesis"])
    put_records(stream, [f"before-{i}" for i in range(30)])
    out_dir, checkpoint = tmp_path / "out", str(tmp_path / "checkpoint")
    out_dir.mkdir()
    log_path = tmp_path / "driver.log"
    driver = spawn_driver(out_dir, checkpoint, opts, log_path)
    read = lambda: Counter(r[4].encode() for files in batch_files(out_dir).values()  # noqa: E731
                           for r in files[0])
    try:
        wait_until(lambda: (Path(checkpoint) / "offsets" / "0").exists()
                   or driver.poll() is not None, 120, "the first trigger")
        after = put_records(stream, [(f"k{i % 5}", f"after-{i}") for i in range(80)])
        wait_until(lambda: sum(read().values()) >= len(after) or driver.poll() is not None, 90,
                   "80 records")
    finally:
        (out_dir / "STOP").touch()
        try:
            driver.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        dynamodb = client("dynamodb", env["dynamodb"])
        try:  # the default range table: this test's alone
            dynamodb.delete_table(TableName=source.range_table_name)
        except dynamodb.exceptions.ResourceNotFoundException:
            pass  # never created: the query failed before
    assert sum(read().values()) >= len(after), log_path.read_text()[-3000:]
    assert read() == Counter(p.data for p in after)  # every record once, none put before


# -- kill -9 of the driver ---------------------------------------------------------------------
def spawn_driver(out_dir: Path, checkpoint: str, opts: dict[str, str], log_path: Path,
                 master: str = "local[2]", **environment: str) -> Any:
    """The subprocess driver (``_driver_main``) on ``master``, ``environment`` added to
    ours (the JVM and the source's process read it)."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p),
        SQL_DRIVER_MASTER=master, **environment)
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, __file__, "driver", str(out_dir), checkpoint, json.dumps(opts)],
            env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True)


def batch_files(out_dir: Path) -> dict[int, list[list]]:
    """Every batch the subprocess driver wrote (a re-run batch writes a second file)."""
    found: dict[int, list[list]] = {}
    for path in out_dir.glob("batch-*.json"):
        found.setdefault(int(path.name.split("-")[1]), []).append(json.loads(path.read_text()))
    return found


def delivered_by(out_dir: Path) -> Counter:
    """Each record's data, counted once per batch (a batch run again counts once)."""
    return Counter(r[4] for files in batch_files(out_dir).values() for r in files[0])


def kill_9_and_restart(out_dir: Path, checkpoint: str, opts: dict[str, str], log_path: Path,
                       kinesis: str, stream: str, timeout_s: float, master: str = "local[2]",
                       before_kill: Callable[[], None] = lambda: None,
                       **environment: str) -> tuple[list[bytes], bool]:
    """A subprocess driver reads while a producer writes; after three batches (and
    ``before_kill``) it is killed -9 with its JVM, executors and Python workers, and a new
    one restarts from ``checkpoint`` until every record put has come or it ends. What was
    put, and whether the restarted driver was still running then; both drivers are stopped
    on return (a STOP file, then kill)."""
    producer = KeyedProducer(kinesis, stream)
    producer.start()
    driver = spawn_driver(out_dir, checkpoint, opts, log_path, master, **environment)
    try:
        wait_until(lambda: len(batch_files(out_dir)) >= 3 or driver.poll() is not None,
                   timeout_s, "three batches from the first driver")
        assert driver.poll() is None, log_path.read_text()[-3000:]
        before_kill()
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
        driver = spawn_driver(out_dir, checkpoint, opts, log_path, master, **environment)
        sent_at_restart = len(producer.sent)
        wait_until(lambda: len(producer.sent) >= sent_at_restart + 100, 60, "more records")
        sent = producer.finish()
        wait_until(lambda: set(delivered_by(out_dir)) >= {s.decode() for s in sent}
                   or driver.poll() is not None, timeout_s, "every record put")
        running = driver.poll() is None
    finally:
        producer.halt.set()
        (out_dir / "STOP").touch()
        try:
            driver.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
    return sent, running


@pytest.mark.spark  # Spark drivers in processes of their own
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["polling", "fanout"])
def test_driver_killed_9_restarts_from_checkpoint_losing_nothing(env, make_stream, tmp_path,
                                                                  mode, request):
    """kill -9 of the driver (its JVM, executors and Python workers): a new driver restarts
    the query from its checkpointLocation; a batch run again reads the same records, and
    every record comes once. By fan-out the dead driver's subscriptions die with it, and the
    new one's tasks subscribe again (within the 5 s rule: waited out)."""
    stream = make_stream(2)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    checkpoint = str(tmp_path / "checkpoint")
    kinesis = env["kinesis"]
    extra: dict[str, str] = {}
    if mode == "fanout":
        front = request.getfixturevalue("make_fanout_front")(lifetime_s=20.0)
        kinesis = front.endpoint
        extra = {"kinesis.consumerType": "SubscribeToShard",
                 "kinesis.consumerName": f"{env['app']}-c"}
    opts = options(stream, kinesis, env["dynamodb"], env["app"], **extra)
    log_path = tmp_path / "driver.log"
    sent, running = kill_9_and_restart(out_dir, checkpoint, opts, log_path, kinesis, stream, 180)
    if not PYSPARK_4_2 and not running:
        # pyspark < 4.2: a query whose last batch was committed cannot resume; it fails
        # saying so rather than start over (see _failed_naming_4_2)
        assert "pyspark >= 4.2" in log_path.read_text(), log_path.read_text()[-3000:]
        return
    assert running, log_path.read_text()[-3000:]
    batches = batch_files(out_dir)
    for batch_id, files in batches.items():  # a batch run again read the same records
        assert all(f == files[0] for f in files), batch_id
    assert delivered_by(out_dir) == Counter(s.decode() for s in sent)
    if mode == "fanout":  # read by subscription, before the kill and after the restart
        shards = list_shard_ids(env["kinesis"], stream)
        assert all(front.count("SubscribeToShard", s) >= 2 for s in shards), front.calls


def _driver_main(out_dir: str, checkpoint: str, opts_json: str) -> None:
    """The subprocess driver: on SQL_DRIVER_MASTER (local[2] unless set), foreachBatch
    writes batch-<id>-<uuid>.json files."""
    from pyspark.sql import SparkSession

    logging.basicConfig(level=logging.WARNING)
    master = os.environ.get("SQL_DRIVER_MASTER") or "local[2]"
    spark = (SparkSession.builder.master(master).appName("sql-source-recovery")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable).getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)

    def write(df: Any, batch_id: int) -> None:
        rows = sorted([r.shardId, r.sequenceNumber, r.subSequenceNumber, r.partitionKey,
                       bytes(r.data).decode()] for r in df.collect())
        path = Path(out_dir) / f"batch-{batch_id}-{uuid.uuid4().hex[:8]}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, path)

    query = (spark.readStream.format("aws-kinesis").options(**json.loads(opts_json)).load()
             .writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
             .trigger(processingTime=TRIGGER).start())
    stop_file = Path(out_dir) / "STOP"
    while not stop_file.exists() and query.isActive:
        time.sleep(0.2)
    query.stop()
    spark.stop()


if __name__ == "__main__" and sys.argv[1:2] == ["driver"]:
    _driver_main(*sys.argv[2:5])


def failure_within_30_s(spark: Any, fmt: str, opts: dict[str, str], checkpoint: str) -> str:
    """The error a query over ``opts`` fails with, which it must do within 30 s."""
    began = time.monotonic()
    query = (spark.readStream.format(fmt).options(**opts).load()
             .writeStream.format("noop").option("checkpointLocation", checkpoint).start())
    try:
        with pytest.raises(Exception) as failure:
            query.awaitTermination(30)
    finally:
        query.stop()
    assert time.monotonic() - began < 30
    return str(failure.value)


@pytest.mark.matrix
@pytest.mark.spark
def test_a_missing_stream_fails_the_query_within_30_s_naming_it(spark, env, checkpoint):
    message = failure_within_30_s(spark, "aws-kinesis", options(
        "no-such-stream-9c1d", env["kinesis"], env["dynamodb"], env["app"]), checkpoint)
    assert "'no-such-stream-9c1d'" in message and "us-east-1" in message, message[-1500:]


# -- format("kinesis") with the Databricks connector's option names ---------------------------
@pytest.mark.spark
def test_databricks_option_names_read_every_record_once_from_trim_horizon(
        spark, env, make_stream, put_records, checkpoint):
    """A job written for Databricks' connector, unchanged: its option names only. Records put
    before the query started are read (initialPosition trim_horizon is honoured, not LATEST)."""
    stream = make_stream(2)
    before = [p.data for p in put_records(stream, [f"before-{i}" for i in range(120)])]
    opts = {"streamName": stream, "region": "us-east-1", "endpoint": env["kinesis"],
            "initialPosition": "trim_horizon", "awsAccessKey": os.environ["AWS_ACCESS_KEY_ID"],
            "awsSecretKey": os.environ["AWS_SECRET_ACCESS_KEY"],
            # Not Databricks' (it has no range table): the emulator's DynamoDB, as on AWS the
            # region's would be.
            "kinesis.dynamodb.endpointUrl": env["dynamodb"]}
    sink = Batches()
    df = spark.readStream.format("kinesis").options(**opts).load()
    query = (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
             .trigger(processingTime=TRIGGER).start())
    try:
        wait_until(lambda: sum(sink.data().values()) >= len(before), 120, "records put before")
        after = [p.data for p in put_records(stream, [f"after-{i}" for i in range(60)])]
        wait_until(lambda: sum(sink.data().values()) >= len(before) + len(after), 60,
                   "records put after")
    finally:
        stop(query)
    assert sink.data() == Counter(before + after)  # every record exactly once
    assert not sink.reruns_differing
