"""A new SQL query started from a KCL lease table (``kinesis.applicationName`` /
``kinesis.leaseTableName``): each shard at its checkpoint, sub-sequence numbers included.

The position mapping for every checkpoint kind (pure), a wrong table or application and
missing credentials failing the query's start by name within seconds (emulators), and the
must-show with real Spark: a DStream job reads part of a stream and stops (``leases
status`` shows its table right, lag included); a SQL query
started from its lease table continues, every record exactly once across the two, KPL
aggregates included (one of them processed in part), and restarts from its own
checkpointLocation, never the table again.
"""
from __future__ import annotations

import io
import json
import threading
import time
import warnings
from collections import Counter
from contextlib import contextmanager, redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from emulators import client
from spark_helpers import create, leases, make_ssc, shard_records, wait_until
from test_operations_leases import status_shows_every_lease
from test_sql_source import Batches, options, start_query, stop

from kinesis_dstream.aws.kinesis import Shard
from kinesis_dstream.config import SPARK_RECEIVER_MAX_RATE
from kinesis_dstream.errors import ConfigurationError, CredentialsError, KinesisDStreamError
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.retrieval import StartingPosition
from kinesis_dstream.sql.initial_positions import initial_positions, lease_shard_id
from kinesis_dstream.sql.options import parse_source_options
from kinesis_dstream.sql.reader import KinesisStreamReader

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

SEQ = "49654826129375727396155516464345066431716066104036425730"
LATEST = StartingPosition("LATEST")
TRIM = StartingPosition("TRIM_HORIZON")
AT = StartingPosition("AT_TIMESTAMP", timestamp=1_700_000_000.0)
PINNED = 1_800_000_000.0


def shard(shard_id: str, *parents: str, closed: bool = False) -> Shard:
    return Shard(shard_id, parents[0] if parents else None,
                 parents[1] if len(parents) > 1 else None, "0", "1", "1",
                 "2" if closed else None)


# -- the mapping: pure -------------------------------------------------------------------------
@pytest.mark.unit
def test_each_checkpoint_kind_maps_to_where_reading_resumes():
    listing = [shard("mid"), shard("plain"), shard("trim"), shard("latest"),
               shard("latest-closed", closed=True), shard("ended", closed=True),
               shard("none")]
    checkpoints = {"mid": ESN(SEQ, 3), "plain": ESN(SEQ, 0), "trim": ESN("TRIM_HORIZON"),
                   "latest": ESN("LATEST"), "latest-closed": ESN("LATEST"),
                   "ended": ESN("SHARD_END")}
    got = initial_positions(listing, LATEST, PINNED, checkpoints, "t")
    assert got == {
        # the last record processed: reading resumes at the next user record, (SEQ, 4)
        "mid": {"after": SEQ, "sub": 3},
        "plain": {"after": SEQ, "sub": 0},
        "trim": {"at": "TRIM_HORIZON"},
        "latest": {"at": "AT_TIMESTAMP", "ts": PINNED},  # LATEST as the query starts
        "latest-closed": {"ended": True},
        "ended": {"ended": True},
        "none": {"at": "AT_TIMESTAMP", "ts": PINNED},  # no row: kinesis.startingPosition
    }
    # a shard without a row starts as kinesis.startingPosition says
    assert initial_positions(listing, TRIM, PINNED, checkpoints)["none"] == {"at": "TRIM_HORIZON"}
    assert initial_positions(listing, AT, PINNED, checkpoints)["none"] == \
        {"at": "AT_TIMESTAMP", "ts": AT.timestamp}
    # without a table: as before (LATEST pins open shards, skips closed ones)
    assert initial_positions([shard("a"), shard("b", closed=True)], LATEST, PINNED) == \
        {"a": {"at": "AT_TIMESTAMP", "ts": PINNED}, "b": {"ended": True}}


@pytest.mark.unit
def test_an_at_timestamp_checkpoint_takes_the_time_asked_for_or_is_refused_naming_it():
    listing, checkpoints = [shard("s")], {"s": ESN("AT_TIMESTAMP")}
    assert initial_positions(listing, AT, PINNED, checkpoints, "t") == \
        {"s": {"at": "AT_TIMESTAMP", "ts": AT.timestamp}}
    for start in (LATEST, TRIM):
        with pytest.raises(ConfigurationError, match=r"shard s .*AT_TIMESTAMP.*'t'.*"
                                                     r"kinesis\.startingPosition"):
            initial_positions(listing, start, PINNED, checkpoints, "t")


