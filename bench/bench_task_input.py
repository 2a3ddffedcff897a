"""How long a PySpark task waits for its own input, three ways, side by side in one run.

The executor JVM sends a Python worker its task's command, then the partition's data, on a
loopback TCP socket; the second write waits for the worker's acknowledgement of the first,
which Linux delays by about 40 ms (Nagle's algorithm meeting delayed ACKs). Measured on
``local-cluster[2,1,1024]``, 20 jobs of two tasks per variant (the last 10 counted):

* ``tcp``: Spark's defaults;
* ``tcp_quickack``: the task's function first calls
  ``executor_process.acknowledge_input_at_once`` (TCP_QUICKACK on the worker's socket,
  Linux), as our read-ahead tasks do, so the delayed acknowledgement goes out at once; and
  the cached RDD carries ``spark.task.BatchSerializer``, as a batch's values do, so a task
  reading it (an output operation's) acknowledges its input as it loads it;
* ``unix_socket``: ``spark.python.unix.domain.socket.enabled=true`` (Spark 4.1 and later).

Prints, per variant and input size, the median wait from the task function's start to its
first input element and the median job time: for a task reading a parallelized collection
(as our read-ahead's tasks do) and for one reading a cached RDD (as an output operation
reads a batch's values).
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any, Iterator

import spark_common

from kinesis_dstream.spark.task import batch_values

JOBS, COUNTED = 20, 10


def first_input(nudge: bool) -> Any:
    def body(rows: Iterator[Any]) -> Iterator[float]:
        from kinesis_dstream.retrieval.executor_process import acknowledge_input_at_once

        began = time.monotonic()
        if nudge:
            acknowledge_input_at_once()
        first = None
        for _ in rows:
            if first is None:
                first = time.monotonic()
        yield (first if first is not None else began) - began
    return body


def timed(job: Any) -> dict[str, float]:
    waits, jobs = [], []
    for _ in range(JOBS):
        began = time.perf_counter()
        waits += job()
        jobs.append(time.perf_counter() - began)
    return {"first_input_ms": round(statistics.median(waits[-2 * COUNTED:]) * 1000, 1),
            "job_ms": round(statistics.median(jobs[-COUNTED:]) * 1000, 1)}


def variant(name: str, settings: dict[str, str], nudge: bool) -> dict[str, Any]:
    sc = spark_common.spark_context(spark_common.CLUSTER, settings)
    try:
        spark_common.warm_up(sc)
        out: dict[str, Any] = {}
        for size in (10, 20_000):
            data = ["x" * size, "y" * size]
            out[f"{size}_bytes"] = timed(
                lambda data=data: sc.parallelize(data, 2)
                .mapPartitions(first_input(nudge)).collect())
            cached = sc.parallelize(data, 2).map(lambda v: v)
            if nudge:
                cached = batch_values(cached)
            cached.persist()
            cached.count()
            out[f"{size}_bytes_cached"] = timed(
                lambda cached=cached: cached.mapPartitions(first_input(False)).collect())
            cached.unpersist()
        return {name: out}
    finally:
        sc.stop()


def main() -> int:
    result: dict[str, Any] = {"benchmark": "bench_task_input: a Python task's wait for its input",
                              "spark": spark_common.CLUSTER}
    import pyspark

    result["pyspark"] = pyspark.__version__
    result.update(variant("tcp", {}, False))
    result.update(variant("tcp_quickack", {}, True))
    major, minor = (int(p) for p in pyspark.__version__.split(".")[:2])
    if (major, minor) >= (4, 1):
        result.update(variant("unix_socket",
                              {"spark.python.unix.domain.socket.enabled": "true"}, False))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
