"""Helpers shared by the createStream end-to-end tests (test_spark_*.py): waiting, the word
count whose result must be exact, and createStream on the test emulators."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from emulators import client
from waiting import wait_for

from kinesis_dstream import InitialPositionInStream, KinesisUtils, MetricsLevel

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]

# A line naming an exception: Python's "SomeError: why" and Java's "Caused by: x.YException".
_CAUSE = re.compile(r"^\s*(Caused by: |: )?([\w.]+(Error|Exception|Exit|Timeout)\b.*)$")


def causes(error: str, limit: int = 2000) -> str:
    """The lines of a Spark error (a query's exception, Java stack and Python traceback in
    one) that name an exception, each once, innermost last: pytest cuts a long message at
    its start, which is a Java stack trace and says nothing of why."""
    seen: list[str] = []
    for line in error.splitlines():
        match = _CAUSE.match(line)
        if match and match.group(2)[:300] not in seen:
            seen.append(match.group(2)[:300])
    return "\n".join(seen)[-limit:] or error[:limit]


def ancestry(pid: int) -> list[str]:
    """The command lines of a process and its ancestors."""
    lines = []
    while pid > 1:
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return lines


def executor_jvm_of(pid: int) -> int:
    """The executor JVM (CoarseGrainedExecutorBackend) a Python worker process runs under."""
    while pid > 1:
        if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("not a process under an executor JVM")


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    wait_for(predicate, timeout, what, interval=0.2)


def listeners_caught_up(spark: Any, timeout_s: float = 60.0) -> None:
    """Wait until every listener has handled every event posted to Spark's listener bus so
    far (the streaming query listeners too: Spark calls them from that bus)."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(int(timeout_s * 1000))


def word_lines(n: int) -> list[str]:
    """n lines of 1 to 4 words each."""
    return [" ".join(WORDS[(i + j) % 5] for j in range(1 + i % 4)) for i in range(n)]


def words_in(lines: list[str]) -> Counter:
    return Counter(w for line in lines for w in line.split())


def collected(kstream: Any) -> list:
    """Every row of every batch of ``kstream``, collected on the driver as batches finish.

    Append-only under the GIL: read ``len(rows)`` or ``list(rows)`` from the test thread."""
    rows: list = []

    def keep(rdd: Any) -> None:
        rows.extend(rdd.collect())

    kstream.foreachRDD(keep)
    return rows


class WordCounts(Counter):
    """A word count's running total, and how many batches added to it."""

    batches = 0

    def settle(self, batches: int = 2, timeout: float = 30) -> None:
        """Wait for ``batches`` more batches: what would be counted twice is counted by then."""
        target = self.batches + batches
        wait_until(lambda: self.batches >= target, timeout, f"{batches} more batches")


def count_words(kstream: Any) -> WordCounts:
    """Spark's word count on ``kstream``; returns the Counter each batch adds to.

    The counter is updated on the driver under a lock; read ``sum(counts.values())``
    (a copy of the values) from the test thread."""
    counts = WordCounts()
    lock = threading.Lock()
    pairs = kstream.flatMap(lambda line: line.split(" ")).map(lambda w: (w, 1)) \
        .reduceByKey(lambda a, b: a + b)

    def add(rdd):
        got = rdd.collect()
        with lock:
            counts.update(dict(got))
            counts.batches += 1

    pairs.foreachRDD(add)
    return counts


# createStream on the test emulators with short engine timings
FAST = dict(failover_time_ms=3000, shard_sync_interval_ms=2000, shutdown_grace_ms=8000,
            idle_time_between_reads_ms=100, parent_shard_poll_interval_ms=200)


def make_ssc(sc):
    from pyspark.streaming import StreamingContext

    return StreamingContext(sc, 1)


def create(ssc, app, stream, env, **kwargs):
    overrides = dict(FAST, **kwargs.pop("configOverrides", {}))
    position = kwargs.pop("initialPositionInStream", InitialPositionInStream.TRIM_HORIZON)
    kwargs.setdefault("metricsLevel", MetricsLevel.NONE)  # CloudWatch only where a test asks
    return KinesisUtils.createStream(
        ssc, app, stream, env["kinesis"], "us-east-1", position, kwargs.pop("checkpointInterval", 1),
        dynamoDBEndpoint=env["dynamodb"], configOverrides=overrides, **kwargs)


def leases(env, app: str) -> dict[str, dict]:
    items = client("dynamodb", env["dynamodb"]).scan(TableName=app, ConsistentRead=True)["Items"]
    return {i["leaseKey"]["S"]: i for i in items}


# -- Spark applications of their own (tests/spark_driver.py), to kill or to run two of ---------
DRIVER = Path(__file__).with_name("spark_driver.py")


def read_rows(path: Path) -> list[tuple[str, int, int, str]]:
    """A driver's output: (shard, sequence number, sub-sequence, data) per record."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 4 and parts[1].isdigit():  # a line cut by a kill is skipped
                rows.append((parts[0], int(parts[1]), int(parts[2]), parts[3]))
    return rows


def leases_at(dynamodb: str, app: str) -> dict[str, dict]:
    """The lease table's items by shard ({} until a driver created the table)."""
    ddb = client("dynamodb", dynamodb)
    try:
        items = ddb.scan(TableName=app, ConsistentRead=True)["Items"]
    except ddb.exceptions.ResourceNotFoundException:
        return {}
    return {i["leaseKey"]["S"]: i for i in items}


