"""Benchmark: spark.readStream.format("aws-kinesis") (issue 8, the source), one JSON document.

``bench_sql_source.py [drain|latency|all]`` (no argument: all). One SparkSession on
``local-cluster[2,1,1024]`` (two executor processes of one core each: the tasks read the
shards there), 1 s processing-time trigger, foreachBatch sinks, a fresh range table (moto
server) and checkpoint for every query.

* ``drain``: records/s draining a 4-shard kinesalite backlog (4 x 100,000 records of 100 B by
  default) from TRIM_HORIZON, counted with foreachBatch ``df.count()`` summed on the driver,
  beside bench_drain.py's plain boto3 loop (a thread per shard) in the same run, the variants
  alternating each round. ``sql_arrow``: read() yields Arrow RecordBatches (the default);
  ``sql_tuples``: read() yields tuples (``kinesis.arrowBatches false``). ``rec_s`` runs from
  ``writeStream.start()`` to the batch that completed the count. Target >= 0.8 of boto3.
* ``latency``: a producer thread puts records stamped with their put wall time at a steady
  rate into kinesis-local; foreachBatch collects them and takes now - put time. Target:
  median <= 1.5 s.
"""
from __future__ import annotations

import argparse
import functools
import logging
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import common
import spark_common as sc_common

MASTER = "local-cluster[2,1,1024]"
TRIGGER = "1 second"
TARGETS = {"drain_ratio": 0.8, "latency_median_s": 1.5}


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    from kinesis_dstream.sql.datasource import KinesisDataSource as KinesisSource

    sc = sc_common.spark_context(MASTER)
    spark = SparkSession(sc)
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    spark.dataSource.register(KinesisSource)
    return spark


def source_options(stream: str, kinesis: str, dynamodb: str, table: str, **extra: str) -> dict[str, str]:
    opts = {"kinesis.streamName": stream, "kinesis.endpointUrl": kinesis, "kinesis.region": "us-east-1",
            "kinesis.dynamodb.endpointUrl": dynamodb, "kinesis.dynamodb.tableName": table,
            "kinesis.startingPosition": "TRIM_HORIZON"}
    opts.update(extra)
    return opts


class Counted:
    """foreachBatch(df.count()) summed on the driver; done once ``target`` rows were counted."""

    def __init__(self, target: int) -> None:
        self.target, self.total, self.batches = target, 0, 0
        self.first_data_at: float | None = None
        self.done_at: float | None = None
        self.done = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        n = df.count()
        now = time.time()
        with self.lock:
            self.batches += 1
            self.total += n
            if n and self.first_data_at is None:
                self.first_data_at = now
            if self.total >= self.target and not self.done.is_set():
                self.done_at = now
                self.done.set()


def drain_sql(spark: Any, kinesis: str, dynamodb: str, stream: str, total: int, timeout_s: float,
              arrow: bool) -> dict[str, Any]:
    h = common.helpers()
    table = h.unique_name("bench-sql-drain")
    checkpoint = tempfile.mkdtemp(prefix="bench-sql-ckpt-")
    counter = Counted(total)
    opts = source_options(stream, kinesis, dynamodb, table,
                          **{"kinesis.arrowBatches": "true" if arrow else "false"})
    cpu0 = common.self_cpu_seconds()
    wall0 = time.time()
    query = (spark.readStream.format("aws-kinesis").options(**opts).load().writeStream
             .foreachBatch(counter).option("checkpointLocation", checkpoint)
             .trigger(processingTime=TRIGGER).start())
    result: dict[str, Any] = {}
    try:
        if not counter.done.wait(timeout_s):
            raise RuntimeError(f"SQL drain counted {counter.total} of {total} records")
        wall = counter.done_at - wall0
        result.update({"records": counter.total, "wall_s": round(wall, 3),
                       "rec_s": round(total / wall),
                       "first_data_batch_s": round(counter.first_data_at - wall0, 3),
                       "rec_s_after_first_batch": round(total / (counter.done_at - counter.first_data_at))
                       if counter.done_at > counter.first_data_at else None,
                       "batches": counter.batches,
                       "driver_python_cpu_s": round(common.self_cpu_seconds() - cpu0, 2)})
    finally:
        query.stop()
        # where a batch's time goes (Spark's phases, ms; posted once the batch ended)
        result["batch_duration_ms"] = [p["durationMs"] for p in query.recentProgress
                                       if p.get("numInputRows")]
        shutil.rmtree(checkpoint, ignore_errors=True)
        common.delete_table(dynamodb, f"{table}-kinesis-dstream-ranges")
    return result


