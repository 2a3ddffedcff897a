"""Benchmark: a stream deleted while a job reads it (issue 16: the job fails within 30 s).

``bench_deleted_stream.py [--rounds 3]``: on ``local-cluster[2,1,1024]`` with 1 s batches, a
DStream job and a Structured Streaming query each read a fresh 2-shard kinesalite stream
(leases and ranges on moto server) until their first records arrived; then the stream is
deleted. Reported per round: seconds from ``DeleteStream`` to the job's failure
(``awaitTermination`` raising), and whether the error names ``StreamNotFoundError`` and the
stream. ``tests/test_outages.py`` asserts the behaviour; this prints how long it takes.

Not a test: it prints figures.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import common
import spark_common as sc_common

TARGET_S = 30.0
WAIT_S = 180.0


def _failed(wait: Any) -> tuple[float, str]:
    """Seconds until ``wait()`` raised (or WAIT_S), and the error's text."""
    began = time.monotonic()
    try:
        wait()
    except Exception as exc:  # noqa: BLE001 - py4j's wrapper of Spark's own error
        return time.monotonic() - began, str(exc)
    return time.monotonic() - began, ""


def dstream_round(sc: Any, kinesis: str, dynamodb: str) -> dict[str, Any]:
    h = common.helpers()
    stream, app = h.unique_name("bench-deleted"), h.unique_name("bench-deleted")
    h.create_stream(kinesis, stream, 2)
    h.put_records(kinesis, stream, [(f"k{i}", f"r{i}") for i in range(20)])
    ssc = sc_common.streaming_context(sc)
    counter = sc_common.BatchCounter()
    sc_common.create_stream(ssc, app, stream, kinesis, dynamodb).foreachRDD(counter.function())
    ssc.start()
    try:
        if not sc_common.wait_for(lambda: counter.total >= 20, 120, 0.1):
            raise RuntimeError("no first records in 120 s")
        h.delete_stream(kinesis, stream)
        seconds, error = _failed(lambda: ssc.awaitTerminationOrTimeout(WAIT_S))
    finally:
        sc_common.stop_streaming(ssc)
        common.delete_table(dynamodb, app)
        common.delete_table(dynamodb, f"{app}-kinesis-dstream-ranges")
    return _row(seconds, error, stream)


def sql_round(spark: Any, kinesis: str, dynamodb: str) -> dict[str, Any]:
    import bench_sql_source

    h = common.helpers()
    stream, table = h.unique_name("bench-deleted-sql"), h.unique_name("bench-deleted-sql")
    h.create_stream(kinesis, stream, 2)
    h.put_records(kinesis, stream, [(f"k{i}", f"r{i}") for i in range(20)])
    rows: list[int] = []
    checkpoint = tempfile.mkdtemp(prefix="bench-deleted-ckpt-")
    opts = bench_sql_source.source_options(stream, kinesis, dynamodb, table)
    query = (spark.readStream.format("aws-kinesis").options(**opts).load().writeStream
             .foreachBatch(lambda df, _: rows.append(df.count()))
             .option("checkpointLocation", checkpoint).trigger(processingTime="1 second").start())
    try:
        if not sc_common.wait_for(lambda: sum(rows) >= 20, 120, 0.1):
            raise RuntimeError(f"no first records in 120 s: {query.exception()}")
        h.delete_stream(kinesis, stream)
        seconds, error = _failed(lambda: query.awaitTermination(WAIT_S))
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
        common.delete_table(dynamodb, f"{table}-kinesis-dstream-ranges")
    return _row(seconds, error, stream)


def _row(seconds: float, error: str, stream: str) -> dict[str, Any]:
    return {"failed_after_s": round(seconds, 2) if error else None,
            "names_stream": f"'{stream}'" in error,
            "stream_not_found_error": "StreamNotFoundError" in error}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sc_common.use_dummy_aws_env()
    load = os.getloadavg()
    sc = sc_common.spark_context(sc_common.CLUSTER)
    results: dict[str, list[dict[str, Any]]] = {"dstream": [], "sql": []}
    try:
        from pyspark.sql import SparkSession

        from kinesis_dstream.sql.datasource import KinesisDataSource

        spark = SparkSession(sc)
        spark.dataSource.register(KinesisDataSource)
        with common.running_emulators("kinesalite", "moto") as emu:
            kinesis, dynamodb = emu["kinesalite"].endpoint, emu["moto"].endpoint
            for number in range(args.rounds):
                results["dstream"].append(dstream_round(sc, kinesis, dynamodb))
                results["sql"].append(sql_round(spark, kinesis, dynamodb))
                common.progress(f"round {number + 1}: {results['dstream'][-1]} "
                                f"{results['sql'][-1]}")
    finally:
        sc.stop()

    def median(api: str) -> float | None:
        values = [r["failed_after_s"] for r in results[api] if r["failed_after_s"] is not None]
        return round(statistics.median(values), 2) if len(values) == args.rounds else None

    common.emit({
        "benchmark": "a stream deleted while the job reads it: seconds to the job's failure",
        "setup": {"spark": f"{sc_common.CLUSTER}, 1 s batches / triggers", "rounds": args.rounds,
                  "emulators": "kinesalite (2 shards), moto server"},
        "rounds": results,
        "median_failed_after_s": {api: median(api) for api in results},
        "target_s": TARGET_S,
        "meets_target": all(median(api) is not None and median(api) <= TARGET_S
                            and all(r["names_stream"] and r["stream_not_found_error"]
                                    for r in results[api]) for api in results),
        "machine": common.machine(load),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
