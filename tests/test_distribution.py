"""What users install and run: the wheel, and the README's cluster recipe run as written.

The wheel is built from the tracked files (a copy, so nothing is written into the checkout),
installed into a fresh virtualenv by the README's "pack" block, and that venv is what
`spark-submit --master local-cluster[2,1,1024]` ships to the executors in the README's
"submit" block. The blocks run in bash as the README shows them; only the package (the wheel
instead of PyPI's), the venv's path, the master and the job are put in. The venv holds no
pyspark: "the cluster's Spark" is this test run's pip-installed pyspark, its `bin` on PATH
for `spark-submit`. Nothing in the environment names a Python for Spark (no PYSPARK_PYTHON,
PYSPARK_DRIVER_PYTHON, SPARK_HOME), and `python3` on PATH is not the venv's: a worker that
ran it could not import the package.
"""
from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import textwrap
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from emulators import client
from test_producer import read_back

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SPARK_VARS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "PYTHONPATH",
              "VIRTUAL_ENV")
MASTER = "local-cluster[2,1,1024]"


def cluster_blocks() -> tuple[str, str]:
    """The README's two shell blocks under "Running on a cluster": pack, then submit."""
    text = README.read_text()
    section = text[text.index("### Running on a cluster"):]
    section = section[:section.index("\n## ")]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, blocks
    return blocks[0], blocks[1]


def put_in(block: str, old: str, new: str) -> str:
    assert block.count(old) == 1, f"{old!r} not once in the README block:\n{block}"
    return block.replace(old, new)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SPARK_VARS}
    env.update(extra)
    return env


def cluster_env(**extra: str) -> dict[str, str]:
    """`clean_env` with the cluster's `spark-submit` on PATH: this run's pyspark's `bin`."""
    import pyspark
    spark_bin = Path(pyspark.__file__).parent / "bin"
    env = clean_env(**extra)
    env["PATH"] = f"{spark_bin}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_bash(script: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            target = source / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((REPO / name).read_bytes())
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--disable-pip-version-check", "-q", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("kinesis_dstream-*.whl")
    return built


