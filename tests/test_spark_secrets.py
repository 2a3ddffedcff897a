"""A static secret key given to a job is in none of the files, logs and DynamoDB items it
leaves: Spark's checkpoint directory (DStream and SQL), the driver's and the executors' logs
(local-cluster: each executor's stderr in Spark's work directory), the lease and the
batch-range tables. Each grep also looks for something that must be there (the key id, the
stream's name), so a grep that cannot see into a file fails instead of passing.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from spark_helpers import (
    files_under,
    leases_at,
    read_rows,
    spark_work_dir,
    start_driver,
    table_items,
    wait_until,
)

from kinesis_dstream.aws.range_table import range_table_name

# Three drivers, each a local cluster of its own, one after the other: 79 s alone, several
# times that on a CI machine whose cores the other tests keep busy.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(720)]

MASTER = "local-cluster[2,1,1024]"
SQL_DRIVER = Path(__file__).with_name("sql_driver.py")


def static_key() -> tuple[str, str]:
    return "AKIDKD" + uuid.uuid4().hex[:14].upper(), "kd-secret-" + uuid.uuid4().hex


def holding(value: str, places: dict[str, bytes]) -> list[str]:
    return [name for name, data in places.items() if value.encode() in data]


def traces(dynamodb: str, tables: list[str], directories: list[Path],
           logs: list[Path]) -> dict[str, bytes]:
    """What a job left, by where: files under ``directories``, ``logs``, each table's items."""
    places = {str(path): data for path, data in files_under(*directories).items()}
    places.update({str(path): path.read_bytes() for path in logs})
    places.update({f"table {table}": repr(table_items(dynamodb, table)).encode()
                   for table in tables})
    return places


def application_id(log: Path) -> str:
    lines = [line for line in log.read_text().splitlines() if line.startswith("APP ")]
    return lines[-1].split()[1]


def test_dstream_secret_key_stays_out_of_checkpoint_logs_and_tables_and_recovery_finds_it(
        tmp_path, aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name):
    """A driver given a static key by createStream is killed -9; a driver recovered from its
    checkpoint without the key fails at start, one with the key in its environment reads on."""
    key_id, secret = static_key()
    stream = make_stream(1)
    put_records(stream, [(f"k{i}", f"r{i}") for i in range(50)])
    settings = {"RECOVERY_MASTER": MASTER, "RECOVERY_LOG_LEVEL": "DEBUG"}
    driver, out1, _ = start_driver(tmp_path, 1, unique_app_name, stream, kinesis_local,
                                   dynamodb, checkpoint=True, checkpoint_interval="1",
                                   extra_env={**settings,
                                              "RECOVERY_STATIC_KEY": f"{key_id}:{secret}"})
    checkpoint = tmp_path / "checkpoint"
    try:
        wait_until(lambda: len(read_rows(out1)) >= 50, 180, "the first driver's records")
        wait_until(lambda: [i["checkpoint"]["S"].isdigit()
                            for i in leases_at(dynamodb, unique_app_name).values()] == [True],
                   60, "the shard's checkpoint")
        wait_until(lambda: any(checkpoint.glob("checkpoint-*")), 60, "Spark's checkpoint")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    tables = [unique_app_name, range_table_name(unique_app_name)]
    first_app = application_id(tmp_path / "driver-1.log")
    places = traces(dynamodb, tables, [checkpoint, spark_work_dir(first_app)],
                    [tmp_path / "driver-1.log"])
    assert holding(key_id, places), "the grep sees no spec in Spark's checkpoint"
    assert any("stderr" in name for name in places), "no executor's stderr was found"
    assert holding(secret, places) == []

    # Recovery without the key fails at ssc.start(), naming the key id and the fix ...
    driver, _, _ = start_driver(tmp_path, "without-key", unique_app_name, stream,
                                kinesis_local, dynamodb, checkpoint=True, extra_env=settings)
    assert driver.wait(timeout=180) != 0
    failed = (tmp_path / "driver-without-key.log").read_text()
    assert "Error starting the context" in failed and "STARTED" not in failed
    assert (f"recovered from Spark's checkpoint, which keeps its access key id {key_id} but "
            f"never the secret key; give the driver that key before "
            f"StreamingContext.getOrCreate: AWS_ACCESS_KEY_ID={key_id} with "
            "AWS_SECRET_ACCESS_KEY in its environment, or AWS_PROFILE") in failed
    # ... and with the same key, given to the new driver by its environment, reads on.
    put_records(stream, [(f"k{i}", f"s{i}") for i in range(50)])
    driver, out2, stop2 = start_driver(
        tmp_path, 2, unique_app_name, stream, kinesis_local, dynamodb, checkpoint=True,
        checkpoint_interval="1",
        extra_env={**settings, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret})
    try:
        wait_until(lambda: {d for _, _, _, d in read_rows(out2)} >= {f"s{i}" for i in range(50)}
                   or driver.poll() is not None, 180, "the recovered driver's records")
        assert driver.poll() is None, (tmp_path / "driver-2.log").read_text()[-3000:]
        stop2.touch()
        driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    log2 = tmp_path / "driver-2.log"
    assert "CREATED" not in log2.read_text()  # getOrCreate recovered; setup() never ran
    # the driver's own environment held it: only the executors' logs and the files count
    places = traces(dynamodb, tables, [checkpoint, spark_work_dir(application_id(log2))],
                    [log2, tmp_path / "driver-without-key.log"])
    assert holding(secret, places) == []


def test_sql_source_and_sink_secret_keys_stay_out_of_checkpoint_logs_and_tables(
        tmp_path, aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name):
    """A query reads one stream and writes another, both with static keys in the options
    (the short and the awslabs spellings), in an application of its own whose whole log
    (its driver's JVM and Python processes) is kept."""
    key_id, secret = static_key()
    source, target = make_stream(1), make_stream(1)
    put_records(source, [(f"k{i}", f"r{i}") for i in range(50)])
    checkpoint = tmp_path / "checkpoint"
    source_options = {"kinesis.streamName": source, "kinesis.endpointUrl": kinesis_local,
                      "kinesis.region": "us-east-1", "kinesis.dynamodb.endpointUrl": dynamodb,
                      "kinesis.dynamodb.tableName": unique_app_name,
                      "kinesis.startingPosition": "TRIM_HORIZON",
                      "awsAccessKeyId": key_id, "awsSecretKey": secret}
    sink_options = {"kinesis.streamName": target, "kinesis.endpointUrl": kinesis_local,
                    "kinesis.region": "us-east-1", "kinesis.awsAccessKeyId": key_id,
                    "kinesis.awsSecretKey": secret}
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.run(
            [sys.executable, str(SQL_DRIVER), str(checkpoint), json.dumps(source_options),
             json.dumps(sink_options), "50"], stdout=out, stderr=subprocess.STDOUT,
            env=dict(os.environ, SQL_DRIVER_MASTER=MASTER, PYSPARK_PYTHON=sys.executable),
            timeout=300, check=False)
    assert driver.returncode == 0 and "DONE" in log.read_text(), log.read_text()[-3000:]
    places = traces(dynamodb, [range_table_name(unique_app_name)],
                    [checkpoint, spark_work_dir(application_id(log))], [log])
    assert holding(source, places), "the grep sees no offsets in the query's checkpoint"
    assert any("stderr" in name for name in places), "no executor's stderr was found"
    assert holding(secret, places) == []