@pytest.mark.unit
def test_lineage_after_a_reshard():
    """A finished parent's row deleted by the KCL's lease clean-up: done, not read again; a
    child of a table shard with no row yet: from its beginning, after its parent."""
    listing = [shard("gone", closed=True), shard("kid", "gone"),
               shard("p", closed=True), shard("c1", "p"), shard("c2", "p"),
               shard("old", closed=True), shard("new", "old")]
    checkpoints = {"kid": ESN(SEQ, 0), "p": ESN(SEQ, 7)}
    got = initial_positions(listing, LATEST, PINNED, checkpoints)
    assert got["gone"] == {"ended": True}
    assert got["kid"] == {"after": SEQ, "sub": 0, "wait": ["gone"]}
    assert got["p"] == {"after": SEQ, "sub": 7}
    assert got["c1"] == got["c2"] == {"at": "TRIM_HORIZON", "wait": ["p"]}
    # no table lineage: startingPosition LATEST (closed parent skipped, child pinned)
    assert got["old"] == {"ended": True} and got["new"] == {"at": "AT_TIMESTAMP", "ts": PINNED}
    # children of a finished parent start from their beginning
    got = initial_positions(listing, LATEST, PINNED, {**checkpoints, "p": ESN("SHARD_END")})
    assert got["p"] == {"ended": True} and got["c1"] == {"at": "TRIM_HORIZON", "wait": ["p"]}


@pytest.mark.unit
def test_multi_stream_lease_keys_and_option_names():
    assert lease_shard_id("shardId-000000000001", "orders") == "shardId-000000000001"
    assert lease_shard_id("123456789012:orders:1700000000:shardId-1", "orders") == "shardId-1"
    assert lease_shard_id("123456789012:other:1700000000:shardId-1", "orders") is None
    base = {"kinesis.streamName": "s", "kinesis.endpointUrl": "http://127.0.0.1:1"}
    for given, table, app in (({"kinesis.applicationName": "app"}, "app", "app"),
                              ({"applicationname": "app"}, "app", "app"),
                              ({"kinesis.leaseTableName": "t"}, "t", "t"),
                              ({"leaseTableName": "t", "applicationName": "app"}, "t", "app"),
                              ({"kinesis.leasetable": "t"}, "t", "t")):
        options = parse_source_options({**base, **given})
        assert (options.start_lease_table, options.start_application) == (table, app)
        assert options.unknown == ()
    assert parse_source_options(base).start_lease_table is None


# -- errors as the query starts: emulators ------------------------------------------------------
def reader(stream: str, kinesis: str, dynamodb: str, app: str, **extra: str) -> KinesisStreamReader:
    return KinesisStreamReader(parse_source_options({
        "kinesis.streamName": stream, "kinesis.endpointUrl": kinesis, "kinesis.region": "us-east-1",
        "kinesis.dynamodb.endpointUrl": dynamodb, "kinesis.dynamodb.tableName": app, **extra}))


@pytest.mark.emulator
def test_a_missing_table_or_credentials_fail_the_start_naming_it_within_seconds(
        aws_env, kinesis_local, dynamodb, dynamodb_client, make_stream, unique_app_name):
    stream = make_stream(1)
    tables = set(dynamodb_client.list_tables()["TableNames"])
    cases = [({"kinesis.applicationName": "no-such-app"}, ConfigurationError,
              r"no lease table 'no-such-app' of application 'no-such-app'"),
             ({"kinesis.leaseTableName": "no-such-table", "kinesis.applicationName": "my-app"},
              ConfigurationError, r"no lease table 'no-such-table' of application 'my-app'")]
    # A table of another stream's application: none of its leases is a shard of ours.
    dynamodb_client.create_table(
        TableName=unique_app_name, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}])
    dynamodb_client.put_item(TableName=unique_app_name, Item={
        "leaseKey": {"S": "shardId-999"}, "leaseCounter": {"N": "1"},
        "checkpoint": {"S": "TRIM_HORIZON"}})
    cases.append(({"kinesis.applicationName": unique_app_name}, ConfigurationError,
                  rf"{unique_app_name}.*holds no lease of a shard of stream '{stream}'"))
    for extra, error, message in cases:
        began = time.monotonic()
        with pytest.raises(error, match=message):
            reader(stream, kinesis_local, dynamodb, unique_app_name + "-r", **extra).initialOffset()
        assert time.monotonic() - began < 10
    # Credentials DynamoDB refuses for the table, and a dead endpoint: named, within seconds.
    with refusing_dynamodb() as refusing:
        for endpoint, error, message in (
                (refusing, CredentialsError, r"AccessDeniedException.*dynamodb:Scan"),
                ("http://127.0.0.1:9", KinesisDStreamError, r"unreachable")):
            began = time.monotonic()
            with pytest.raises(error, match=rf"lease table '{unique_app_name}'.*{message}"):
                reader(stream, kinesis_local, endpoint, unique_app_name + "-r",
                       **{"kinesis.applicationName": unique_app_name}).initialOffset()
            assert time.monotonic() - began < 10
    # nothing written: no range table was made for any of these queries
    assert set(dynamodb_client.list_tables()["TableNames"]) == tables | {unique_app_name}


