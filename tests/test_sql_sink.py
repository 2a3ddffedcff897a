"""format("aws-kinesis") sink and write_to_kinesis on real Spark (local[2]) and kinesis-local:
every row lands once, on the shard of its own key, aggregated; options are checked by name."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from spark_helpers import wait_until
from test_producer import assert_on_own_shards, read_back, shard_ranges

from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY
from kinesis_dstream.sql.options import SinkOptions, parse_options

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parent.parent




def sink_options(stream: str, endpoint: str, **extra: str) -> dict[str, str]:
    return {"kinesis.streamName": stream, "kinesis.endpointUrl": endpoint,
            "kinesis.region": DUMMY_REGION, "kinesis.awsAccessKeyId": DUMMY_ACCESS_KEY_ID,
            "kinesis.awsSecretKey": DUMMY_SECRET_ACCESS_KEY, **extra}


def assert_written_once(endpoint: str, stream: str, expected: Counter, max_kinesis: int) -> None:
    raw, users = read_back(endpoint, stream)
    got = Counter((u.partition_key, u.binary_data) for u in users)
    assert got == expected, f"missing {len(expected - got)}, extra {len(got - expected)}"
    assert_on_own_shards(users, shard_ranges(endpoint, stream))
    assert len(raw) <= max_kinesis, f"{len(raw)} Kinesis records for {len(users)} user records"


@pytest.mark.matrix
@pytest.mark.spark
def test_batch_write_of_ten_thousand_rows(spark, kinesis_local, make_stream):
    stream = make_stream(4)
    rows = [(f"key-{i % 613}", f"row-{i}") for i in range(10_000)]
    df = spark.createDataFrame(rows, "partitionKey string, data string").repartition(3)
    df.write.format("aws-kinesis").options(**sink_options(stream, kinesis_local)) \
        .mode("append").save()
    expected = Counter((k, d.encode()) for k, d in rows)
    assert_written_once(kinesis_local, stream, expected, max_kinesis=200)


@pytest.mark.matrix
@pytest.mark.spark
def test_streaming_write_from_files_available_now(spark, kinesis_local, make_stream, tmp_path):
    stream = make_stream(2)
    source = tmp_path / "in"
    source.mkdir()
    rows = []
    for part in range(3):
        lines = [{"partitionKey": f"k{i % 41}", "data": f"file{part}-{i}"} for i in range(700)]
        rows += lines
        (source / f"part-{part}.json").write_text("\n".join(json.dumps(r) for r in lines))
    query = (spark.readStream.schema("partitionKey string, data string")
             .option("maxFilesPerTrigger", 1).json(str(source))
             .writeStream.format("aws-kinesis")
             .options(**sink_options(stream, kinesis_local))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) == 3  # one micro-batch per file: three commits
    expected = Counter((r["partitionKey"], r["data"].encode()) for r in rows)
    assert_written_once(kinesis_local, stream, expected, max_kinesis=3 * 2 * 2)


@pytest.mark.spark
def test_binary_data_plain_mode_and_explicit_hash_key(spark, kinesis_local, make_stream):
    stream = make_stream(2)
    ranges = shard_ranges(kinesis_local, stream)
    last_shard_start = str(max(start for start, _ in ranges.values()))
    rows = [(bytearray(b"\x00\xff" + bytes([i])), "same", last_shard_start if i % 2 else None)
            for i in range(50)]
    df = spark.createDataFrame(rows, "data binary, partitionKey string, explicitHashKey string")
    df.write.format("aws-kinesis").options(**sink_options(
        stream, kinesis_local, **{"KINESIS.SINK.AGGREGATIONENABLED": "false"})) \
        .mode("append").save()
    raw, users = read_back(kinesis_local, stream)
    assert len(raw) == 50 and not any(u.aggregated for u in users)
    last_shard = [s for s, (start, _) in ranges.items() if str(start) == last_shard_start][0]
    for user in users:
        if user.binary_data[2] % 2:
            assert user.shard_id == last_shard


@pytest.mark.matrix
@pytest.mark.spark
def test_dstream_helper_writes_every_batch(sc, kinesis_local, make_stream):
    from pyspark.streaming import StreamingContext

    from kinesis_dstream.sql.sink import write_to_kinesis

    stream = make_stream(2)
    batches = [[(f"k{i % 7}", f"b{b}-{i}") for i in range(200)] for b in range(3)]
    ssc = StreamingContext(sc, 0.5)
    try:
        dstream = ssc.queueStream([sc.parallelize(batch, 2) for batch in batches], oneAtATime=True)
        write_to_kinesis(dstream, stream, kinesis_local, DUMMY_REGION, options={
            "kinesis.awsAccessKeyId": DUMMY_ACCESS_KEY_ID,
            "kinesis.awsSecretKey": DUMMY_SECRET_ACCESS_KEY})
        ssc.start()
        expected = Counter((k, d.encode()) for batch in batches for k, d in batch)

        def all_there() -> bool:
            _, users = read_back(kinesis_local, stream)
            return len(users) >= len(expected)

        wait_until(all_there, 60, "600 records written by the DStream")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    assert_written_once(kinesis_local, stream, expected, max_kinesis=3 * 2 * 2)


@pytest.mark.matrix
@pytest.mark.spark
def test_missing_column_is_named(spark, kinesis_local, make_stream):
    stream = make_stream(1)
    df = spark.createDataFrame([("a",)], "data string")
    with pytest.raises(Exception, match="the Kinesis sink needs a column 'partitionKey'"):
        df.write.format("aws-kinesis").options(**sink_options(stream, kinesis_local)) \
            .mode("append").save()


@pytest.mark.matrix
@pytest.mark.spark
def test_invalid_option_value_is_named(spark, kinesis_local, make_stream):
    stream = make_stream(1)
    df = spark.createDataFrame([("a", "k")], "data string, partitionKey string")
    with pytest.raises(Exception, match=r"kinesis\.sink\.maxConnections: not a whole number"):
        df.write.format("aws-kinesis").options(**sink_options(
            stream, kinesis_local, **{"kinesis.sink.maxConnections": "many"})) \
            .mode("append").save()


@pytest.mark.unit
def test_options_unknown_warned_by_name_defaults_and_errors(caplog):
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.sql.options"):
        parsed = parse_options({"kinesis.streamname": "s", "kinesis.streamNmae": "typo",
                                "path": "/ignored"})
    assert "kinesis.streamNmae" in caplog.text and "path" not in caplog.text.split("(known")[0]
    assert parsed.unknown == ("kinesis.streamNmae",)
    assert parsed.sink == SinkOptions(100, 1000, 1, True)
    assert parsed.stream_name == "s"
    endpoint = parse_options({"kinesis.streamName": "s",
                              "kinesis.endpointUrl": "https://kinesis.eu-west-3.amazonaws.com"})
    assert endpoint.config.region_name == "eu-west-3"
    for options, named in (({}, "kinesis.streamName"),
                           ({"kinesis.streamName": "s", "kinesis.sink.aggregationEnabled": "maybe"},
                            "kinesis.sink.aggregationEnabled"),
                           ({"kinesis.streamName": "s", "kinesis.sink.flushWaitTimeMs": "soon"},
                            "kinesis.sink.flushWaitTimeMs"),
                           ({"kinesis.streamName": "s", "kinesis.sink.flushWaitTimeMs": "0"},
                            "kinesis.sink.flushWaitTimeMs"),
                           ({"kinesis.streamName": "s", "kinesis.awsAccessKeyId": "AK"},
                            "kinesis.awsSecretKey")):
        with pytest.raises(ConfigurationError, match=named.replace(".", r"\.")):
            parse_options(options)


@pytest.mark.unit
def test_the_sink_flush_wait_is_the_first_wait_of_the_producers_entry_retry(aws_env):
    from kinesis_dstream.aws.producer import PUT_RECORDS_RETRY
    from kinesis_dstream.retry import RetryPolicy
    from kinesis_dstream.sql.sink import make_producer

    options = parse_options(sink_options("s", "http://127.0.0.1:9",
                                         **{"kinesis.sink.flushWaitTimeMs": "250"}))
    producer = make_producer(options)
    # kinesis.sink.recordTtl (awslabs' 30 s) is the deadline; tries enough that it governs.
    assert producer.retry == RetryPolicy(
        wait_time_ms=250, max_attempts=PUT_RECORDS_RETRY.max_attempts + 12,
        max_wait_ms=PUT_RECORDS_RETRY.max_wait_ms, deadline_ms=30_000)


@pytest.mark.unit
def test_options_source_options_do_not_apply_and_roles_need_no_external_id(caplog):
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.sql.options"):
        parsed = parse_options({"kinesis.streamName": "s", "KINESIS.STARTINGPOSITION": "LATEST",
                                "kinesis.stsRoleArn": "arn:aws:iam::1:role/r",
                                "kinesis.stsSessionName": "writer"})
    assert parsed.unknown == ("KINESIS.STARTINGPOSITION",)
    assert "is a source option (kinesis.startingPosition)" in caplog.text
    assert "does not apply to writing" in caplog.text
    assert (parsed.config.sts_assume_role_arn, parsed.config.sts_session_name,
            parsed.config.sts_external_id) == ("arn:aws:iam::1:role/r", "writer", None)
    with pytest.raises(ConfigurationError, match=r"kinesis\.stsExternalId given without "
                                                 r"kinesis\.stsRoleArn"):
        parse_options({"kinesis.streamName": "s", "kinesis.stsExternalId": "x"})


@pytest.mark.unit
def test_options_qubole_short_names_are_aliases_and_source_ones_do_not_apply(caplog):
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.sql.options"):
        parsed = parse_options({"streamname": "s", "endpointurl": "http://127.0.0.1:1",
                                "regionname": "eu-west-2", "startingposition": "LATEST"})
    assert (parsed.stream_name, parsed.config.kinesis_endpoint, parsed.config.region_name) == \
        ("s", "http://127.0.0.1:1", "eu-west-2")
    assert parsed.unknown == ("startingposition",)
    assert "is a source option (kinesis.startingPosition)" in caplog.text


@pytest.mark.matrix
@pytest.mark.spark  # a Spark driver in a fresh process
@pytest.mark.slow
def test_registered_without_any_call_in_a_fresh_process(kinesis_local, make_stream, tmp_path):
    """A new Python process with only PYTHONPATH: both names resolve, rows arrive."""
    stream = make_stream(1)
    script = tmp_path / "fresh.py"
    script.write_text(textwrap.dedent(f"""
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
        df = spark.createDataFrame([("k", "fresh-1")], "partitionKey string, data string")
        options = {sink_options(stream, kinesis_local)!r}
        for name in ("aws-kinesis", "kinesis"):
            df.write.format(name).options(**options).mode("append").save()
        spark.stop()
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        PYSPARK_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    _, users = read_back(kinesis_local, stream)
    assert [u.binary_data for u in users] == [b"fresh-1", b"fresh-1"]


