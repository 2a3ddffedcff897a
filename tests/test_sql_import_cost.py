"""What each of Spark's Python processes imports of ours for a ``format("aws-kinesis")`` query.

Spark starts one Python process after another before a query's first rows (issue 38): the
data source lookup, ``create_data_source`` (the schema), the source's runner,
``plan_data_source_read`` and the executors' readers. Each imports the package; only the
runner and the readers make AWS clients. Each step here runs in a fresh interpreter and does
with our objects what that process does (pickled in one step, unpickled in the next, as
Spark hands them over), then names the modules it should not have imported: boto3 and the
heavy half of botocore (a tenth of a second and more a process), pyarrow, the read path, and
the driver's modules in a reading task.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kinesis_dstream.errors import ExecutorEnvironmentError
from kinesis_dstream.preflight import check_local_imports
from kinesis_dstream.sql import executor_guard
from kinesis_dstream.sql.datasource import KinesisDataSource

REPO = Path(__file__).resolve().parents[1]
OPTIONS = {"kinesis.streamName": "s", "kinesis.region": "us-east-1",
           "kinesis.endpointUrl": "http://127.0.0.1:9", "kinesis.startingPosition": "TRIM_HORIZON"}
AWS_CLIENTS = ("boto3", "botocore.session", "botocore.client", "urllib3", "s3transfer")
READ_PATH = ("kinesis_dstream.retrieval.shard_groups", "kinesis_dstream.retrieval.shard_reader",
             "kinesis_dstream.retrieval.polling", "kinesis_dstream.aws.kpl")
DRIVER = ("kinesis_dstream.sql.driver_state", "kinesis_dstream.sql.prober",
          "kinesis_dstream.sql.initial_positions", "kinesis_dstream.sql.consumer_listener",
          "kinesis_dstream.sql.sink", "kinesis_dstream.sql.worker_probe")

# Each step: what the process does with our objects; ``given`` is the previous step's
# ``handed``, pickled by cloudpickle (as PySpark pickles them) and unpickled by pickle.
STEPS = {
    "lookup": """
        import pyspark_kinesis, pyspark_kinesis_dstream
        for module in (pyspark_kinesis_dstream, pyspark_kinesis):
            module.DefaultSource.name()
        handed = pyspark_kinesis_dstream.DefaultSource
    """,
    "create_data_source": """
        source = given(OPTIONS)
        source.name()
        source.schema()
        handed = source
    """,
    "plan_data_source_read": """
        from pyspark.sql.datasource_internal import _streamReader
        source = given
        handed = (source, _streamReader(source, source.schema()))
    """,
    "reading_task": """
        source, reader = given
        source.name()
        import kinesis_dstream.sql.partition_reader
    """,
}
# What each step must not import.
FORBIDDEN = {
    "lookup": AWS_CLIENTS + READ_PATH + DRIVER + ("pyarrow", "kinesis_dstream.sql.options",
                                                  "kinesis_dstream.sql.reader"),
    "create_data_source": AWS_CLIENTS + READ_PATH + DRIVER + ("pyarrow",
                                                              "kinesis_dstream.sql.reader"),
    "plan_data_source_read": AWS_CLIENTS + READ_PATH + DRIVER + ("pyarrow",),
    "reading_task": DRIVER,
}

STEP = """
import json, pickle, sys
from pyspark import cloudpickle
OPTIONS = json.loads(sys.argv[2])
given_path, handed_path = sys.argv[3:5]
given = pickle.loads(open(given_path, "rb").read()) if given_path != "-" else None
handed = None
exec(compile(STEPS[sys.argv[1]], "<step>", "exec"))
if handed is not None:
    open(handed_path, "wb").write(cloudpickle.dumps(handed))
print(json.dumps(sorted(m for m in sys.argv[5].split(",") if m in sys.modules)))
"""


def run_steps(tmp_path: Path) -> dict[str, list[str]]:
    """Every step in order, each in a fresh interpreter: the forbidden modules it imported."""
    steps = {name: textwrap.dedent(code) for name, code in STEPS.items()}
    found, given = {}, "-"
    for name in STEPS:
        handed = tmp_path / f"{name}.pickle"
        done = subprocess.run(
            [sys.executable, "-c", f"STEPS = {steps!r}\n{STEP}", name, json.dumps(OPTIONS),
             given, str(handed), ",".join(FORBIDDEN[name])],
            capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        found[name] = json.loads(done.stdout.strip().splitlines()[-1])
        given = str(handed)
    return found


@pytest.mark.emulator  # subprocesses (a unit test starts none)
def test_spark_s_python_processes_import_only_what_they_use(tmp_path):
    assert run_steps(tmp_path) == {name: [] for name in STEPS}


@pytest.mark.emulator
def test_the_steps_see_what_a_process_imports(tmp_path, monkeypatch):
    """The check itself: a step that imports boto3 is caught."""
    monkeypatch.setitem(STEPS, "lookup", STEPS["lookup"] + "\n        import boto3\n")
    assert run_steps(tmp_path)["lookup"] == ["boto3", "botocore.client", "botocore.session",
                                             "s3transfer", "urllib3"]


# -- the environment checks find modules without importing them --------------------------------
@pytest.fixture
def broken_module(tmp_path, monkeypatch) -> str:
    """A module that is there but fails as it is imported."""
    (tmp_path / "kinesis_dstream_broken_module.py").write_text(
        "raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "kinesis_dstream_broken_module"


@pytest.mark.unit
def test_the_source_process_check_finds_modules_without_importing_them(broken_module):
    check_local_imports((broken_module, "json"), "the role")  # found: nothing imported
    assert broken_module not in sys.modules
    with pytest.raises(ExecutorEnvironmentError) as raised:
        check_local_imports(("json", "kinesis_dstream_no_such_module"), "the role")
    assert "the role runs" in str(raised.value)
    assert ("cannot import kinesis_dstream_no_such_module (No module named "
            "'kinesis_dstream_no_such_module')") in str(raised.value)


@pytest.mark.unit
def test_the_executor_guard_finds_modules_without_importing_them(broken_module):
    source = KinesisDataSource({"kinesis.streamName": "s"})
    reduced = executor_guard.guarded_reduce(source, dict(source.__dict__), "the reads")
    assert reduced is not None
    rebuild, args = reduced
    copy = rebuild((broken_module, *args[0]), *args[1:])
    assert broken_module not in sys.modules
    assert type(copy) is KinesisDataSource and dict(copy.options) == dict(source.options)