@contextmanager
def refusing_dynamodb() -> Iterator[str]:
    """A DynamoDB endpoint that refuses every call as AWS does a role without the action."""

    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps({"__type": "com.amazon.coral.service#AccessDeniedException",
                               "message": "User: arn:aws:iam::000000000000:user/u is not "
                                          "authorized to perform: dynamodb:Scan"}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/x-amz-json-1.0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- the must-show: a DStream job moved to Structured Streaming, real Spark ---------------------


def dstream_reads_part(sc: Any, env: dict[str, str], app: str, stream: str,
                       position: dict[str, tuple[str, ESN]], max_rate: str) -> list[str]:
    """A DStream job at ``max_rate`` records a second reads some records and stops.

    It checkpoints a batch once the batch has completed, and Spark may stop before telling
    it of the last ones: so once it has some records its later batches fail (a failed batch
    and all after it are never checkpointed), and it stops once the table holds the last
    position it wrote out. ``position``: each record's (shard, position), by data.
    """
    ssc = make_ssc(sc)
    jconf = sc._conf._jconf  # createStream reads maxRate from the session's conf, once
    jconf.set(SPARK_RECEIVER_MAX_RATE, max_rate)
    try:
        kstream = create(ssc, app, stream, env)
    finally:
        jconf.remove(SPARK_RECEIVER_MAX_RATE)
    rows: list[str] = []
    lock, enough = threading.Lock(), threading.Event()

    def keep(rdd: Any) -> None:
        got = rdd.collect()
        with lock:
            if enough.is_set():
                raise RuntimeError("the test takes no more batches")
            rows.extend(got)

    kstream.foreachRDD(keep)

    def written_out_is_checkpointed() -> bool:
        with lock:
            last: dict[str, ESN] = {}
            for data in rows:
                shard_id, at = position[data]
                last[shard_id] = max(last.get(shard_id, at), at)
        table = leases(env, app)
        return all(table.get(s, {}).get("checkpoint", {}).get("S") == at.sequence_number and
                   table[s]["checkpointSubSequenceNumber"]["N"] == str(at.sub_sequence_number)
                   for s, at in last.items())

    ssc.start()
    try:
        wait_until(lambda: len(rows) >= 40, 60, "the DStream's first records")
        enough.set()
        wait_until(written_out_is_checkpointed, 30, "the DStream's checkpoints")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    return list(rows)


def checkpoint_show_names_where_the_query_stopped(checkpoint: str, sink: Batches,
                                                 started: dict[str, tuple[str, int]]) -> None:
    """``checkpoint show`` on a stopped query, whichever way the stop fell (a query that read
    everything in its first batch is often stopped before Spark commits it): the last batch
    Spark committed, or none; every later one planned and not committed; and for the last
    committed batch, else the first planned one, each shard's reading starting right after
    the last record (KPL sub-record included) the batches before it delivered, or where the
    query started (``started``: the lease table's checkpoint) when they delivered none."""
    from kinesis_dstream import cli

    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["checkpoint", "show", checkpoint, "--json"]) == 0
    shown = json.loads(out.getvalue())

    def numbered(kind: str) -> list[int]:
        return sorted(int(p.name) for p in (Path(checkpoint) / kind).iterdir() if p.name.isdigit())

    commits, planned = numbered("commits"), numbered("offsets")
    last = commits[-1] if commits else None
    assert shown["last_committed_batch"] == last
    assert shown["planned_not_committed"] == [n for n in planned if last is None or n > last]
    checked = last if last is not None else planned[0]
    (batch,) = [b for b in shown["batches"] if b["batch"] == checked]
    assert batch["committed"] == (last is not None)
    (source,) = batch["sources"]
    assert source["kinesis_dstream"] and set(source["shards"]) == set(started)
    for shard_id, entry in source["shards"].items():
        delivered = [ESN(r[1], r[2]) for n, rows in sink.by_batch.items() if n < checked
                     for r in rows if r[0] == shard_id]
        expected = max(delivered) if delivered else ESN(*started[shard_id])
        # a shard the DStream never checkpointed, and none of whose records came before the
        # checked batch, still reads from TRIM_HORIZON (seen in a fresh-clone CI)
        want = ({"at": "TRIM_HORIZON"} if expected.sequence_number == "TRIM_HORIZON" else
                {"after": expected.sequence_number, "sub": expected.sub_sequence_number})
        raw = entry["raw"]
        assert raw == want, (shard_id, entry, checked, sorted(sink.by_batch), started[shard_id])
        if "after" in raw:
            assert entry["position"].startswith(f"after {raw['after']}/{raw['sub']}")


