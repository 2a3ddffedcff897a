"""Helpers of the Spark benchmarks (bench_spark.py): one SparkContext, streams, worker pids.

Kept apart from common.py (the bare engine's helpers, owned elsewhere). Imported lazily
where pyspark is heavy; run directly (``make bench`` runs every bench/*.py) it does nothing.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from typing import Any, Callable

import common

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

BATCH_INTERVAL_S = 1


LOCAL = "local[2]"
CLUSTER = "local-cluster[2,1,1024]"  # two executor JVMs in processes of their own


def spark_context(master: str = LOCAL, settings: dict[str, str] | None = None) -> Any:
    """The SparkContext of a benchmark (as the tests: loopback, no UI). On ``CLUSTER`` the
    records are read in executor processes, as on a real cluster. ``settings``: more Spark
    conf (a benchmark's own knobs; ``BENCH_SPARK_CONF`` still comes last)."""
    from pyspark import SparkConf, SparkContext

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = (SparkConf().setMaster(master).setAppName("kinesis-dstream-bench")
            .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.ui.showConsoleProgress", "false")
            .set("spark.executorEnv.PYSPARK_PYTHON", sys.executable))
    for key, value in (settings or {}).items():
        conf.set(key, value)
    for item in os.environ.get("BENCH_SPARK_CONF", "").split():  # k=v ... for experiments
        conf.set(*item.split("=", 1))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    return sc


def driver_jvm_pid(sc: Any) -> int | None:
    """The driver's JVM (py4j gateway) process; on local-cluster it also hosts the master and
    workers, but not the executors."""
    proc = getattr(sc._gateway, "proc", None)
    return proc.pid if proc is not None else None


class DriverCpu:
    """CPU seconds of the driver: its Python process and its JVM, between start and now."""

    def __init__(self, sc: Any) -> None:
        self.jvm_pid = driver_jvm_pid(sc)
        self.python0 = common.self_cpu_seconds()
        self.jvm0 = common.process_cpu_seconds(self.jvm_pid) if self.jvm_pid else 0.0

    def used(self) -> dict[str, float]:
        python = common.self_cpu_seconds() - self.python0
        jvm = (common.process_cpu_seconds(self.jvm_pid) - self.jvm0) if self.jvm_pid else 0.0
        return {"python_s": round(python, 2), "jvm_s": round(jvm, 2)}


def warm_up(sc: Any) -> float:
    """One small Python job, so no measurement pays Spark's first-job start (seconds); its time."""
    started = time.monotonic()
    data = [f"{i:010d}".ljust(100, "x").encode() for i in range(50_000)]
    for _ in range(2):  # the second pass warms what the first one left cold
        sc.parallelize(data, sc.defaultParallelism).map(lambda b: b.decode("utf-8")).count()
    return time.monotonic() - started


def warm_up_sql(spark: Any) -> float:
    """One small read through a Python data source, so no measurement of a Python source pays
    the first start of the Python workers Spark SQL reads through (the executors' workers of
    ``warm_up``'s RDD jobs do not serve them); its time in seconds."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    tasks = int(spark.sparkContext.defaultParallelism)

    class WarmUpReader(DataSourceReader):  # local classes: pickled by value, for executors
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(tasks)]

        def read(self, partition: InputPartition) -> Any:
            yield (partition.value,)

    class WarmUpSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench-warm-up"

        def schema(self) -> str:
            return "id int"

        def reader(self, schema: Any) -> DataSourceReader:
            return WarmUpReader()

    started = time.monotonic()
    spark.dataSource.register(WarmUpSource)
    for _ in range(2):  # as warm_up: the second pass warms what the first one left cold
        spark.read.format(WarmUpSource.name()).load().collect()
    return time.monotonic() - started


def use_dummy_aws_env() -> None:
    """Dummy credentials and region in this process (workers inherit them)."""
    for key, value in common.aws_env().items():
        if key.startswith("AWS_"):
            os.environ[key] = value


def create_stream(ssc: Any, app: str, stream: str, kinesis: str, dynamodb: str,
                  **keywords: Any) -> Any:
    """createStream as a user calls it (TRIM_HORIZON, checkpointInterval 1 s) on the emulators."""
    from kinesis_dstream import InitialPositionInStream, KinesisUtils
    from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY

    keywords.setdefault("metricsLevel", 2)  # MetricsLevel.NONE: no CloudWatch here
    return KinesisUtils.createStream(
        ssc, app, stream, kinesis, DUMMY_REGION, InitialPositionInStream.TRIM_HORIZON, 1,
        awsAccessKeyId=DUMMY_ACCESS_KEY_ID, awsSecretKey=DUMMY_SECRET_ACCESS_KEY,
        dynamoDBEndpoint=dynamodb, **keywords)


def streaming_context(sc: Any) -> Any:
    from pyspark.streaming import StreamingContext

    return StreamingContext(sc, BATCH_INTERVAL_S)


def live_worker_pids() -> list[int]:
    """Pids of the executor processes that read this driver's Kinesis shards (Spark's Python
    workers: the records are read there, not in the driver)."""
    from kinesis_dstream import KinesisUtils

    pids = {pid for shard in KinesisUtils.metrics().values() for pid in shard["read_by_pids"]}
    return sorted(pid for pid in pids if os.path.exists(f"/proc/{pid}"))


def cmdline(pid: int) -> str:
    """A process's command line ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(pid: int, children: dict[int, list[int]]) -> list[int]:
    """Every process below ``pid`` in ``children`` (parent -> child pids)."""
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def peak_rss_mb(pids: list[int]) -> dict[str, Any]:
    """VmHWM of each process (MB) and their sum; read while they live."""
    per = {str(pid): common.process_peak_rss_mb(pid) for pid in pids}
    values = [v for v in per.values() if v is not None]
    return {"per_process_mb": per, "max_mb": max(values) if values else None,
            "total_mb": round(sum(values), 1) if values else None}


