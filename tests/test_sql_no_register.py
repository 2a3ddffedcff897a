"""format("aws-kinesis") / format("kinesis") used as the connectors' docs show them: no
``register(spark)``.

The session here is a new one on the session's SparkContext (``newSession()``: none of the
registrations or query listeners that other modules' ``spark`` fixture made), so the formats
are the ones PySpark's own lookup found (``pyspark_kinesis_dstream``, ``pyspark_kinesis``).
What ``register`` did besides is done by the source itself: its driver-side process
deregisters a fan-out consumer when Spark stops the query (``sql/source_stop.py``), and the
executors' reads fail naming the interpreter that lacks the package
(``sql/executor_guard.py``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

import emulators
from spark_helpers import python_with_sitecustomize, wait_until
from test_sql_fanout import consumers
from test_sql_preflight import SPARK_VARS
from test_sql_source import Batches, options, stop
from waiting import wait_for

pytestmark = pytest.mark.spark

LIFETIME_S = 6.0
# Of stop() returning (issue 38). It had timed out in CI (at 10 s beside two CPU hogs, then at
# 60 s): the consumer was kept when stop() closed the source's socket before Spark's SIGTERM
# came (source_stop.SPARK_STOP_WAIT_S; tests/test_source_stop_process.py).
DEREGISTERED_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def plain_spark(sc: Any) -> Iterator[Any]:
    """A session on which nothing of ours was called: ``register`` never ran in it."""
    from pyspark.sql import SparkSession

    session = SparkSession(sc).newSession()
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session


def source_processes(sc: Any) -> set[int]:
    """The Python processes the driver's JVM runs for streaming sources (one per running
    source, ended by Spark when its query stops)."""
    jvm = sc._gateway.proc.pid
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == jvm and b"python_streaming_source_runner" in cmdline:
            found.add(int(proc.name))
    return found


def start(spark: Any, fmt: str, opts: dict[str, str], checkpoint: str, sink: Batches) -> Any:
    df = spark.readStream.format(fmt).options(**opts).load()
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second").start())


@pytest.mark.matrix
@pytest.mark.timeout(300)  # the session's Spark may start inside it (90 s loaded)
def test_without_register_a_graceful_stop_deregisters_the_consumer_as_the_options_say(
        plain_spark, sc, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    """Three queries on one stream, each by its own consumer: the awslabs example
    (SubscribeToShard: deregistered on stop()), Databricks' names with
    requireConsumerDeregistration true (deregistered) and false (kept). Each consumer is
    ACTIVE while its query runs."""
    stream = make_stream(1)
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1)
    put = emulators.put_records(front.endpoint, stream, [(f"pk-{i}", f"r-{i}") for i in range(20)])
    awslabs = options(stream, front.endpoint, dynamodb, f"{unique_app_name}-a", **{
        "kinesis.consumerType": "SubscribeToShard", "kinesis.consumerName": f"{unique_app_name}-a"})
    databricks = {"streamName": stream, "endpointUrl": front.endpoint, "region": "us-east-1",
                  "kinesis.dynamodb.endpointUrl": dynamodb, "initialPosition": "TRIM_HORIZON",
                  "consumerMode": "efo", "kinesis.clientRetryIntervalsMs": "100"}
    runs = {
        f"{unique_app_name}-a": ("aws-kinesis", awslabs),
        f"{unique_app_name}-d": ("kinesis", {**databricks, "consumerName": f"{unique_app_name}-d",
                                             "kinesis.dynamodb.tableName": f"{unique_app_name}-d",
                                             "requireConsumerDeregistration": "true"}),
        f"{unique_app_name}-k": ("kinesis", {**databricks, "consumerName": f"{unique_app_name}-k",
                                             "kinesis.dynamodb.tableName": f"{unique_app_name}-k",
                                             "requireConsumerDeregistration": "false"}),
    }
    sinks = {name: Batches() for name in runs}
    queries = {name: start(plain_spark, fmt, opts, str(tmp_path / name), sinks[name])
               for name, (fmt, opts) in runs.items()}
    try:
        wait_until(lambda: all(set(s.data()) >= {r.data for r in put} for s in sinks.values())
                   or not all(q.isActive for q in queries.values()), 120,
                   "every query's first records")
        assert all(q.isActive for q in queries.values()), [q.exception() for q in queries.values()]
        assert consumers(kinesis_local, stream) == {name: "ACTIVE" for name in runs}
    finally:
        for query in queries.values():
            stop(query)
    gone = lambda name: consumers(kinesis_local, stream).get(name) in (None, "DELETING")  # noqa: E731
    wait_for(lambda: gone(f"{unique_app_name}-a") and gone(f"{unique_app_name}-d"),
             DEREGISTERED_WITHIN_S, "the awslabs and requireConsumerDeregistration consumers "
             f"deregistered within {DEREGISTERED_WITHIN_S:.0f} s of stop()",
             lambda: f"consumers: {consumers(kinesis_local, stream)}", interval=0.2)
    # Every source process has ended (each decided as it ended): the one kept is still there.
    wait_until(lambda: not source_processes(sc), 30, "the sources' processes ended")
    assert consumers(kinesis_local, stream).get(f"{unique_app_name}-k") == "ACTIVE"


NO_PACKAGE_JOB = textwrap.dedent("""
    import sys, time
    from pyspark.sql import SparkSession

    stream, endpoint, dynamodb, workers_python = sys.argv[1:]
    spark = (SparkSession.builder.master("local-cluster[1,1,1024]")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.execution.pyspark.python", workers_python)
             .getOrCreate())
    started = time.monotonic()
    query = (spark.readStream.format("aws-kinesis")
             .option("kinesis.streamName", stream).option("kinesis.endpointUrl", endpoint)
             .option("kinesis.region", "us-east-1")
             .option("kinesis.dynamodb.endpointUrl", dynamodb)
             .option("kinesis.dynamodb.tableName", stream)
             .option("kinesis.startingPosition", "TRIM_HORIZON")
             .load().writeStream.format("noop").start())
    try:
        query.awaitTermination(120)
        print("STILL RUNNING" if query.isActive else "ENDED", flush=True)
    except Exception as exc:
        print("FAILED AFTER %.1f s" % (time.monotonic() - started), flush=True)
        print(str(exc)[:20000], flush=True)
    query.stop()
    spark.stop()
