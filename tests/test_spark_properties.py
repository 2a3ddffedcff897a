"""createStream end to end with a KCL properties file as the settings source: createStream's
arguments and configOverrides on top of it.

kinesis-local + moto, the session's one SparkContext (conftest ``sc``), 1 s batches.
"""
from __future__ import annotations

import warnings

import pytest

from emulators import client, list_shard_ids
from spark_helpers import count_words, lease, make_ssc, shard_records, unique_lines, wait_until, words_in

from kinesis_dstream import KinesisUtils
from kinesis_dstream.spark.registry import planners

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

pytestmark = pytest.mark.spark


def config_of(stream: str):
    found = [p.config for p in planners()
             if p.config.stream_name == stream and not p.coordinator.stopped]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.matrix
def test_properties_file_settings_with_arguments_and_overrides_on_top(
        sc, env, tmp_path, make_stream, put_records, unique_app_name):
    stream = make_stream(1)
    lines = unique_lines(240)
    put_records(stream, [("k", line) for line in lines[:120]])  # before start: needs TRIM_HORIZON
    properties = tmp_path / "wordcount.properties"
    properties.write_text(f"""\
# The file names another application and a dead Kinesis endpoint: createStream's
# arguments must win over both. Everything else comes from here.
streamName = {stream}
applicationName = not-{unique_app_name}
regionName = us-east-1
kinesisEndpoint = http://127.0.0.1:9
dynamoDBEndpoint = {env["dynamodb"]}
AWSCredentialsProvider = DefaultAWSCredentialsProviderChain
initialPositionInStream = TRIM_HORIZON
maxRecords = 7
idleTimeBetweenReadsInMillis = 50
failoverTimeMillis = 3000
shardSyncIntervalMillis = 2000
parentShardPollIntervalMillis = 200
shutdownGraceMillis = 8000
metricsLevel = NONE
""")
    ssc = make_ssc(sc)
    # checkpointInterval 600 s from the arguments; configOverrides brings it down to 0.5 s
    # (a checkpoint must show up while running) and wins over the file's idle time too.
    kstream = KinesisUtils.createStream(
        ssc, unique_app_name, stream, env["kinesis"], "us-east-1", None, 600,
        propertiesFile=str(properties),
        configOverrides={"checkpoint_interval_ms": 500, "idle_time_between_reads_ms": 20})
    config = config_of(stream)
    assert (config.application_name, config.kinesis_endpoint) == (unique_app_name, env["kinesis"])
    assert (config.initial_position, config.max_records, config.failover_time_ms) == \
        ("TRIM_HORIZON", 7, 3000)
    assert (config.checkpoint_interval_ms, config.idle_time_between_reads_ms) == (500, 20)
    assert config.dynamodb_endpoint == env["dynamodb"] and config.metrics_level == "NONE"
    counts = count_words(kstream)
    ssc.start()
    try:
        wait_until(lambda: sum(counts.values()) >= sum(words_in(lines[:120]).values()), 60,
                   "the records put before the start (TRIM_HORIZON from the file)")
        shard_id = list_shard_ids(env["kinesis"], stream)[0]
        wait_until(lambda: "checkpoint" in lease(env, unique_app_name, shard_id), 15,
                   "the first checkpoint")
        # A shard's first checkpoint goes out at once; the next waits for the interval.
        put_records(stream, [("k", line) for line in lines[120:]])
        wait_until(lambda: sum(counts.values()) >= sum(words_in(lines).values()), 60,
                   "the records put after the start")
        last = shard_records(env, stream, shard_id)[-1]["SequenceNumber"]
        wait_until(lambda: lease(env, unique_app_name, shard_id)["checkpoint"]["S"] == last, 10,
                   "a second checkpoint while running (configOverrides' 0.5 s, not the "
                   "argument's 600 s)")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert counts == words_in(lines)
    metrics = KinesisUtils.metrics(stream)
    assert sum(m["records"] for m in metrics.values()) == len(lines)
    ddb = client("dynamodb", env["dynamodb"])
    assert unique_app_name in ddb.list_tables()["TableNames"]
    assert f"not-{unique_app_name}" not in ddb.list_tables()["TableNames"]
