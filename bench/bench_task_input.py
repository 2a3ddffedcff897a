"""How long a PySpark task waits for its own input, three ways, side by side in one run.

The executor JVM sends a Python worker its task's command, then the partition's data, on a
loopback TCP socket; the second write waits for the worker's acknowledgement of the first,
which Linux delays by about 40 ms (Nagle's algorithm meeting delayed ACKs). Measured on
``local-cluster[2,1,1024]``, 20 jobs of two tasks per variant (the last 10 counted):

* ``tcp``: Spark's defaults;
* ``tcp_quickack``: the task's function first sets TCP_QUICKACK on its process's TCP sockets
  (Linux), so the delayed acknowledgement goes out at once: what a library's task can do
  for itself on Spark 3.5 and 4.0;
* ``unix_socket``: ``spark.python.unix.domain.socket.enabled=true`` (Spark 4.1 and later).

Prints, per variant and input size, the median wait from the task function's start to its
first input element and the median job time.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import statistics
import sys
import time
from typing import Any, Iterator

import spark_common

JOBS, COUNTED = 20, 10


def quick_ack() -> int:
    """TCP_QUICKACK on every TCP socket of this process; how many (0 off Linux)."""
    option = getattr(socket, "TCP_QUICKACK", None)
    if option is None:
        return 0
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                sock.setsockopt(socket.IPPROTO_TCP, option, 1)
                count += 1
        except OSError:
            pass
        finally:
            sock.close()
    return count


def first_input(nudge: bool) -> Any:
    def body(rows: Iterator[Any]) -> Iterator[float]:
        began = time.monotonic()
        if nudge:
            quick_ack()
        first = None
        for _ in rows:
            if first is None:
                first = time.monotonic()
        yield (first if first is not None else began) - began
    return body


def variant(name: str, settings: dict[str, str], nudge: bool) -> dict[str, Any]:
    sc = spark_common.spark_context(spark_common.CLUSTER, settings)
    try:
        spark_common.warm_up(sc)
        out: dict[str, Any] = {}
        for size in (10, 20_000):
            waits, jobs = [], []
            for _ in range(JOBS):
                began = time.perf_counter()
                waits += sc.parallelize(["x" * size, "y" * size], 2) \
                    .mapPartitions(first_input(nudge)).collect()
                jobs.append(time.perf_counter() - began)
            out[f"{size}_bytes"] = {
                "first_input_ms": round(statistics.median(waits[-2 * COUNTED:]) * 1000, 1),
                "job_ms": round(statistics.median(jobs[-COUNTED:]) * 1000, 1)}
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
