"""Benchmark: one SQL query over two streams against two queries of one (issue 25), one JSON document.

``bench_sql_multi_stream.py`` runs two variants side by side in one SparkContext on
``local-cluster[2,1,1024]`` (two executor processes of one core each, where the shards are
read), trigger 1 s, ``foreachBatch(df.count())``:

* ``one_query``: ``format("aws-kinesis")`` with ``kinesis.streamName`` ``a,b``;
* ``two_queries``: one query on ``a`` and one on ``b``, running at once.

``a`` and ``b`` are kinesalite streams of ``--shards`` (32) shards each, new for each run.
Once every query of the run has its first batch, a producer process per stream puts
``--rate`` records/s of 100 B onto ``--busy`` (2) of its shards (the rest idle), so both
variants read the same traffic. Rounds alternate the order (one, two, two, one, ...) so that
neither variant alone pays the driver JVM's JIT warm-up. Each query starts at TRIM_HORIZON
(the streams are new: LATEST would pin an AT_TIMESTAMP start, and kinesalite never answers
an AT_TIMESTAMP GetShardIterator) with a fresh checkpoint and range table (moto server).

Measured from ``--settle`` s after every query's first progress, for ``--duration`` s: our
CPU (bench_wide's ``ClusterCpu``: driver Python and JVM, the Python processes under the driver
JVM (each query's source planner), the executors' Python; executor JVMs apart), Spark's
batch durations (``triggerExecution``) as medians, and the CPU per batch: for two queries a
batch is one trigger interval of both queries (each ran one batch), so its cost is the sum of
the two queries' per-batch costs. ``one_over_two`` is one query's cost over that sum: 1 is
"the sum", below 1 the fixed cost per batch paid once instead of twice.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import bench_sql_source
import bench_wide
import common
import spark_common as sc_common

VARIANTS = ("one_query", "two_queries")
PHASES = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets",
          "triggerExecution")


def spark_session(sc: Any) -> Any:
    from pyspark.sql import SparkSession

    from kinesis_dstream.sql.datasource import KinesisDataSource

    spark = SparkSession(sc)
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")
    spark.dataSource.register(KinesisDataSource)
    return spark


# On a loaded machine Spark may give up on a Python process it started (10 s to connect
# back, not configurable): the query then fails before its first batch, and is started again.
SPARK_GAVE_UP = ("CANNOT_OPEN_SOCKET", "failed to connect back")
STARTS = 3


class Query:
    """One streaming query of the variant: its stream list, sink, checkpoint and range table."""

    def __init__(self, spark: Any, stream_names: str, kinesis: str, dynamodb: str) -> None:
        self.spark, self.dynamodb = spark, dynamodb
        self.opts = bench_sql_source.source_options(stream_names, kinesis, dynamodb, "-")
        self.restarts = 0
        self.start()

    def start(self) -> None:
        self.table = common.helpers().unique_name("bench-ms")
        self.checkpoint = tempfile.mkdtemp(prefix="bench-ms-ckpt-")
        self.counter = bench_wide.QueryCounter()
        opts = dict(self.opts, **{"kinesis.dynamodb.tableName": self.table})
        self.query = (self.spark.readStream.format("aws-kinesis").options(**opts).load()
                      .writeStream.foreachBatch(self.counter)
                      .option("checkpointLocation", self.checkpoint)
                      .trigger(processingTime=bench_sql_source.TRIGGER).start())

    def started(self) -> bool:
        """Its first batch is done; a query Spark gave up on before it is started again."""
        if self.query.lastProgress is not None:
            return True
        if self.query.isActive:
            return False
        error = str(self.query.exception())
        if self.restarts + 1 >= STARTS or not any(s in error for s in SPARK_GAVE_UP):
            raise RuntimeError(f"query failed: {error[:2000]}")
        common.progress(f"query failed to start ({error[:120]}...): starting it again")
        self.stop()
        self.restarts += 1
        self.start()
        return False

    def batches_between(self, wall0: float, wall1: float) -> list[dict[str, Any]]:
        """The progress of batches that ended in the window and ran (read or added rows): on
        a loaded machine a batch may outlast the trigger interval."""
        def ended(p: dict[str, Any]) -> float:
            return bench_wide._iso_epoch(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000

        return [p for p in self.query.recentProgress if wall0 <= ended(p) < wall1
                and (p.get("numInputRows") or p["durationMs"].get("addBatch"))]

    def stop(self) -> None:
        self.query.stop()
        shutil.rmtree(self.checkpoint, ignore_errors=True)
        common.delete_table(self.dynamodb, f"{self.table}-kinesis-dstream-ranges")


def run_variant(spark: Any, variant: str, streams: dict[str, list[str]], emu: dict[str, Any],
                args: argparse.Namespace) -> dict[str, Any]:
    """One variant's queries, the producers and the measured window."""
    lists = [",".join(streams)] if variant == "one_query" else list(streams)
    queries: list[Query] = []
    producers: list[bench_wide.Producer] = []
    try:
        for names in lists:
            queries.append(Query(spark, names, emu["kinesalite"].endpoint, emu["moto"].endpoint))
        if not sc_common.wait_for(lambda: all([q.started() for q in queries]), args.timeout,
                                  0.5):
            raise RuntimeError(f"{variant}: no first progress in {args.timeout} s: "
                               f"{[q.query.exception() for q in queries]}")
        cpu = bench_wide.ClusterCpu(spark.sparkContext)
        producers = [bench_wide.Producer(emu["kinesalite"].endpoint, stream, keys, args.rate,
                                         args.settle + args.duration)
                     for stream, keys in streams.items()]
        time.sleep(args.settle)
        cpu0, wall0 = cpu.snapshot(), time.time()
        time.sleep(args.duration)
        cpu1, wall1 = cpu.snapshot(), time.time()
        sent = sum(p.result(args.settle + 60)["sent"] for p in producers)

        def counted() -> int:
            return sum(q.counter.total for q in queries)

        sc_common.wait_for(lambda: counted() >= sent, 60, 0.2)
        ran = [q.batches_between(wall0, wall1) for q in queries]
        every = [[round(p["durationMs"]["triggerExecution"] / 1000.0, 2)
                  for p in q.query.recentProgress] for q in queries]
    finally:
        for producer in producers:
            producer.kill()
        for q in queries:
            q.stop()
    window = wall1 - wall0
    used = bench_wide.ClusterCpu.between(cpu0, cpu1)
    ours = used["driver_python"] + used["driver_jvm"] + used["driver_jvm_python"] + \
        used["executor_python"]
    # A batch of the variant: one trigger interval of every query it runs.
    batches = statistics.mean(len(r) for r in ran) if all(ran) else 0
    return {
        "queries": len(queries), "window_s": round(window, 1),
        "batches_per_query": [len(r) for r in ran],
        "batch_s": [bench_wide.stats([p["durationMs"]["triggerExecution"] / 1000.0 for p in r])
                    for r in ran],
        "batch_phase_ms_median": [{phase: statistics.median(p["durationMs"].get(phase, 0)
                                                            for p in r) for phase in PHASES}
                                  if r else None for r in ran],
        "cpu_s": dict(used, ours_total=round(ours, 2)),
        "cpu_ms_per_batch": round(ours * 1000 / batches, 1) if batches else None,
        "cpu_ms_per_batch_without_jit": round((ours - used["driver_jvm_jit"]) * 1000 / batches, 1)
        if batches else None,
        "cpu_ms_per_s": round(ours * 1000 / window, 1),
        "executor_jvm_cpu_ms_per_batch": round(used["executor_jvm"] * 1000 / batches, 1)
        if batches else None,
        "every_batch_s": every, "restarts": [q.restarts for q in queries],
        "records_put": sent, "records_counted": counted(), "exactly_once": counted() == sent,
    }


