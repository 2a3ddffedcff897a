"""format("aws-kinesis") run as `venv/bin/python job.py`, with no PYSPARK_PYTHON: Spark looks
Python data sources up in `python3` from PATH, which lacks the package. `register(spark)` makes
the format work from the driver's own Python, or says which interpreter cannot import what."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spark_helpers import python_with_sitecustomize
from test_new_user import python_without_the_package
from test_producer import read_back

pytestmark = pytest.mark.spark

SPARK_VARS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "PYTHONPATH")

JOB = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from kinesis_dstream.sql.datasource import register

    stream, endpoint = sys.argv[1:]
    spark = (SparkSession.builder.master("local-cluster[1,1,1024]")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    df = spark.createDataFrame([("k1", "one"), ("k2", "two")], "partitionKey string, data string")
    options = {"kinesis.streamName": stream, "kinesis.endpointUrl": endpoint,
               "kinesis.region": "us-east-1"}
    try:
        df.write.format("aws-kinesis").options(**options).mode("append").save()
    except Exception as exc:
        print("BEFORE REGISTER:", "DATA_SOURCE_NOT_FOUND" in str(exc), flush=True)
    register(spark)
    df.write.format("aws-kinesis").options(**options).mode("append").save()
    print("WRITTEN", flush=True)
    spark.stop()
""")


def run_job(tmp_path: Path, stream: str, endpoint: str, **extra: str):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in SPARK_VARS}
    env.update(extra)
    return subprocess.run([sys.executable, str(script), stream, endpoint], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


def test_register_makes_the_format_work_from_venv_python_job_py(aws_env, kinesis_local,
                                                                make_stream, tmp_path):
    stream = make_stream(1)
    done = run_job(tmp_path, stream, kinesis_local)
    assert done.returncode == 0, done.stderr[-5000:]
    assert "BEFORE REGISTER: True" in done.stdout      # Spark's lookup ran python3 from PATH
    assert "WRITTEN" in done.stdout
    _, users = read_back(kinesis_local, stream)
    assert sorted(u.binary_data for u in users) == [b"one", b"two"]   # on the executor


@pytest.mark.matrix
def test_register_names_an_executor_python_without_the_package(aws_env, kinesis_local,
                                                               make_stream, tmp_path):
    python = python_without_the_package()
    done = run_job(tmp_path, make_stream(1), kinesis_local, PYSPARK_PYTHON=python)
    assert done.returncode != 0
    error = [line for line in done.stderr.splitlines() if "ExecutorEnvironmentError" in line]
    assert error, done.stderr[-5000:]
    assert "cannot import kinesis_dstream" in error[-1] and "PYSPARK_PYTHON" in error[-1]
    assert "WRITTEN" not in done.stdout


BLOCK_PYARROW = textwrap.dedent("""
    import importlib.abc, sys
    class _NoArrow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "pyarrow":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, _NoArrow())
""")


@pytest.mark.matrix
def test_the_format_names_a_python_without_pyarrow(aws_env, kinesis_local, make_stream,
                                                   tmp_path):
    """PYSPARK_PYTHON has the package but not pyarrow (the [spark] extra only): the write
    fails when Spark asks the data source for its writer, naming interpreter and extra."""
    python = python_with_sitecustomize(tmp_path, "python-without-pyarrow", BLOCK_PYARROW)
    script = tmp_path / "write.py"
    script.write_text(textwrap.dedent("""
        import sys
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1").getOrCreate())
        df = spark.createDataFrame([("k1", "one")], "partitionKey string, data string")
        try:
            (df.write.format("aws-kinesis").option("kinesis.streamName", sys.argv[1])
             .option("kinesis.endpointUrl", sys.argv[2]).mode("append").save())
            print("WRITTEN")
        except Exception as exc:
            print("FAILED", str(exc)[:3000])
        spark.stop()
    """))
    env = {k: v for k, v in os.environ.items() if k not in SPARK_VARS}
    env["PYSPARK_PYTHON"] = str(python)
    done = subprocess.run([sys.executable, str(script), make_stream(1), kinesis_local],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    assert "FAILED" in done.stdout, done.stdout
    assert "ExecutorEnvironmentError" in done.stdout and "cannot import pyarrow" in done.stdout
    assert "kinesis-dstream[sql]" in done.stdout