@pytest.mark.emulator
def test_without_the_data_source_api_the_sql_package_names_the_version():
    """As on pyspark < 4.0: kinesis_dstream imports, kinesis_dstream.sql says what it needs."""
    code = textwrap.dedent("""
        import sys
        sys.modules["pyspark.sql.datasource"] = None   # what an older pyspark lacks
        import kinesis_dstream
        from kinesis_dstream import KinesisUtils
        try:
            import kinesis_dstream.sql
        except ImportError as exc:
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    assert "needs pyspark >= 4.0" in done.stdout


@pytest.mark.matrix
@pytest.mark.spark
def test_a_write_that_cannot_finish_fails_naming_stream_and_count(spark, kinesis_local,
                                                                   make_stream):
    from fault_proxy import FaultProxy

    stream = make_stream(1)
    df = spark.createDataFrame([(f"k{i}", f"d{i}") for i in range(40)],
                               "partitionKey string, data string").coalesce(1)
    with FaultProxy(kinesis_local, share=0.0, put_failure_share=1.0) as proxy:
        with pytest.raises(Exception) as failure:
            df.write.format("aws-kinesis").options(**sink_options(
                stream, proxy.endpoint, **{"kinesis.sink.flushWaitTimeMs": "1",
                                           # each of Spark's 4 tries would retry for 30 s
                                           "kinesis.sink.recordTtl": "3000",
                                           "kinesis.sink.aggregationEnabled": "false"})) \
                .mode("append").save()
    assert f"40 records not written to stream '{stream}'" in str(failure.value)
    assert proxy.put_entries_failed >= 40 * 10


@pytest.mark.matrix
@pytest.mark.spark
def test_a_batch_read_says_to_read_a_stream(spark):
    with pytest.raises(Exception, match="format 'aws-kinesis' reads as a stream only"):
        spark.read.format("aws-kinesis").options(**sink_options("s", "http://127.0.0.1:9")) \
            .load().collect()


@pytest.mark.matrix
@pytest.mark.spark
def test_round_trip_through_the_sink_and_the_source(spark, kinesis_local, dynamodb, aws_env,
                                                    make_stream, unique_app_name, tmp_path):
    """10k rows written aggregated, read back with readStream.format("aws-kinesis"): all
    come back once, each on the shard its own key maps to, in far fewer Kinesis records."""
    from kinesis_dstream.aws.shard_map import hash_key_of

    stream = make_stream(4)
    rows = [(f"key-{i % 997}", f"row-{i}") for i in range(10_000)]
    spark.createDataFrame(rows, "partitionKey string, data string").repartition(2) \
        .write.format("aws-kinesis").options(**sink_options(stream, kinesis_local)) \
        .mode("append").save()
    name = f"roundtrip_{unique_app_name.replace('-', '_')}"
    query = (spark.readStream.format("aws-kinesis")
             .options(**sink_options(stream, kinesis_local))
             .option("kinesis.dynamodb.endpointUrl", dynamodb)
             .option("kinesis.dynamodb.tableName", unique_app_name)
             .option("kinesis.startingPosition", "TRIM_HORIZON").load()
             .writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    got = spark.sql(f"SELECT partitionKey, CAST(data AS STRING) AS data, shardId, sequenceNumber "
                    f"FROM {name}").collect()
    assert Counter((r.partitionKey, r.data) for r in got) == Counter(rows)
    ranges = shard_ranges(kinesis_local, stream)
    misplaced = [r for r in got
                 if not ranges[r.shardId][0] <= hash_key_of(r.partitionKey, None) <= ranges[r.shardId][1]]
    assert misplaced == []
    kinesis_records = {(r.shardId, r.sequenceNumber) for r in got}
    assert len(kinesis_records) <= 200, len(kinesis_records)