def warm_up_query(spark: Any, kinesis: str, dynamodb: str) -> float:
    """One small query first, so no measurement pays the first streaming query's start-up
    (executors' Python workers, imports, the first table in moto); returns its seconds."""
    h = common.helpers()
    stream = h.unique_name("bench-sql-warm-up")
    h.create_stream(kinesis, stream, 4)
    h.put_records(kinesis, stream, [f"{i:010d}".ljust(100, "x") for i in range(400)])
    started = time.monotonic()
    for arrow in (True, False):
        drain_sql(spark, kinesis, dynamodb, stream, 400, 120, arrow)
    h.delete_stream(kinesis, stream)
    return time.monotonic() - started


def bench_drain(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    import bench_drain

    h = common.helpers()
    names = ["boto3_loop", "sql_arrow", "sql_tuples"]
    with common.running_emulators("kinesalite", "moto") as emu:
        kinesis, dynamodb = emu["kinesalite"].endpoint, emu["moto"].endpoint
        common.progress(f"warm-up queries: {warm_up_query(spark, kinesis, dynamodb):.1f} s")
        stream = h.unique_name("bench-sql-drain")
        h.create_stream(kinesis, stream, 4)
        expected = bench_drain.load_backlog(kinesis, stream, args.records)
        total = sum(expected.values())
        rounds = bench_drain.against_boto3(
            kinesis, emu["kinesalite"].pid, stream, expected, args.rounds,
            {name: functools.partial(drain_sql, spark, kinesis, dynamodb, stream, total,
                                     args.timeout, arrow=name == "sql_arrow")
             for name in names[1:]})
        h.delete_stream(kinesis, stream)

    medians = bench_drain.medians(rounds, names, ("rec_s", "rec_s_after_first_batch",
                                                  "first_data_batch_s", "wall_s", "batches"))
    ratios = {}
    for name in names[1:]:
        per_round = [r[name]["rec_s"] / r["boto3_loop"]["rec_s"] for r in rounds]
        ratios[f"{name}/boto3_loop"] = {
            "median": round(statistics.median(per_round), 3),
            "per_round": [round(v, 3) for v in per_round],
            "meets_target": statistics.median(per_round) >= TARGETS["drain_ratio"]}
    arrow_over_tuples = [r["sql_arrow"]["rec_s"] / r["sql_tuples"]["rec_s"] for r in rounds]
    return {
        "benchmark": "backlog drain into Structured Streaming micro-batches, records/s",
        "setup": {"stream": "kinesalite, 4 shards", "records": total, "record_bytes": 100,
                  "per_shard": expected, "dynamodb": "moto server (range table)",
                  "rounds": args.rounds, "spark": f"{MASTER}, trigger {TRIGGER}, "
                  "foreachBatch(df.count()) summed on the driver",
                  "source": "TRIM_HORIZON, maxFetchRecordsPerShard 100000, "
                            "numberOfRecordsPerFetch 10000",
                  "boto3_loop": "bench_drain.drain_boto3: one client, a thread per shard, "
                                "get_records Limit 10000",
                  "rec_s": "from writeStream.start() to the batch that completed the count"},
        "median": medians,
        "ratio_over_boto3": ratios,
        "arrow_over_tuples": {"median": round(statistics.median(arrow_over_tuples), 3),
                              "per_round": [round(v, 3) for v in arrow_over_tuples]},
        "target_ratio": TARGETS["drain_ratio"],
        "rounds": rounds,
    }


def bench_latency(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    import bench_spark

    h = common.helpers()
    latencies: list[float] = []
    seen: set[int] = set()
    lock = threading.Lock()

    def measure(df: Any, batch_id: int) -> None:
        rows = df.select("data").collect()
        now = time.time()
        with lock:
            for row in rows:
                stamp, index = bytes(row.data).decode().split(",", 2)[:2]
                index = int(index.rstrip("x"))
                if index not in seen:
                    seen.add(index)
                    latencies.append(now - float(stamp))

    kind = args.latency_kinesis
    with common.running_emulators(kind, "moto") as emu:
        kinesis, dynamodb = emu[kind].endpoint, emu["moto"].endpoint
        stream = h.unique_name("bench-sql-latency")
        table = h.unique_name("bench-sql-latency")
        h.create_stream(kinesis, stream, 4)
        common.progress(f"warm-up queries: {warm_up_query(spark, kinesis, dynamodb):.1f} s")
        checkpoint = tempfile.mkdtemp(prefix="bench-sql-ckpt-")
        query = (spark.readStream.format("aws-kinesis")
                 .options(**source_options(stream, kinesis, dynamodb, table)).load().writeStream
                 .foreachBatch(measure).option("checkpointLocation", checkpoint)
                 .trigger(processingTime=TRIGGER).start())
        try:
            sc_common.wait_for(lambda: query.lastProgress is not None, 60)  # first trigger done
            producer = common.Producer(kinesis, stream, args.rate, args.duration)
            producer.start()
            producer.join()
            if producer.error is not None:
                raise producer.error
            if not sc_common.wait_for(lambda: len(seen) >= producer.sent, 30):
                common.progress(f"latency: only {len(seen)} of {producer.sent} records seen")
            progress = query.lastProgress
            durations = [p["durationMs"] for p in query.recentProgress if p.get("numInputRows")]
        finally:
            query.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
            common.delete_table(dynamodb, f"{table}-kinesis-dstream-ranges")
            h.delete_stream(kinesis, stream)
    median = statistics.median(latencies)
    pct = bench_spark.percentile
    return {
        "benchmark": "live latency put -> foreachBatch, trigger 1 s",
        "setup": {"stream": f"{kind}, 4 shards", "dynamodb": "moto server", "rate_rec_s": args.rate,
                  "duration_s": args.duration, "spark": f"{MASTER}, trigger {TRIGGER}",
                  "producer": "common.Producer: PutRecords every 50 ms, records stamped "
                              "with the wall time just before the put"},
        "records_put": producer.sent, "records_seen": len(seen),
        "latency_s": {"median": round(median, 3), "p90": round(pct(latencies, 90), 3),
                      "p99": round(pct(latencies, 99), 3), "min": round(min(latencies), 3),
                      "max": round(max(latencies), 3)},
        "target_median_s": TARGETS["latency_median_s"],
        "meets_target": median <= TARGETS["latency_median_s"] and len(seen) == producer.sent,
        "batch_duration_ms_median": {
            phase: statistics.median(d.get(phase, 0) for d in durations)
            for phase in ("triggerExecution", "latestOffset", "addBatch", "walCommit",
                          "commitOffsets")} if durations else None,
        "last_progress_source": (progress or {}).get("sources", [{}])[0] if progress else None,
    }


BENCHMARKS = {"drain": bench_drain, "latency": bench_latency}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("which", nargs="*", default="all", choices=[*BENCHMARKS, "all"])
    parser.add_argument("--records", type=int, default=400_000,
                        help="drain: backlog records (issue 8: 4 shards x 100k)")
    parser.add_argument("--rounds", type=int, default=3, help="drain: rounds")
    parser.add_argument("--rate", type=int, default=200, help="latency: records/s")
    parser.add_argument("--duration", type=float, default=30.0, help="latency: seconds of producing")
    parser.add_argument("--latency-kinesis", choices=("kinesis-local", "kinesalite"),
                        default="kinesis-local")
    parser.add_argument("--timeout", type=float, default=300.0, help="per measurement, seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    which = list(BENCHMARKS) if "all" in args.which else args.which
    sc_common.use_dummy_aws_env()
    load_before = tuple(__import__("os").getloadavg())
    spark = spark_session()
    warm_up_s = sc_common.warm_up(spark.sparkContext)
    common.progress(f"Spark warm-up job: {warm_up_s:.2f} s")
    try:
        for name in which:
            started = time.monotonic()
            result = BENCHMARKS[name](spark, args)
            result["benchmark_wall_s"] = round(time.monotonic() - started, 1)
            result["machine"] = common.machine(load_before)
            common.emit(result)
    finally:
        spark.sparkContext.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
