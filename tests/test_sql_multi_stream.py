"""Several streams in one SQL source: ``streamName`` a comma-separated list (Databricks').

One query of real Spark over two kinesis-local streams (2 and 3 shards) with Databricks'
option names on ``format("kinesis")``: through a split in one stream and a restart, every
record comes exactly once and each row names the stream and shard it was put on. The rest
are the pure parts (offset layouts, the stream list, the row layouts) and a missing stream.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any

import pytest

from spark_helpers import wait_until
from test_sql_source import (  # noqa: F401 - env and checkpoint are fixtures
    PYSPARK_4_2,
    TRIGGER,
    Batches,
    _failed_naming_4_2,
    ancestors_of,
    checkpoint,
    env,
    failure_within_30_s,
    offsets_logged,
    open_shards,
    reshard,
)

from kinesis_dstream import cli
from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.sql.initial_positions import lease_shard_id
from kinesis_dstream.sql.offsets import StreamSet, make_offset
from kinesis_dstream.sql.options import parse_options, parse_source_options
from kinesis_dstream.sql.partition_reader import DATABRICKS_COLUMNS, arrow_schema, to_arrow

KEYS = 16
DATABRICKS = ["partitionKey", "data", "stream", "shardId", "sequenceNumber",
              "approximateArrivalTimestamp"]


# The sink's rows: (stream, shardId, sequenceNumber, sub, data), by batch id.
BY_STREAM = ("stream", "shardId", "sequenceNumber", "subSequenceNumber")


class TwoStreamProducer(threading.Thread):
    """Puts 8 records every 0.2 s on each stream under 16 partition keys (each child of the
    split has some), data unique; ``landed`` says where each went: data -> (stream, shard)."""

    def __init__(self, endpoint: str, streams: list[str]) -> None:
        super().__init__(name="two-stream-producer", daemon=True)
        self.endpoint, self.streams = endpoint, streams
        self.landed: dict[bytes, tuple[str, str]] = {}
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from emulators import put_records

        n = 0
        try:
            while not self.halt.wait(0.2):
                for stream in self.streams:
                    batch = [(f"key{(n + i) % KEYS}", f"{stream}-{n + i:06d}")
                             for i in range(8)]
                    for put in put_records(self.endpoint, stream, batch):
                        self.landed[put.data] = (stream, put.shard_id)
                n += 8
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            self.error = exc

    def finish(self) -> dict[bytes, tuple[str, str]]:
        self.halt.set()
        self.join(30)
        if self.error is not None:
            raise self.error
        return dict(self.landed)


def databricks_options(streams: str, env: dict[str, str], **extra: str) -> dict[str, str]:
    return {"streamName": streams, "region": "us-east-1", "endpoint": env["kinesis"],
            "initialPosition": "trim_horizon", "awsAccessKey": os.environ["AWS_ACCESS_KEY_ID"],
            "awsSecretKey": os.environ["AWS_SECRET_ACCESS_KEY"],
            # Not Databricks' (it has no range table): the emulator's DynamoDB.
            "kinesis.dynamodb.endpointUrl": env["dynamodb"],
            "kinesis.dynamodb.tableName": env["app"], **extra}


def start(spark: Any, opts: dict[str, str], checkpoint: str, sink: Batches) -> Any:
    df = spark.readStream.format("kinesis").options(**opts).load()
    assert df.columns == DATABRICKS + ["subSequenceNumber"]
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
            .trigger(processingTime=TRIGGER).start())


@pytest.mark.spark
@pytest.mark.timeout(600)  # a split and a restart: two queries, under a shared machine's load
def test_two_streams_in_one_query_through_a_split_and_a_restart(spark, env, make_stream,
                                                                 checkpoint, capsys):
    two, three = make_stream(2), make_stream(3)
    # shardsPerTask 2: tasks hold shards of both streams
    opts = databricks_options(f"{two}, {three}", env, shardsPerTask="2")
    producer = TwoStreamProducer(env["kinesis"], [two, three])
    producer.start()
    sink = Batches(BY_STREAM)
    query = start(spark, opts, checkpoint, sink)
    try:
        wait_until(lambda: {r[0] for r in sink.rows()} == {two, three} or not query.isActive,
                   120, "rows of both streams")
        parent = open_shards(env["kinesis"], three)[0]
        hashes = parent["HashKeyRange"]
        middle = (int(hashes["StartingHashKey"]) + int(hashes["EndingHashKey"])) // 2
        reshard(env["kinesis"], three, lambda k: k.split_shard(
            StreamName=three, ShardToSplit=parent["ShardId"], NewStartingHashKey=str(middle)))
        children = {s for s, up in ancestors_of(env["kinesis"], three).items()
                    if parent["ShardId"] in up}
        assert len(children) == 2
        wait_until(lambda: {(r[0], r[1]) for r in sink.rows()} >= {(three, c) for c in children}
                   or not query.isActive, 120, "records from both children of the split")
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    sent_at_stop = len(producer.landed)
    wait_until(lambda: len(producer.landed) >= sent_at_stop + 60, 30, "records put while stopped")
    query = start(spark, opts, checkpoint, sink)
    restarted = PYSPARK_4_2 or not _failed_naming_4_2(query)
    try:
        if restarted:
            wait_until(lambda: len(producer.landed) >= sent_at_stop + 120, 30, "more records")
        landed = producer.finish()
        if restarted:
            wait_until(lambda: set(sink.data()) >= set(landed) or not query.isActive, 120,
                       "every record put")
    finally:
        producer.halt.set()
        query.stop()
    assert query.exception() is None or not restarted, query.exception()
    got = sink.data()
    assert max(got.values()) == 1, [d for d, n in got.items() if n > 1][:5]  # none twice
    if restarted:
        assert set(got) == set(landed)  # every record put: exactly once
    assert not sink.reruns_differing
    # Each row names the stream and the shard its record was put on.
    wrong = [(r[4], r[:2], landed[r[4]]) for r in sink.rows() if landed[r[4]] != r[:2]]
    assert not wrong, wrong[:5]
    # Parents before children in the split stream: a child's first record in a later batch
    # than the parent's last, key by key.
    ancestors = ancestors_of(env["kinesis"], three)
    first: dict[tuple[str, str], int] = {}
    last: dict[tuple[str, str], int] = {}
    for batch_id, rows in sink.by_batch.items():
        for stream, shard, _, _, data in rows:
            if stream == three:
                key = (producer_key(data), shard)
                first[key] = min(first.get(key, batch_id), batch_id)
                last[key] = max(last.get(key, batch_id), batch_id)
    checked = [(k, s) for (k, s), b in first.items() for a in ancestors[s]
               if (k, a) in last and last[(k, a)] < b]
    broken = [(k, s, a) for (k, s), b in first.items() for a in ancestors[s]
              if (k, a) in last and last[(k, a)] >= b]
    assert not broken and len(checked) >= 2, (broken, len(checked))
    # The checkpoint holds per-stream offsets, under one query id.
    logged = offsets_logged(checkpoint)
    assert len({o["query"] for o in logged}) == 1
    assert logged[-1]["v"] == 2 and set(logged[-1]["streams"]) == {two, three}
    assert len(logged[-1]["streams"][three]) == 5
    # checkpoint show names each shard with its stream
    assert cli.main(["checkpoint", "show", checkpoint, "--json"]) == 0
    (source,) = json.loads(capsys.readouterr().out)["batches"][-1]["sources"]
    assert source["kinesis_dstream"] and {s.split("/")[0] for s in source["shards"]} == {two, three}


def producer_key(data: bytes) -> int:
    """The partition key TwoStreamProducer gave a record (from its number)."""
    return int(data.rsplit(b"-", 1)[1]) % KEYS


@pytest.mark.spark
def test_a_missing_stream_in_the_list_fails_the_query_naming_it(spark, env, make_stream,
                                                                checkpoint):
    there = make_stream(1)
    message = failure_within_30_s(
        spark, "kinesis", databricks_options(f"{there},no-such-stream-7f2e", env), checkpoint)
    assert "stream 'no-such-stream-7f2e', one of the streams the query reads" in message, \
        message[-1500:]


# -- the pure parts --------------------------------------------------------------------------
BASE = {"kinesis.endpointUrl": "http://127.0.0.1:1", "kinesis.region": "us-east-1"}


@pytest.mark.unit
def test_stream_name_takes_a_list_and_refuses_a_bad_one():
    options = parse_source_options({**BASE, "streamName": " orders, clicks "})
    assert options.stream_names == ("orders", "clicks")
    assert {n: c.stream_name for n, c in options.stream_configs.items()} == {
        "orders": "orders", "clicks": "clicks"}
    assert parse_source_options({**BASE, "kinesis.streamName": "one"}).stream_names == ("one",)
    for bad, says in (("a,,b", "is not a Kinesis stream name"), ("a,b,a", "listed twice")):
        with pytest.raises(ConfigurationError, match=says):
            parse_source_options({**BASE, "streamName": bad})
    with pytest.raises(ConfigurationError, match="a write goes to one stream"):
        parse_options({**BASE, "kinesis.streamName": "a,b"})


@pytest.mark.unit
def test_offsets_are_per_stream_and_shard_and_one_stream_keeps_its_layout():
    one, two = StreamSet(("s",)), StreamSet(("b", "a"))
    entry = {"after": "5", "sub": 0}
    assert one.offset("q", 1, 10, {"x": entry}) == make_offset("q", 1, 10, {"x": entry})
    offset = two.offset("q", 1, 10, {"b/x": entry, "a/x": {"ended": True}, "a/w": entry})
    assert list(offset) == ["v", "query", "batch", "limit", "streams"] and offset["v"] == 2
    assert offset["streams"] == {"a": {"w": entry, "x": {"ended": True}}, "b": {"x": entry}}
    assert list(offset["streams"]) == ["a", "b"] and list(offset["streams"]["a"]) == ["w", "x"]
    assert two.flatten(offset) == {"a/w": entry, "a/x": {"ended": True}, "b/x": entry}
    assert StreamSet(("a",)).flatten(offset) == {"w": entry, "x": {"ended": True}}  # b dropped
    # an offset of one stream (every version before) resumes a query of that one stream
    assert one.flatten(make_offset("q", 1, 10, {"x": entry})) == {"x": entry}
    with pytest.raises(ConfigurationError, match="read one stream, which they do not name"):
        two.flatten(make_offset("q", 1, 10, {"x": entry}))


@pytest.mark.unit
def test_databricks_rows_match_their_declared_schema():
    from kinesis_dstream.records import Record

    schema = arrow_schema("databricks")
    assert schema.names == list(DATABRICKS_COLUMNS) == DATABRICKS + ["subSequenceNumber"]
    batch = to_arrow([Record(b"x", "pk", "1", 2, 1_700_000_000_123, "shardId-0")], "s", schema)
    assert batch.schema.equals(schema)
    assert batch.to_pylist()[0] | {"approximateArrivalTimestamp": None} == {
        "partitionKey": "pk", "data": b"x", "stream": "s", "shardId": "shardId-0",
        "sequenceNumber": "1", "approximateArrivalTimestamp": None, "subSequenceNumber": 2}


@pytest.mark.unit
def test_a_query_of_several_streams_takes_only_multi_stream_lease_keys():
    assert lease_shard_id("shardId-1", "a") == "shardId-1"
    assert lease_shard_id("shardId-1", "a", several=True) is None
    assert lease_shard_id("1:a:17:shardId-1", "a", several=True) == "shardId-1"
    assert lease_shard_id("1:b:17:shardId-1", "a", several=True) is None



# -- failures name the stream: two streams can both have shardId-000000000000 ---------------------
SHARD = "shardId-000000000000"


@pytest.mark.unit
def test_a_shard_gone_unread_fails_the_query_naming_its_stream():
    from kinesis_dstream.aws.kinesis import Shard
    from kinesis_dstream.errors import DataLossError
    from kinesis_dstream.sql.reader import KinesisStreamReader

    reader = KinesisStreamReader(parse_source_options(
        {**BASE, "streamName": "a,b", "failOnDataLoss": "true"}))
    listed = Shard(SHARD, None, None, "0", "1", "1", None)
    positions = {f"a/{SHARD}": {"after": "5", "sub": 0}, f"b/{SHARD}": {"after": "7", "sub": 0}}
    with pytest.raises(DataLossError, match=f"shard b/{SHARD} is no longer listed"):
        reader._next_shards(positions, {"a": [listed], "b": []})


@pytest.mark.unit
def test_a_read_fault_is_logged_naming_the_stream_apart_from_the_same_shard_of_another(
        monkeypatch, caplog):
    import logging

    from kinesis_dstream.errors import TransientServiceError
    from kinesis_dstream.records import ExtendedSequenceNumber as ESN
    from kinesis_dstream.records import GetRecordsResult
    from kinesis_dstream.retrieval import read_loop

    class Failing:
        """A record source whose every read fails (its stream's endpoint is down)."""

        shard_iterator_calls, data_lost, iterator = 0, None, None

        def initialize(self, checkpoint: ESN) -> None:
            pass

        def get_records(self) -> GetRecordsResult:
            raise TransientServiceError("endpoint down")

        def close(self) -> None:
            pass

    monkeypatch.setattr(read_loop, "open_source", lambda *a, **k: Failing())
    options = parse_source_options({**BASE, "streamName": "a,b"})
    caplog.set_level(logging.WARNING, logger="kinesis_dstream")
    for stream in ("a", "b"):  # the same shard id in both: one fault log each
        reading = read_loop.read(None, options.stream_configs[stream], SHARD,  # type: ignore[arg-type]
                                 ESN("4"), None, time_budget_s=0.0, sleep=lambda s: None)
        assert reading.records == [] and reading.faults == 1
    failing = [r.getMessage() for r in caplog.records if " failing: " in r.getMessage()]
    assert [m.split(" failing")[0] for m in failing] == [
        f"reading stream 'a' shard {SHARD}", f"reading stream 'b' shard {SHARD}"], failing
