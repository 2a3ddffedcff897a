"""The Java KCL 3.1.3's multi-stream worker and ours share one lease table.

The MultiLangDaemon reads one stream, so tests/java/MultiStreamWorker.java (a KCL
``Scheduler`` with a ``MultiStreamTracker``, polling, metrics off) is compiled here against
the jars `make setup` installs into .kcl3/ (tests/java_kcl.py). Both read two streams on
kinesis-local and moto: ours reads first and stops; the Java worker takes the table over and
resumes at our checkpoints (it reads none of our records again); then ours takes it back and
resumes at Java's. The Java worker is given the stream identifiers our worker derived.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from java_kcl import JVM_FLAGS, KCL3_SETTINGS, kcl3_jars
from processes import reap
from test_kclrs_interop import checkpoints, ours_first, put, run_ours
from test_scheduler import lease_items
from waiting import wait_for

from kinesis_dstream.aws.stream_identifier import StreamIdentifier, parse_lease_key
from kinesis_dstream.multilang.java_daemon import find_java

SOURCE = Path(__file__).with_name("java") / "MultiStreamWorker.java"


@pytest.fixture(scope="module")
def worker_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MultiStreamWorker compiled against the KCL 3 jars; fails (not skips) without a JDK."""
    javac = shutil.which("javac")
    assert javac, "javac not found: the Java KCL tests need a JDK 17 (see README)"
    classes = tmp_path_factory.mktemp("java-multi-stream")
    subprocess.run([javac, "-nowarn", "-d", str(classes), "-cp", f"{kcl3_jars()}/*", str(SOURCE)],
                   check=True, timeout=300)
    return classes


@pytest.fixture
def java_worker(worker_classes: Path, tmp_path: Path) -> Iterator[Any]:
    """Starts MultiStreamWorker with the given JSON arguments; stopped at teardown."""
    started: list[subprocess.Popen] = []

    def start(**args: Any) -> subprocess.Popen:
        command = [find_java(), *JVM_FLAGS, "-cp", f"{worker_classes}:{kcl3_jars()}/*",
                   "MultiStreamWorker", json.dumps(args)]
        with open(tmp_path / "java.log", "ab") as log:
            started.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True))
        return started[-1]

    yield start
    for process in started:
        reap(process)


@pytest.mark.emulator
@pytest.mark.timeout(300)
def test_java_kcl3_takes_over_our_table_and_we_take_it_back(
        local_env, kinesis_local, dynamodb, make_stream, make_config, java_worker, tmp_path):
    streams, config, first, identifiers, ours_done = ours_first(
        kinesis_local, dynamodb, make_stream, make_config)
    table = config.application_name

    second = put(kinesis_local, streams, "second", 10)
    out = tmp_path / "java.jsonl"
    java = java_worker(ids=identifiers, app=table, kinesis=kinesis_local, dynamodb=dynamodb,
                       cloudwatch=dynamodb, region=local_env["AWS_REGION"], worker="java",
                       out=str(out), failover_ms=10000,
                       assignment_ms=KCL3_SETTINGS["leaseAssignmentIntervalMillis"])

    def events(kind: str) -> list[dict]:
        lines = out.read_text().splitlines() if out.exists() else []
        return [e for e in map(json.loads, lines) if e["e"] == kind]

    def log() -> str:
        return (tmp_path / "java.log").read_text(errors="replace")[-4000:]

    # Java resumed at our checkpoints: it initialized every shard at them and delivered
    # none of the records we had processed.
    wait_for(lambda: set(second) <= {e["data"] for e in events("rec")} or java.poll() is not None,
             120, "the Java worker to read the second batch", log)
    assert java.poll() is None, log()
    assert not {e["data"] for e in events("rec")} & set(first), \
        "the Java worker read records our worker had checkpointed"
    inits = {f'{e["stream"]}:{e["shard"]}': e["seq"] for e in events("init")}
    assert inits == {key: c.sequence_number for key, c in ours_done.items()}
    last = {f'{e["stream"]}:{e["shard"]}': e["seq"] for e in events("rec")}
    assert set(last) == set(ours_done)
    wait_for(lambda: {k: c.sequence_number for k, c in checkpoints(dynamodb, table).items()}
             == last, 30, "the Java worker to checkpoint the second batch", log)
    java.send_signal(signal.SIGTERM)
    java.wait(60)  # 143: the JVM's exit on SIGTERM, after its shutdown hook
    assert events("stopped") and not events("shutdown_failed"), log()
    java_done = checkpoints(dynamodb, table)
    assert set(java_done) == set(ours_done)
    # The KCL's multi-stream items: the key is streamName:shardId, both also attributes.
    for key, item in lease_items(dynamodb, table).items():
        assert parse_lease_key(key) == (StreamIdentifier.parse(item["streamName"]["S"]),
                                        item["shardId"]["S"]), item

    third = put(kinesis_local, streams, "third", 10)
    seen, ours_inits, _ = run_ours(config, streams, set(third), "ours-2")
    # Ours resumed at Java's checkpoints: nothing of the second batch again.
    assert not set(seen) & set(second), "our worker read records the Java worker had checkpointed"
    assert ours_inits == java_done
