"""A new user's first run: the README's migration example as `venv/bin/python job.py`.

No PYSPARK_PYTHON, no spark-submit: Spark's Python workers would run `python3` from PATH, which
here (as on most machines) lacks the package. On a local master the example must count the
words anyway (the workers run the driver's interpreter); with PYSPARK_PYTHON naming a Python
without the package, createStream must fail at once, naming that interpreter and the fix.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from emulators import client, create_stream, delete_stream

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent
SPARK_VARS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "PYTHONPATH")
# The names the README's example uses.
STREAM, APP = "words", "word-count-app"


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Migrating a DStream job"):]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def python_without_the_package() -> str:
    """The interpreter this venv was made from: `python3` as a user's PATH would have it."""
    base = getattr(sys, "_base_executable", "") or ""
    assert base and sys.prefix != sys.base_prefix, "the tests run in a virtualenv (make setup)"
    probe = subprocess.run([base, "-c", "import kinesis_dstream"], capture_output=True,
                           cwd="/", timeout=60)
    assert probe.returncode != 0, f"{base} can import kinesis_dstream"
    return base


class Job:
    """`python job.py` in its own process group; output collected as it comes."""

    def __init__(self, script: Path, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen([sys.executable, str(script)], cwd=script.parent,
                                        env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)   # python, its JVM and workers
        self.process.wait(timeout=60)
        self.reader.join(timeout=10)


@pytest.fixture
def job_env(local_env: dict[str, str], kinesis_local: str, dynamodb: str) -> Iterator[dict[str, str]]:
    create_stream(kinesis_local, STREAM, 1)
    env = {k: v for k, v in os.environ.items() if k not in SPARK_VARS}
    env.update(local_env)
    yield env
    delete_stream(kinesis_local, STREAM)
    kinesis = client("kinesis", kinesis_local)
    gone = time.monotonic() + 30   # the next test creates the same name
    while STREAM in kinesis.list_streams()["StreamNames"] and time.monotonic() < gone:
        time.sleep(0.1)
    ddb = client("dynamodb", dynamodb)
    for table in (APP, f"{APP}-kinesis-dstream-ranges"):
        try:
            ddb.delete_table(TableName=table)
        except ddb.exceptions.ResourceNotFoundException:
            pass


@pytest.fixture
def job_script(tmp_path: Path) -> Path:
    script = tmp_path / "job.py"
    script.write_text(readme_example())
    return script


def test_readme_example_as_venv_python_job_py_counts_the_words(job_env, job_script,
                                                              kinesis_local):
    job = Job(job_script, job_env)
    kinesis = client("kinesis", kinesis_local)
    try:
        # LATEST: words put before the job holds the lease are not its; keep putting.
        deadline = time.monotonic() + 240
        while not re.search(r"\('newuser', \d+\)", job.output):
            assert job.process.poll() is None, job.output[-5000:]
            assert time.monotonic() < deadline, "no counts within 240 s:\n" + job.output[-5000:]
            kinesis.put_record(StreamName=STREAM, Data=b"newuser hello newuser",
                               PartitionKey="p")
            time.sleep(0.5)
    finally:
        job.stop()
    assert "ModuleNotFoundError" not in job.output
    assert re.search(r"\('hello', \d+\)", job.output)


def test_with_pyspark_python_lacking_the_package_create_stream_names_it(job_env, job_script):
    python = python_without_the_package()
    env = dict(job_env, PYSPARK_PYTHON=python)
    done = subprocess.run([sys.executable, str(job_script)], cwd=job_script.parent, env=env,
                          capture_output=True, text=True, timeout=120,
                          start_new_session=True)
    assert done.returncode != 0
    error = [line for line in done.stderr.splitlines() if "ExecutorEnvironmentError" in line]
    assert error, done.stderr[-5000:]
    assert python in error[-1] or os.path.realpath(python) in error[-1], error[-1]
    assert "cannot import kinesis_dstream" in error[-1]
    assert "PYSPARK_PYTHON" in error[-1] and "spark.pyspark.python" in error[-1]
    assert "KinesisUtils.createStream(" in done.stderr  # raised there, before ssc.start()