@pytest.fixture(scope="module")
def packed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's pack block, with the wheel for `kinesis-dstream`; returns the venv."""
    pack, _ = cluster_blocks()
    script = put_in(pack, "install kinesis-dstream pyarrow", f"install {shlex.quote(str(wheel))} pyarrow")
    where = tmp_path_factory.mktemp("pack")
    done = run_bash(script, where, clean_env(), timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (where / "env.tar.gz").is_file()
    return where / "env"


def submit(venv: Path, job: str, cwd: Path, env: dict[str, str],
           timeout: float = 600) -> subprocess.CompletedProcess:
    """The README's submit block, run from ``cwd`` (not the venv's directory)."""
    _, block = cluster_blocks()
    script = put_in(block, "venv=/path/to/env", f"venv={shlex.quote(str(venv))}")
    script = put_in(script, "--master yarn", f"--master {shlex.quote(MASTER)}")
    script = put_in(script, "\n  my_job.py\n", f"\n  {job}\n")
    assert cwd != venv.parent
    return run_bash(script, cwd, env, timeout=timeout)


# -- the wheel ---------------------------------------------------------------------------------

@pytest.mark.emulator
@pytest.mark.slow  # builds the wheel (the module fixture `wheel`)
def test_wheel_holds_the_package_the_registrations_and_the_command(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        meta = {n.split("/", 1)[1]: archive.read(n).decode() for n in names
                if n.split("/")[0].endswith(".dist-info") and "/" in n}
    for module in ("kinesis_dstream/__init__.py", "kinesis_dstream/cli.py",
                   "kinesis_dstream/_loopback.js", "kinesis_dstream/preflight.py",
                   "kinesis_dstream/retrieval/shard_reader.py", "kinesis_dstream/sql/datasource.py",
                   "kinesis_dstream/aws/kpl.py", "kinesis_dstream/worker/scheduler.py",
                   "kinesis_dstream/multilang/daemon.py",
                   "pyspark_kinesis_dstream.py", "pyspark_kinesis.py"):
        assert module in names, module
    # every module of the checkout is in the wheel, and nothing that is not the package
    in_repo = {str(p.relative_to(REPO)) for p in (REPO / "kinesis_dstream").rglob("*.py")}
    assert in_repo <= names, sorted(in_repo - names)
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {
        "kinesis_dstream", "pyspark_kinesis_dstream.py", "pyspark_kinesis.py"}
    assert re.search(r"^kinesis-dstream = kinesis_dstream\.cli:main$",
                     meta["entry_points.txt"], re.M)
    metadata = meta["METADATA"]
    for extra in ("spark", "sql", "local", "test"):
        assert f"Provides-Extra: {extra}" in metadata
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert any(r.startswith("Requires-Dist: pyarrow") and 'extra == "sql"' in r for r in requires)
    assert any(r.startswith("Requires-Dist: pyspark>=4.0") and 'extra == "sql"' in r
               for r in requires)
    assert any(r.startswith("Requires-Dist: moto") and 'extra == "local"' in r for r in requires)


@pytest.mark.spark
@pytest.mark.slow  # builds and packs a venv (the module fixture `packed`): a minute
def test_installed_wheel_runs_its_command_and_spark_finds_aws_kinesis(packed: Path, tmp_path):
    """In the fresh venv the pack block made (outside the checkout, without pyspark): the
    console script, and the cluster's Spark looking `aws-kinesis` / `kinesis` up through the
    pyspark_* top-level modules, with the venv's Python as the driver's."""
    python = str(packed / "bin" / "python")
    env = cluster_env(PYSPARK_PYTHON=python)   # where Spark looks data sources up
    done = subprocess.run([python, "-c",
                           "import importlib.util; print(importlib.util.find_spec('pyspark'))"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "None", done.stdout + done.stderr   # the archive's size
    done = subprocess.run([str(packed / "bin" / "kinesis-dstream"), "--help"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "multilang" in done.stdout, done.stderr
    # `local` from a pip install ([sql], not [local]; no node_modules here): what to install
    done = subprocess.run([str(packed / "bin" / "kinesis-dstream"), "local"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "pip install 'kinesis-dstream[local]'" in done.stderr, done.stderr
    assert "npm install kinesis-local@0.6.2 kinesalite@3.3.3 dynalite@4.0.0" in done.stderr
    code = textwrap.dedent("""
        import kinesis_dstream, pyspark_kinesis_dstream
        from pyspark.sql import SparkSession
        print("FILE", kinesis_dstream.__file__)
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1").getOrCreate())
        for name in ("aws-kinesis", "kinesis"):
            try:
                (spark.read.format(name).option("kinesis.streamName", "s")
                 .option("kinesis.endpointUrl", "http://127.0.0.1:9").load().collect())
            except Exception as exc:
                print("FORMAT", name, "reads as a stream only" in str(exc))
        spark.stop()
    """)
    (tmp_path / "lookup.py").write_text(code)
    done = subprocess.run(["spark-submit", "--master", "local[1]", "lookup.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"FILE {packed}" in done.stdout, done.stdout   # the wheel's copy, not the checkout
    # our "reads as a stream only" message: Spark found our DefaultSource under both names
    assert "FORMAT aws-kinesis True" in done.stdout and "FORMAT kinesis True" in done.stdout, \
        done.stdout + done.stderr[-3000:]


# -- the cluster recipe ------------------------------------------------------------------------

WORDS = {"alpha": 30, "beta": 20, "gamma": 10}


def put_words(endpoint: str, stream: str) -> None:
    kinesis = client("kinesis", endpoint)
    words = [w for w, n in WORDS.items() for _ in range(n)]
    entries = [{"Data": w.encode(), "PartitionKey": f"key-{i}"} for i, w in enumerate(words)]
    result = kinesis.put_records(StreamName=stream, Records=entries)
    assert result["FailedRecordCount"] == 0


def summed_counts(stdout: str) -> Counter:
    """pprint's per-batch `('word', n)` lines, summed over batches."""
    total: Counter = Counter()
    for line in stdout.splitlines():
        if line.startswith("("):
            word, count = ast.literal_eval(line)
            total[word] += count
    return total


@pytest.mark.spark
def test_dstream_example_submitted_with_the_packed_venv(packed: Path, local_env, make_stream,
                                                        unique_app_name, tmp_path):
    stream = make_stream(2)
    put_words(local_env["AWS_ENDPOINT_URL_KINESIS"], stream)
    job = " ".join(shlex.quote(a) for a in (
        str(REPO / "samples" / "kinesis_wordcount_asl.py"), unique_app_name, stream,
        local_env["AWS_ENDPOINT_URL_KINESIS"], "us-east-1"))
    env = cluster_env(**local_env, KINESIS_INITIAL_POSITION="TRIM_HORIZON",
                      WORDCOUNT_SECONDS="15")
    done = submit(packed, job, tmp_path, env)
    assert done.returncode == 0, done.stderr[-5000:]
    assert summed_counts(done.stdout) == Counter(WORDS), done.stdout[-3000:]


@pytest.mark.spark
def test_sql_source_and_sink_submitted_with_the_packed_venv(packed: Path, local_env, make_stream,
                                                            unique_app_name, tmp_path):
    source, target = make_stream(2), make_stream(2)
    put_words(local_env["AWS_ENDPOINT_URL_KINESIS"], source)
    job = " ".join(shlex.quote(a) for a in (
        str(REPO / "samples" / "kinesis_sql_copy.py"), unique_app_name, source, target,
        local_env["AWS_ENDPOINT_URL_KINESIS"], "us-east-1", str(tmp_path / "checkpoint")))
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    done = submit(packed, job, run_dir, cluster_env(**local_env))
    assert done.returncode == 0, done.stderr[-5000:]
    _, users = read_back(local_env["AWS_ENDPOINT_URL_KINESIS"], target)
    assert Counter(u.binary_data.decode() for u in users) == Counter(WORDS)
    assert len(users) == sum(WORDS.values())           # each record once