""")


BLOCK_THE_PACKAGE = textwrap.dedent("""
    import importlib.abc, sys
    class _NoPackage(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("kinesis_dstream", "pyspark_kinesis_dstream",
                                      "pyspark_kinesis"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, _NoPackage())
""")


@pytest.mark.matrix
@pytest.mark.alone  # 20-22 s alone; 46 s in CI beside the spark tier's two workers and pauses
@pytest.mark.timeout(300)
def test_without_register_executors_without_the_package_fail_the_first_batch_naming_the_fix(
        aws_env, kinesis_local, dynamodb, make_stream, tmp_path):
    """The driver side has the package (Spark's lookup finds the format), the executors'
    SQL workers run a Python that has pyspark's own needs (pyarrow) but not the package:
    the query fails within 30 s of start() with the error naming that interpreter and the
    fix, as register(spark)'s probe would have. (A Python without pyarrow fails earlier, in
    PySpark's own unpickling of its read function: "No module named 'pyarrow'".)"""
    stream = make_stream(1)
    emulators.put_records(kinesis_local, stream, [(f"pk-{i}", f"r-{i}") for i in range(5)])
    workers = python_with_sitecustomize(tmp_path, "python-without-the-package",
                                        BLOCK_THE_PACKAGE)
    script = tmp_path / "job.py"
    script.write_text(NO_PACKAGE_JOB)
    env = {k: v for k, v in os.environ.items() if k not in SPARK_VARS}
    env["PYSPARK_PYTHON"] = sys.executable
    if os.environ.get("PYTHONPATH"):  # a worktree's package before the venv's (make setup)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in
                                            os.environ["PYTHONPATH"].split(os.pathsep))
    done = subprocess.run([sys.executable, str(script), stream, kinesis_local, dynamodb,
                           str(workers)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=280)
    assert done.returncode == 0, done.stderr[-5000:]
    lines = done.stdout.splitlines()
    assert lines and lines[0].startswith("FAILED AFTER"), done.stdout[-3000:] + done.stderr[-3000:]
    assert float(lines[0].split()[2]) < 30.0, lines[0]
    error = [line for line in lines if "ExecutorEnvironmentError" in line]
    assert error, done.stdout[-5000:]
    assert f"run {sys.executable}" in error[0] and "cannot import kinesis_dstream" in error[0]
    assert "spark.sql.execution.pyspark.python" in error[0]


PLAIN_REGISTER_JOB = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from kinesis_dstream.sql.datasource import KinesisDataSource

    stream, endpoint = sys.argv[1:]
    spark = (SparkSession.builder.master("local-cluster[1,1,1024]")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.dataSource.register(KinesisDataSource)  # PySpark's own call, nothing of ours
    df = spark.createDataFrame([("k1", "one"), ("k2", "two")], "partitionKey string, data string")
    (df.write.format("aws-kinesis").option("kinesis.streamName", stream)
     .option("kinesis.endpointUrl", endpoint).option("kinesis.region", "us-east-1")
     .mode("append").save())
    print("WRITTEN", flush=True)
    spark.stop()
""")


@pytest.mark.matrix
@pytest.mark.timeout(300)
def test_pyspark_s_own_register_from_venv_python_job_py_runs_the_source_in_that_python(
        aws_env, kinesis_local, make_stream, tmp_path):
    """`venv/bin/python job.py` with no PYSPARK_PYTHON: Spark would run the registered
    source's processes in `python3` from PATH, which lacks the package; on a local master
    the class's registration records the driver's Python instead, as register(spark) does."""
    from test_producer import read_back

    stream = make_stream(1)
    script = tmp_path / "job.py"
    script.write_text(PLAIN_REGISTER_JOB)
    env = {k: v for k, v in os.environ.items() if k not in SPARK_VARS}
    if os.environ.get("PYTHONPATH"):  # a worktree's package before the venv's (make setup)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in
                                            os.environ["PYTHONPATH"].split(os.pathsep))
    done = subprocess.run([sys.executable, str(script), stream, kinesis_local], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0 and "WRITTEN" in done.stdout, done.stderr[-5000:]
    _, users = read_back(kinesis_local, stream)
    assert sorted(u.binary_data for u in users) == [b"one", b"two"]  # on the executor