@pytest.mark.spark
def test_a_sql_query_continues_a_dstream_job_from_its_lease_table_exactly_once(
        sc, spark, aws_env, kinesis_local, dynamodb, make_stream, put_records, put_aggregated,
        unique_app_name, tmp_path):
    env = {"kinesis": kinesis_local, "dynamodb": dynamodb}
    stream = make_stream(2)
    # KPL aggregates of 7 first, plain records after: the DStream's batches of 10 records a
    # shard end inside aggregates.
    aggregates = put_aggregated(stream, [(f"a{i % 13}", f"agg-{i}") for i in range(700)],
                                per_aggregate=7)
    plain = put_records(stream, [(f"p{i % 13}", f"plain-{i}") for i in range(100)])
    sent = [d.decode() for a in aggregates for _, d in a.user_records] + \
        [p.data.decode() for p in plain]
    position = {d.decode(): (a.shard_id, ESN(a.sequence_number, i)) for a in aggregates
                for i, (_, d) in enumerate(a.user_records)}
    position.update({p.data.decode(): (p.shard_id, ESN(p.sequence_number)) for p in plain})
    by_dstream = dstream_reads_part(sc, env, unique_app_name, stream, position, "20")
    assert 0 < len(by_dstream) < len(sent) - 100, len(by_dstream)  # a good part is left
    table = {s: (i["checkpoint"]["S"], int(i["checkpointSubSequenceNumber"]["N"]))
             for s, i in leases(env, unique_app_name).items()}
    inside = [(a.shard_id, a.sequence_number, sub) for a in aggregates
              for s, (seq, sub) in table.items()
              if (s, seq) == (a.shard_id, a.sequence_number) and sub < len(a.user_records) - 1]
    assert inside, f"no checkpoint inside an aggregate: {table}"
    covered = sorted(d for d, (s, at) in position.items()
                     if s in table and table[s][0].isdigit() and at <= ESN(*table[s]))
    assert sorted(by_dstream) == covered, (len(by_dstream), len(covered), table)
    # leases status on the DStream's table: each lag is the age of its checkpointed record
    # (of the shard's oldest, where the DStream stopped before it checkpointed that shard)
    # against the shard's newest one (kinesis-local's MillisBehindLatest), right within 1 s.
    arrived = {s: {r["SequenceNumber"]: r["ApproximateArrivalTimestamp"].timestamp() * 1000
                   for r in shard_records(env, stream, s)} for s in table}
    status_shows_every_lease(unique_app_name, stream, kinesis_local, dynamodb, {
        s: int(max(arrived[s].values()) - (arrived[s][seq] if seq.isdigit()
                                           else min(arrived[s].values())))
        for s, (seq, _) in table.items()})

    # LATEST for shards without a row: were the table ignored, nothing old would be read.
    sink = Batches()
    opts = options(stream, kinesis_local, dynamodb, unique_app_name, **{
        "kinesis.startingPosition": "LATEST", "kinesis.applicationName": unique_app_name})
    checkpoint = str(tmp_path / "checkpoint")
    query = start_query(spark, opts, checkpoint, sink)
    try:
        left = Counter(sent) - Counter(by_dstream)
        wait_until(lambda: sum(sink.data().values()) >= sum(left.values()) or not query.isActive,
                   120, "the records the DStream left")
    finally:
        stop(query)
    both = Counter(by_dstream) + Counter(d.decode() for d in sink.data().elements())
    assert both == Counter(sent), (len(both), len(sent), [d for d, n in both.items() if n > 1][:5])
    assert not sink.reruns_differing
    for shard_id, seq, sub in inside:  # a half-read aggregate goes on at its next user record
        first = min((ESN(r[1], r[2]) for r in sink.rows() if r[0] == shard_id))
        assert first == ESN(seq, sub + 1), (first, seq, sub)
    checkpoint_show_names_where_the_query_stopped(checkpoint, sink, table)

    # A restart follows its own checkpointLocation, never the table again (gone here). The same
    # sink: a batch planned and not committed before the stop runs again under its id and must
    # bring the same rows; every record once across the DStream and both runs.
    client("dynamodb", dynamodb).delete_table(TableName=unique_app_name)
    later = [p.data.decode() for p in put_records(stream, [(f"q{i}", f"later-{i}")
                                                            for i in range(40)])]
    query = start_query(spark, opts, checkpoint, sink)
    try:
        wait_until(lambda: sum(sink.data().values()) >= sum(left.values()) + len(later)
                   or not query.isActive, 120, "the later records")
    finally:
        stop(query)
    both = Counter(by_dstream) + Counter(d.decode() for d in sink.data().elements())
    assert both == Counter(sent) + Counter(later), [d for d, n in both.items() if n > 1][:5]
    assert not sink.reruns_differing