class BatchCounter:
    """foreachRDD(rdd.count()) summed on the driver, with the wall time of the first data batch.

    With ``unique=True`` the batch collects each record's index (its first 10 characters)
    instead, so that records delivered twice (a lease moving between workers before its first
    checkpoint) are told apart and the count ends at the last *distinct* record.
    """

    def __init__(self, unique: bool = False) -> None:
        self.lock = threading.Lock()
        self.unique = unique
        self.seen: set[int] = set()
        self.total = 0
        self.batches = 0
        self.first_data_at: float | None = None  # time.time() when the batch's count returned
        self.first_batch_time: float | None = None  # the batch's own (Spark) time, epoch s
        self.done_at: float | None = None
        self.target: int | None = None
        self.done = threading.Event()

    def function(self) -> Callable[[Any, Any], None]:
        """foreachRDD reads ``__code__``: hand it a plain function, not this object."""

        def count_batch(batch_time: Any, rdd: Any) -> None:
            self.add(batch_time, rdd.count())

        def index_batch(batch_time: Any, rdd: Any) -> None:
            ids = rdd.map(lambda line: int(line[:10])).collect()
            self.add(batch_time, len(ids), ids)

        return index_batch if self.unique else count_batch

    @property
    def distinct(self) -> int:
        return len(self.seen) if self.unique else self.total

    def add(self, batch_time: Any, n: int, ids: list[int] | None = None) -> None:
        now = time.time()
        with self.lock:
            self.batches += 1
            if n and self.first_data_at is None:
                self.first_data_at = now
                self.first_batch_time = batch_time.timestamp()
            self.total += n
            if ids:
                self.seen.update(ids)
            if self.target is not None and self.distinct >= self.target and not self.done.is_set():
                self.done_at = now
                self.done.set()


wait_for = common.wait_for  # (its callers here say sc_common.wait_for)


def stop_streaming(ssc: Any, graceful: bool = False) -> float:
    """Stop the StreamingContext (never the SparkContext); returns the seconds it took."""
    started = time.monotonic()
    ssc.stop(stopSparkContext=False, stopGraceFully=graceful)
    return time.monotonic() - started


if __name__ == "__main__":
    # `make bench` runs every bench/*.py; this module is a library, not a benchmark.
    sys.exit(0)
