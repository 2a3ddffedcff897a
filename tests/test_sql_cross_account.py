"""Cross-account and credential options of the SQL source, end to end through real Spark on
local-cluster[2,1,1024] (issue 39's "Must show"): Databricks' ``roleArn`` alone and
``streamARN`` alone, a query with only ``streamName`` and ``AWS_REGION``, and the awslabs
connector's ``kinesis.sessionToken`` and ``kinesis.credentialProviderClass``.

Two counting proxies (tests/fault_proxy.py) stand in front of the emulators: one before
kinesis-local sees who signed each Kinesis call (the access key id of its SigV4 Credential=,
its security token) and whether it named the stream by StreamARN; one before moto's STS
counts the AssumeRole calls by the pid of the process that sent them, so "once per process"
is checked per process: the driver's Python processes and each executor's Python workers.
moto hands assumed roles access key ids of their own (ASIA...), listed in its /moto-api/.

Run as a script (``python tests/test_sql_cross_account.py driver ...``) this file is the
subprocess driver of the ``AWS_REGION`` test, whose executors must start with the harness's
environment.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

if __name__ != "__main__":  # the subprocess driver needs none of the test helpers
    import boto3

    from spark_helpers import wait_until
    from sts_proxies import (
        PER_WAVE,
        WAVES,
        Proxies,
        assert_assumed_once_per_process,
        assert_signed_by_role_sessions,
        executors_of,
        on_executor,
        role_of,
    )
    from test_sql_source import TRIGGER, Batches, stop

    from kinesis_dstream.local import (
        DUMMY_ACCESS_KEY_ID,
        DUMMY_REGION,
        DUMMY_SECRET_ACCESS_KEY,
    )

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

# What every read sends Kinesis, from the driver (ListShards) and the executors.
KINESIS_CALLS = ("ListShards", "GetShardIterator", "GetRecords")


# -- helpers -----------------------------------------------------------------------------------
def read_in_waves(spark: Any, fmt: str, opts: dict[str, str], checkpoint: str,
                  put: Callable[[list[tuple[str, str]]], list[Any]],
                  while_running: Callable[[], None] | None = None) -> tuple[Batches, Counter]:
    """Records put in WAVES waves, each waited for, so that several micro-batches (reading
    tasks) run; ``while_running`` is called once all are read, before the query stops."""
    sink = Batches()
    query = (spark.readStream.format(fmt).options(**opts).load().writeStream
             .foreachBatch(sink).option("checkpointLocation", checkpoint)
             .trigger(processingTime=TRIGGER).start())
    expected: Counter = Counter()
    try:
        for wave in range(WAVES):
            expected.update(p.data for p in put([(f"k{wave}-{i}", f"w{wave}-{i}")
                                                 for i in range(PER_WAVE)]))
            wait_until(lambda: sum(sink.data().values()) >= sum(expected.values()), 90,
                       f"wave {wave} of the records")
        if while_running is not None:
            while_running()
    finally:
        stop(query)
    return sink, expected


def reading_tasks(sink: Batches) -> int:
    """Reading tasks that brought rows: one per shard per micro-batch."""
    with sink.lock:
        return sum(len({row[0] for row in rows}) for rows in sink.by_batch.values())


# -- Databricks' cross-account example ---------------------------------------------------------
def test_databricks_role_arn_alone_reads_every_record_once_assuming_once_per_process(
        spark, aws_env, kinesis_local, dynamodb, make_stream, put_records, make_fault_proxy,
        unique_app_name, tmp_path):
    """format("kinesis") with Databricks' roleArn and no roleSessionName: every record read
    once, every Kinesis call signed by the role's session (named kinesis-dstream-<epoch>),
    and STS asked once per process that uses the role, not once per client or task."""
    proxies = Proxies(make_fault_proxy, dynamodb)
    role = role_of(unique_app_name)
    stream = make_stream(2)
    opts = {"streamName": stream, "region": DUMMY_REGION, "endpoint": proxies.kinesis.endpoint,
            "roleArn": role, "stsEndpoint": proxies.sts.endpoint,
            "initialPosition": "trim_horizon",
            # Not Databricks' (it has no range table): the emulator's DynamoDB.
            "kinesis.dynamodb.endpointUrl": dynamodb,
            "kinesis.dynamodb.tableName": unique_app_name}
    executors: dict[int, bool] = {}
    sink, expected = read_in_waves(spark, "kinesis", opts, str(tmp_path / "checkpoint"),
                                   lambda records: put_records(stream, records),
                                   lambda: executors.update(executors_of(proxies)))
    assert sink.data() == expected and not sink.reruns_differing  # every record once
    assert_signed_by_role_sessions(proxies, dynamodb, role,
                                   lambda name: name.startswith("kinesis-dstream-"))
    assert_assumed_once_per_process(proxies, reading_tasks(sink), executors)


def test_databricks_stream_arn_alone_names_the_stream_by_arn_in_every_kinesis_call(
        spark, aws_env, kinesis_local, dynamodb, make_stream, put_records, make_fault_proxy,
        unique_app_name, tmp_path):
    """format("kinesis") with Databricks' streamARN (no streamName, no region: the ARN's)
    and roleArn/roleSessionName: every record read once; every Kinesis call of the driver
    and the executors names the stream by StreamARN, and is signed by the role's session;
    STS asked once per process."""
    proxies = Proxies(make_fault_proxy, dynamodb)
    role = role_of(unique_app_name)
    stream = make_stream(2)
    arn = boto3.client("kinesis", endpoint_url=kinesis_local, region_name=DUMMY_REGION
                       ).describe_stream_summary(StreamName=stream)[
        "StreamDescriptionSummary"]["StreamARN"]
    assert f":{DUMMY_REGION}:" in arn
    opts = {"streamARN": arn, "endpoint": proxies.kinesis.endpoint, "roleArn": role,
            "roleSessionName": "cross-account-reader", "stsEndpoint": proxies.sts.endpoint,
            "initialPosition": "trim_horizon", "kinesis.dynamodb.endpointUrl": dynamodb,
            "kinesis.dynamodb.tableName": unique_app_name}
    executors: dict[int, bool] = {}
    sink, expected = read_in_waves(spark, "kinesis", opts, str(tmp_path / "checkpoint"),
                                   lambda records: put_records(stream, records),
                                   lambda: executors.update(executors_of(proxies)))
    assert sink.data() == expected and not sink.reruns_differing
    calls = proxies.kinesis.calls
    assert {op for (op, _) in calls} >= set(KINESIS_CALLS), calls
    for operation in {op for (op, _) in calls}:  # every call of each, by ARN
        assert proxies.kinesis.by_arn[operation] == calls[(operation, "")], \
            (operation, proxies.kinesis.by_arn, calls)
    assert_signed_by_role_sessions(proxies, dynamodb, role,
                                   lambda name: name == "cross-account-reader")
    assert_assumed_once_per_process(proxies, reading_tasks(sink), executors)


# -- the awslabs connector's credentials -------------------------------------------------------
def awslabs_options(stream: str, kinesis: str, dynamodb: str, app: str,
                    **extra: str) -> dict[str, str]:
    return {"kinesis.streamName": stream, "kinesis.endpointUrl": kinesis,
            "kinesis.region": DUMMY_REGION, "kinesis.startingPosition": "TRIM_HORIZON",
            "kinesis.dynamodb.endpointUrl": dynamodb, "kinesis.dynamodb.tableName": app,
            **extra}


def test_awslabs_sts_provider_class_signs_every_read_with_the_roles_session(
        spark, aws_env, kinesis_local, dynamodb, make_stream, put_records, make_fault_proxy,
        unique_app_name, tmp_path):
    """format("aws-kinesis") with kinesis.credentialProviderClass ConnectorSTSCredentialsProvider
    and its param "<role ARN>,<session name>": reads signed with that role's session, STS
    asked once per process."""
    proxies = Proxies(make_fault_proxy, dynamodb)
    role = role_of(unique_app_name)
    session = f"awslabs-{uuid.uuid4().hex[:12]}"
    stream = make_stream(2)
    opts = awslabs_options(stream, proxies.kinesis.endpoint, dynamodb, unique_app_name, **{
        "kinesis.credentialProviderClass":
            "org.apache.spark.sql.connector.kinesis.ConnectorSTSCredentialsProvider",
        "kinesis.credentialProviderParam": f"{role},{session}",
        "kinesis.stsEndpointUrl": proxies.sts.endpoint})
    executors: dict[int, bool] = {}
    sink, expected = read_in_waves(spark, "aws-kinesis", opts, str(tmp_path / "checkpoint"),
                                   lambda records: put_records(stream, records),
                                   lambda: executors.update(executors_of(proxies)))
    assert sink.data() == expected and not sink.reruns_differing
    assert_signed_by_role_sessions(proxies, dynamodb, role, lambda name: name == session)
    assert_assumed_once_per_process(proxies, reading_tasks(sink), executors)


def test_awslabs_session_token_signs_every_read_with_the_temporary_key_and_its_token(
        spark, aws_env, kinesis_local, dynamodb, make_stream, put_records, make_fault_proxy,
        unique_app_name, tmp_path):
    """format("aws-kinesis") with kinesis.awsAccessKeyId/awsSecretKey and kinesis.sessionToken
    of a role's session (from moto's STS): every Kinesis call, driver's and executors', is
    signed with that temporary key and carries its token; no process asks STS for anything."""
    proxies = Proxies(make_fault_proxy, dynamodb)
    role = role_of(unique_app_name)
    temporary = boto3.client("sts", endpoint_url=dynamodb, region_name=DUMMY_REGION,
                             aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                             aws_secret_access_key=DUMMY_SECRET_ACCESS_KEY).assume_role(
        RoleArn=role, RoleSessionName="handed-over")["Credentials"]
    key, token = temporary["AccessKeyId"], temporary["SessionToken"]
    assert key.startswith("ASIA") and token
    stream = make_stream(2)
    opts = awslabs_options(stream, proxies.kinesis.endpoint, dynamodb, unique_app_name, **{
        "kinesis.awsAccessKeyId": key, "kinesis.awsSecretKey": temporary["SecretAccessKey"],
        "kinesis.sessionToken": token, "kinesis.stsEndpointUrl": proxies.sts.endpoint})
    readers_on_executors: list[bool] = []
    sink, expected = read_in_waves(
        spark, "aws-kinesis", opts, str(tmp_path / "checkpoint"),
        lambda records: put_records(stream, records),
        lambda: readers_on_executors.extend(on_executor(p) for p in proxies.readers()))
    assert sink.data() == expected and not sink.reruns_differing
    assert any(readers_on_executors)  # executors read (the driver's processes may probe)
    assert {op for (op, _) in proxies.kinesis.signers} >= set(KINESIS_CALLS)
    assert proxies.kinesis_signers() == {key}, proxies.kinesis.signers
    assert {t for (_, t) in proxies.kinesis.session_tokens} == {token}
    assert not proxies.sts.calls, proxies.sts.calls


# -- a query with only streamName, the region and endpoints from the environment ---------------
SPARK_VARS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "PYTHONPATH")


@pytest.mark.timeout(420)
def test_stream_name_alone_reads_with_region_and_endpoint_from_the_environment(
        local_env, make_stream, put_records, kinesis_local, unique_app_name, tmp_path):
    """A format("kinesis") query whose only option is streamName, in a Spark application
    (local-cluster[2,1,1024], its own) started with the environment `kinesis-dstream local`
    prints: AWS_REGION (no AWS_DEFAULT_REGION, no profile), AWS_ENDPOINT_URL_KINESIS and
    _DYNAMODB, the dummy keys. Records put once it has started (Databricks' default,
    latest) are read, each once."""
    stream = make_stream(2)
    env = {k: v for k, v in os.environ.items() if k not in SPARK_VARS}
    env.update(local_env)
    env.pop("AWS_DEFAULT_REGION", None)
    env.update(AWS_REGION=DUMMY_REGION, PYSPARK_PYTHON=sys.executable,
               AWS_CONFIG_FILE=str(tmp_path / "no-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"))
    if os.environ.get("PYTHONPATH"):  # a worktree's package before the venv's
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in
                                            os.environ["PYTHONPATH"].split(os.pathsep))
    out = tmp_path / "out"
    out.mkdir()
    log = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen(
        [sys.executable, __file__, "driver", str(out), str(tmp_path / "checkpoint"),
         json.dumps({"streamName": stream})], env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)

    def driver_log() -> str:
        return (tmp_path / "driver.log").read_text()[-6000:]

    def delivered() -> Counter:
        return Counter(row for path in out.glob("batch-*.json")
                       for row in json.loads(path.read_text()))

    try:
        # a Spark application of its own: 20 s alone, 90 s and more beside CI's other tests
        wait_until(lambda: (out / "STARTED").exists() or driver.poll() is not None, 240,
                   "the query's first batch")
        assert driver.poll() is None, driver_log()
        put = put_records(stream, [(f"k{i}", f"env-{i}") for i in range(60)])
        expected = Counter(p.data.decode() for p in put)
        wait_until(lambda: sum(delivered().values()) >= len(put) or driver.poll() is not None,
                   60, "the records put after the start")
        (out / "STOP").touch()
        assert driver.wait(60) == 0, driver_log()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
        log.close()
    assert delivered() == expected, driver_log()


def _driver_main(out_dir: str, checkpoint: str, opts_json: str) -> None:
    """The subprocess driver: local-cluster[2,1,1024], format("kinesis") with the options
    given, foreachBatch writing batch-<id>-<uuid>.json files of the data; STARTED once the
    first batch has run, stops once STOP is there."""
    from pyspark.sql import SparkSession

    from kinesis_dstream.sql.datasource import register

    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("sql-cross-account")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    out = Path(out_dir)

    def write(df: Any, batch_id: int) -> None:
        rows = sorted(bytes(r.data).decode() for r in df.collect())
        path = out / f"batch-{batch_id}-{uuid.uuid4().hex[:8]}.json"
        path.with_suffix(".tmp").write_text(json.dumps(rows))
        os.replace(path.with_suffix(".tmp"), path)

    query = (spark.readStream.format("kinesis").options(**json.loads(opts_json)).load()
             .writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
             .trigger(processingTime="1 second").start())
    while query.isActive and not (out / "STOP").exists():
        if query.recentProgress and not (out / "STARTED").exists():
            (out / "STARTED").touch()
        time.sleep(0.2)
    error = query.exception()
    query.stop()
    spark.stop()
    if error is not None:
        raise SystemExit(f"query failed: {error}")


if __name__ == "__main__" and sys.argv[1:2] == ["driver"]:
    _driver_main(*sys.argv[2:5])