def start_driver(tmp_path: Path, run: int | str, app: str, stream: str, kinesis: str,
                 dynamodb: str, checkpoint: bool = False,
                 checkpoint_interval: str = "3",
                 hold: Path | None = None, fanout: bool = False,
                 extra_env: dict[str, str] | None = None,
                 ) -> tuple[subprocess.Popen, Path, Path]:
    """A driver process; returns it, its output file and the file that stops it gracefully.
    While the file ``hold`` exists, its output operation holds a batch with records. With
    ``fanout`` it reads by enhanced fan-out. ``extra_env``: more of its environment (the
    RECOVERY_* settings of spark_driver.py, credentials)."""
    out, stop = tmp_path / f"out-{run}.txt", tmp_path / f"stop-{run}"
    env = dict(os.environ, RECOVERY_OUT=str(out), RECOVERY_STOP=str(stop),
               PYSPARK_PYTHON=sys.executable, RECOVERY_CHECKPOINT_INTERVAL=checkpoint_interval,
               RECOVERY_HOLD=str(hold) if hold is not None else "",
               RECOVERY_FANOUT="1" if fanout else "", **(extra_env or {}))
    log = open(tmp_path / f"driver-{run}.log", "w")
    where = str(tmp_path / "checkpoint") if checkpoint else "-"
    proc = subprocess.Popen([sys.executable, str(DRIVER), where, app, stream, kinesis, dynamodb],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, out, stop


def lease(env, app: str, shard_id: str) -> dict:
    return client("dynamodb", env["dynamodb"]).get_item(
        TableName=app, Key={"leaseKey": {"S": shard_id}}, ConsistentRead=True)["Item"]



def shard_records(env, stream: str, shard_id: str) -> list[dict]:
    """Every record of one shard (our volumes fit a few pages)."""
    kinesis = client("kinesis", env["kinesis"])
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    out: list[dict] = []
    while iterator:
        page = kinesis.get_records(ShardIterator=iterator, Limit=10000)
        out.extend(page["Records"])
        iterator = page.get("NextShardIterator")
        if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
            break
    return out



def unique_lines(n: int, start: int = 0) -> list[str]:
    """Word-count lines, each ending in a word of its own: a word counted twice shows a
    record counted twice."""
    return [f"{line} id{i}" for i, line in enumerate(word_lines(n + start)[start:], start)]



def duplicated_ids(counts: Counter) -> dict[str, int]:
    return {w: c for w, c in counts.items() if w.startswith("id") and c > 1}


# -- where a job leaves its traces: files, Spark's logs, DynamoDB items ------------------------
def _lz4_block(data: bytes) -> bytes:
    """One LZ4 block decompressed (the format's literal runs and back-references)."""
    out, i = bytearray(), 0
    while i < len(data):
        token = data[i]
        i += 1
        length = token >> 4
        if length == 15:
            while data[i] == 255:
                length, i = length + 255, i + 1
            length, i = length + data[i], i + 1
        out += data[i:i + length]
        i += length
        if i >= len(data):
            break
        offset = data[i] | data[i + 1] << 8
        i += 2
        length = token & 15
        if length == 15:
            while data[i] == 255:
                length, i = length + 255, i + 1
            length, i = length + data[i], i + 1
        for _ in range(length + 4):
            out.append(out[-offset])
    return bytes(out)


def decompressed(data: bytes) -> bytes:
    """A file's bytes as Spark wrote what it holds: a DStream checkpoint is compressed with
    Spark's codec (lz4-java's LZ4BlockOutputStream by default), anything else as it is."""
    if not data.startswith(b"LZ4Block"):
        return data
    out, i = bytearray(), 0
    while data.startswith(b"LZ4Block", i):
        method = data[i + 8] & 0xF0
        size = int.from_bytes(data[i + 9:i + 13], "little")
        block = data[i + 21:i + 21 + size]
        out += block if method == 0x10 else _lz4_block(block)
        i += 21 + size
    return bytes(out)


def files_under(*directories: Path) -> dict[Path, bytes]:
    """Every file under ``directories``, decompressed."""
    return {path: decompressed(path.read_bytes()) for directory in directories
            for path in sorted(directory.rglob("*")) if path.is_file()}


def spark_work_dir(application_id: str) -> Path:
    """Where a local-cluster worker keeps an application's executors' stdout and stderr."""
    import pyspark

    home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    return home / "work" / application_id


def table_items(dynamodb: str, table: str) -> list[dict]:
    """Every item of a DynamoDB table."""
    ddb, items, start = client("dynamodb", dynamodb), [], {}
    while True:
        page = ddb.scan(TableName=table, ConsistentRead=True, **start)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            return items
        start = {"ExclusiveStartKey": page["LastEvaluatedKey"]}


def python_with_sitecustomize(directory: Path, name: str, sitecustomize: str) -> Path:
    """An executable that runs this interpreter with ``sitecustomize`` loaded first (a test's
    interpreter lacking a module: the sitecustomize blocks its import)."""
    site = directory / f"{name}-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize)
    python = directory / name
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}:$PYTHONPATH" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return python