def order(rounds: int) -> list[str]:
    """one, two, two, one, one, two, ...: each variant as often first as second."""
    out: list[str] = []
    for r in range(rounds):
        out.extend(VARIANTS if r % 2 == 0 else reversed(VARIANTS))
    return out


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(values), 1) if values else None


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per variant and the ratios one query / two queries."""
    keys = ("cpu_ms_per_batch", "cpu_ms_per_batch_without_jit", "cpu_ms_per_s",
            "executor_jvm_cpu_ms_per_batch")
    medians = {v: {k: median_of(runs[v], k) for k in keys} for v in VARIANTS}
    for v in VARIANTS:
        durations = [s["median"] for r in runs[v] for s in r["batch_s"] if s.get("n")]
        medians[v]["batch_s_median"] = round(statistics.median(durations), 3) if durations else None
        for role in ("driver_python", "driver_jvm", "driver_jvm_jit", "driver_jvm_python",
                     "executor_python", "executor_jvm"):
            values = [r["cpu_s"][role] * 1000 / (sum(r["batches_per_query"]) / r["queries"])
                      for r in runs[v] if sum(r["batches_per_query"])]
            medians[v].setdefault("cpu_ms_per_batch_by_role", {})[role] = \
                round(statistics.median(values), 1) if values else None
    ratios = {}
    for k in ("cpu_ms_per_batch", "cpu_ms_per_batch_without_jit", "cpu_ms_per_s",
              "batch_s_median"):
        one, two = medians["one_query"][k], medians["two_queries"][k]
        ratios[k] = round(one / two, 3) if one and two else None
    return {"median": medians, "one_over_two": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=32, help="shards per stream")
    parser.add_argument("--busy", type=int, default=2, help="busy shards per stream")
    parser.add_argument("--rate", type=int, default=200, help="records/s per stream")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds, each runs both variants (order alternating)")
    parser.add_argument("--duration", type=float, default=45.0, help="measured seconds")
    parser.add_argument("--settle", type=float, default=20.0,
                        help="seconds of producing before the measured window")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds to wait for the queries' first progress")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sc_common.use_dummy_aws_env()
    load_before = os.getloadavg()
    loads = [load_before[0]]
    sc = sc_common.spark_context(sc_common.CLUSTER)
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    try:
        spark = spark_session(sc)
        common.progress(f"Spark warm-up job: {sc_common.warm_up(sc):.2f} s")
        h = common.helpers()
        with common.running_emulators("kinesalite", "moto") as emu:
            kinesis = emu["kinesalite"].endpoint
            common.progress(f"Python data source warm-up: {sc_common.warm_up_sql(spark):.1f} s")
            for i, variant in enumerate(order(args.rounds)):
                common.progress(f"run {i + 1}: {variant}")
                streams: dict[str, list[str]] = {}
                for name in ("a", "b"):
                    stream = h.unique_name(f"bench-ms-{name}")
                    h.create_stream(kinesis, stream, args.shards, timeout=120)
                    streams[stream] = bench_wide.busy_hash_keys(kinesis, stream, args.busy)[1]
                runs[variant].append(run_variant(spark, variant, streams, emu, args))
                loads.append(os.getloadavg()[0])
                common.progress(f"run {i + 1}: {variant}: {json.dumps(runs[variant][-1])}, "
                                f"load {loads[-1]:.1f}")
                for stream in streams:  # clean-up only: the figures are taken
                    try:
                        h.delete_stream(kinesis, stream)
                    except Exception as exc:  # noqa: BLE001
                        common.progress(f"could not delete stream {stream}: {exc}")
    finally:
        sc.stop()
    common.emit({
        "benchmark": "one SQL query over two streams against two queries of one, per-batch CPU",
        "setup": {"streams": f"2 kinesalite streams x {args.shards} shards",
                  "traffic": f"{args.rate} records/s of 100 B per stream onto {args.busy} of its "
                             "shards, the rest idle",
                  "spark": f"{sc_common.CLUSTER}, trigger {bench_sql_source.TRIGGER}, "
                           "aws-kinesis from TRIM_HORIZON of new streams, foreachBatch(df.count())",
                  "one_query": "kinesis.streamName a,b", "two_queries": "a and b, at once",
                  "rounds": args.rounds, "order": order(args.rounds),
                  "settle_s": args.settle, "duration_s": args.duration,
                  "batch": "one trigger interval of every query of the variant",
                  "cpu": "ours: driver Python + driver JVM + the Python under it (the source "
                         "planners) + the executors' Python; executor JVMs apart; "
                         "without_jit: less the driver JVM's JIT compiler threads"},
        **summarise(runs),
        "load_avg_1m_each_run": [round(v, 1) for v in loads],
        "runs": runs,
        "benchmark_wall_s": round(time.monotonic() - started, 1),
        "machine": common.machine(load_before),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
