"""Benchmark: KinesisUtils.createStream into PySpark DStreams (issue 7), one JSON document a sub-benchmark.

``bench_spark.py [start|drain|latency|plan64|all]`` (no argument: all). One SparkContext per
sub-benchmark: ``start`` and ``latency`` on local[2], ``drain`` and ``plan64`` on
local-cluster[2,1,1024] (two executor JVMs in processes of their own: the records are read
there, as on a cluster); ``--master`` puts every sub-benchmark on one master.
1 s batches, a new StreamingContext and a fresh application name (empty lease table) for every
measurement; DynamoDB is the moto server, reached through a counting proxy in its own process
(bench/counting_proxy.py) by the driver and the executors alike.

* ``start`` (a): ``ssc.start()`` to the first batch holding data (the wall time its
  foreachRDD ``rdd.count()`` returned), records already in a 4-shard kinesis-local stream.
  Target <= 2 s; Spark's kinesis-asl receiver: 80.6 s.
* ``drain`` (b, d): records/s into DStream batches draining a 4-shard kinesalite backlog of
  100-byte records, counted with foreachRDD(rdd.count()) summed on the driver, beside
  bench_drain.py's plain boto3 get_records loop (a thread per shard) in the same run, the
  variants alternating each round. ``rec_s`` runs from ``ssc.start()`` to the last record
  counted (lease table, leases and the first read included). Target >= 0.8 of boto3.
  (d): the driver's CPU seconds (its Python process and its JVM) per 100k records, and the
  DynamoDB calls per batch, by table and operation.
* ``latency`` (c): a producer thread puts records stamped with their put wall time at a
  steady rate; foreachRDD collects them and computes now - put time. Target median <= 1.0 s,
  p99 <= 2.0 s; Spark's receiver: 2.48 s / 3.72 s.
* ``plan64`` (e): a 64-shard kinesalite stream with a steady producer; per batch, the driver's
  planning time (the coordinator's plan, and the whole batch function including the
  executors' read-ahead job), and the lease-table and range-table writes per minute.
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import statistics
import sys
import threading
import time
from typing import Any

import common
import counting_proxy
import spark_common as sc_common

REFERENCE = {
    "spark_kinesis_asl_start_to_first_record_s": 80.6,
    "spark_kinesis_asl_drain_rec_s": 4300,
    "spark_kinesis_asl_latency_median_s": 2.48,
    "spark_kinesis_asl_latency_p99_s": 3.72,
    "spark_kinesis_asl_jvm_rss_mb": "448-555",
    "source": "shared/notes/kcl-compat.md (measured earlier on these machines; not in this run)",
}
# Issue 7 ("Executors read the shards").
TARGETS = {"start_s": 2.0, "drain_ratio": 0.8, "latency_median_s": 1.0, "latency_p99_s": 2.0,
           "worker_rss_mb": 150.0}
# (a) names local[2]; (b) local-cluster. (c) names none: local[2] by default, and
# ``--master local-cluster[2,1,1024]`` measures it where every Spark job has two executor
# processes to go through (about 0.3 s a job on 2 cores, twice a batch).
MASTERS = {"start": sc_common.LOCAL, "drain": sc_common.CLUSTER, "latency": sc_common.LOCAL,
           "plan64": sc_common.CLUSTER}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[index]


def put_backlog(kinesis: str, stream: str, total: int) -> dict[str, int]:
    import bench_drain  # the same backlog as the bare engine's drain benchmark

    return bench_drain.load_backlog(kinesis, stream, total)


# -- (a) start ---------------------------------------------------------------------------------
def bench_start(sc: Any, args: argparse.Namespace) -> dict[str, Any]:
    h = common.helpers()
    runs: list[dict[str, Any]] = []
    with common.running_emulators("kinesis-local", "moto") as emu:
        kinesis, dynamodb = emu["kinesis-local"].endpoint, emu["moto"].endpoint
        stream = h.unique_name("bench-spark-start")
        h.create_stream(kinesis, stream, 4)
        h.put_records(kinesis, stream, [f"{i:010d}".ljust(100, "x") for i in range(400)])
        for number in range(args.runs):
            app = h.unique_name("bench-spark-start")
            ssc = sc_common.streaming_context(sc)
            counter = sc_common.BatchCounter()
            sc_common.create_stream(ssc, app, stream, kinesis, dynamodb).foreachRDD(counter.function())
            wall0, mono0 = time.time(), time.monotonic()
            ssc.start()
            start_call = time.monotonic() - mono0
            ok = sc_common.wait_for(lambda counter=counter: counter.first_data_at is not None,
                                    args.timeout)
            run: dict[str, Any] = {"start_call_s": round(start_call, 3)}
            if ok:
                run["first_data_batch_s"] = round(counter.first_data_at - wall0, 3)
                run["first_data_batch_time_after_start_s"] = round(counter.first_batch_time - wall0, 3)
            run["stop_s"] = round(sc_common.stop_streaming(ssc), 3)
            common.delete_table(dynamodb, app)
            common.progress(f"start run {number + 1}: {run}")
            runs.append(run)
        h.delete_stream(kinesis, stream)
    firsts = [r["first_data_batch_s"] for r in runs if "first_data_batch_s" in r]
    median = statistics.median(firsts) if firsts else None
    return {
        "benchmark": "(a) ssc.start() to first batch with data, empty lease table",
        "setup": {"stream": "kinesis-local, 4 shards, 400 records already in", "dynamodb": "moto server",
                  "spark": "local[2], 1 s batches, one SparkContext, new StreamingContext per run",
                  "createStream": "TRIM_HORIZON, checkpointInterval 1 s, defaults otherwise "
                                  "(1 worker, idleTimeBetweenReads 200 ms, failover 10 s)",
                  "measured": "wall time from ssc.start() to the return of the first foreachRDD "
                              "rdd.count() > 0 (first_data_batch_time_after_start_s: that batch's "
                              "Spark time)"},
        "first_data_batch_s": common.summary(firsts),
        "failed_runs": len(runs) - len(firsts),
        "target_s": TARGETS["start_s"],
        "meets_target": median is not None and median <= TARGETS["start_s"] and len(firsts) == len(runs),
        "runs": runs,
        "reference_not_measured_here": {"spark_kinesis_asl_receiver_s": 80.6,
                                        "source": REFERENCE["source"]},
    }


# -- (b) drain ---------------------------------------------------------------------------------
_reader_cpu_seen: dict[int, float] = {}


def _reader_cpu_since_last_round(pids: list[int]) -> float:
    """CPU of the executors' Python workers since the previous drain round read them.

    PySpark reuses its workers, so a worker's own total spans every round; a worker seen for
    the first time brings its start-up (imports, clients) along.
    """
    used = 0.0
    for pid in pids:
        now = common.process_cpu_seconds(pid)
        used += now - _reader_cpu_seen.get(pid, 0.0)
        _reader_cpu_seen[pid] = now
    return used


def drain_spark(sc: Any, kinesis: str, proxy: counting_proxy.CountingProxy, stream: str,
                total: int, timeout_s: float, unique: bool = False,
                **create_kwargs: Any) -> dict[str, Any]:
    h = common.helpers()
    app = h.unique_name("bench-spark-drain")
    ssc = sc_common.streaming_context(sc)
    counter = sc_common.BatchCounter(unique=unique)
    counter.target = total
    sc_common.create_stream(ssc, app, stream, kinesis, proxy.endpoint,
                            **create_kwargs).foreachRDD(counter.function())
    calls0 = proxy.counts()
    cpu = sc_common.DriverCpu(sc)
    wall0 = time.time()
    result: dict[str, Any] = {}
    try:
        ssc.start()
        finished = counter.done.wait(timeout_s)
        driver = cpu.used()
        calls = counting_proxy.calls_between(calls0, proxy.counts())
        pids = sc_common.live_worker_pids()
        result["executor_reader_cpu_s"] = round(_reader_cpu_since_last_round(pids), 2)
        result["driver_cpu_s"] = driver
        result["driver_cpu_s_per_100k"] = round(
            (driver["python_s"] + driver["jvm_s"]) * 100_000 / total, 2)
        result["driver_python_cpu_s_per_100k"] = round(driver["python_s"] * 100_000 / total, 2)
        result["dynamodb"] = dict(calls, batches=counter.batches,
                                  writes_per_batch=round(calls["writes"] / max(1, counter.batches), 2))
        result["worker_peak_rss"] = sc_common.peak_rss_mb(pids)
        if not finished:
            raise RuntimeError(f"spark drain counted {counter.distinct} of {total} records")
        wall = counter.done_at - wall0
        after_first = counter.done_at - counter.first_data_at
        result.update({
            "records": counter.distinct, "records_counted": counter.total,
            "count": "collect of record indices, distinct" if unique else "rdd.count()",
            "wall_s": round(wall, 3), "rec_s": round(total / wall),
            "first_data_batch_s": round(counter.first_data_at - wall0, 3),
            "rec_s_after_first_batch": round(total / after_first) if after_first > 0 else None,
            "batches": counter.batches})
    finally:
        result["stop_s"] = round(sc_common.stop_streaming(ssc), 3)
        common.delete_table(proxy.endpoint, app)
        common.delete_table(proxy.endpoint, f"{app}-kinesis-dstream-ranges")
    return result


def bench_drain(sc: Any, args: argparse.Namespace) -> dict[str, Any]:
    import bench_drain

    h = common.helpers()
    variants: dict[str, dict[str, Any]] = {
        "spark_1_worker": {},  # the name kept for comparisons with earlier runs
    }
    names = ["boto3_loop"] + list(variants)
    with common.running_emulators("kinesalite", "moto") as emu, \
            counting_proxy.CountingProxy(emu["moto"].endpoint) as proxy:
        kinesis = emu["kinesalite"].endpoint
        stream = h.unique_name("bench-spark-drain")
        h.create_stream(kinesis, stream, 4)
        expected = put_backlog(kinesis, stream, args.records)
        total = sum(expected.values())
        rounds = bench_drain.against_boto3(
            kinesis, emu["kinesalite"].pid, stream, expected, args.rounds,
            {name: functools.partial(drain_spark, sc, kinesis, proxy, stream, total,
                                     args.timeout, **settings)
             for name, settings in variants.items()})
        h.delete_stream(kinesis, stream)

    medians = bench_drain.medians(rounds, names, ("rec_s", "rec_s_after_first_batch",
                                                  "first_data_batch_s", "wall_s"))
    ratios = {}
    for name in variants:
        per_round = [r[name]["rec_s"] / r["boto3_loop"]["rec_s"] for r in rounds]
        per_round_after = [r[name]["rec_s_after_first_batch"] / r["boto3_loop"]["rec_s"]
                           for r in rounds if r[name].get("rec_s_after_first_batch")]
        ratios[f"{name}/boto3_loop"] = {
            "from_ssc_start": round(statistics.median(per_round), 3),
            "from_first_data_batch": round(statistics.median(per_round_after), 3)
            if per_round_after else None,
            "per_round_from_ssc_start": [round(v, 3) for v in per_round],
            "meets_target": statistics.median(per_round) >= TARGETS["drain_ratio"]}
    rss = {n: common.summary([r[n]["worker_peak_rss"]["max_mb"] for r in rounds], 1)
           for n in variants}
    duplicates = {n: [r[n]["records_counted"] - r[n]["records"] for r in rounds] for n in variants}
    driver_cost = {n: {
        "driver_cpu_s_per_100k_records": common.summary(
            [r[n]["driver_cpu_s_per_100k"] for r in rounds], 2),
        "driver_python_cpu_s_per_100k_records": common.summary(
            [r[n]["driver_python_cpu_s_per_100k"] for r in rounds], 2),
        "dynamodb_writes_per_batch": common.summary(
            [r[n]["dynamodb"]["writes_per_batch"] for r in rounds], 2)} for n in variants}
    return {
        "benchmark": "(b) backlog drain into DStream batches, records/s; (d) driver CPU and "
                     "DynamoDB writes per batch",
        "setup": {"stream": "kinesalite, 4 shards", "records": total, "record_bytes": 100,
                  "per_shard": expected, "rounds": args.rounds,
                  "dynamodb": "moto server behind bench/counting_proxy.py (its own process)",
                  "spark": f"{MASTERS['drain']}, 1 s batches, foreachRDD(rdd.count()) summed "
                           "on the driver",
                  "driver_cpu": "CPU of the driver's Python process (getrusage) and of its JVM "
                                "(/proc; on local-cluster it also hosts the master and the "
                                "workers, not the executors), ssc.start() to the last record",
                  "createStream": "TRIM_HORIZON, checkpointInterval 1 s, default knobs "
                                  "(pages of 10000, at most 100000 records a shard a batch, "
                                  "no maxRate); tasks on executors read the shards",
                  "boto3_loop": "bench_drain.drain_boto3: one client, a thread per shard, "
                                "get_records Limit 10000",
                  "rec_s": "from ssc.start() (lease table, leases, the first batch's read "
                           "included) to the batch that completed the count"},
        "median": medians,
        "ratio_over_boto3": ratios,
        "target_ratio": TARGETS["drain_ratio"],
        "executor_reader_peak_rss_mb_per_process": {
            **{n: dict(v, meets_target=v["max"] <= TARGETS["worker_rss_mb"]) for n, v in rss.items()},
            "target_mb": TARGETS["worker_rss_mb"]},
        "records_delivered_twice": duplicates,
        "driver_cost": driver_cost,
        "rounds": rounds,
        "reference_not_measured_here": {"spark_kinesis_asl_receiver_rec_s": 4300,
                                        "boto3_loop_rec_s_earlier": 19300,
                                        "source": REFERENCE["source"]},
    }


# -- (c) latency -------------------------------------------------------------------------------
def bench_latency(sc: Any, args: argparse.Namespace) -> dict[str, Any]:
    from kinesis_dstream import KinesisUtils

    h = common.helpers()
    kinesis_kind = args.latency_kinesis
    latencies: list[float] = []
    seen: set[int] = set()
    lock = threading.Lock()

    waits: list[float] = []  # put -> the batch's time: waiting for the batch to begin

    def measure(batch_time: Any, rdd: Any) -> None:
        rows = rdd.collect()
        now = time.time()
        begins = batch_time.timestamp()
        with lock:
            for row in rows:
                stamp, index = row.split(",", 2)[:2]
                index = int(index.rstrip("x"))
                if index not in seen:
                    seen.add(index)
                    latencies.append(now - float(stamp))
                    waits.append(begins - float(stamp))

    result: dict[str, Any] = {"benchmark": "(c) live latency put -> processed in foreachRDD, 1 s batches"}
    with common.running_emulators(kinesis_kind, "moto") as emu:
        kinesis, dynamodb = emu[kinesis_kind].endpoint, emu["moto"].endpoint
        stream = h.unique_name("bench-spark-latency")
        app = h.unique_name("bench-spark-latency")
        h.create_stream(kinesis, stream, 4)
        ssc = sc_common.streaming_context(sc)
        sc_common.create_stream(ssc, app, stream, kinesis, dynamodb).foreachRDD(measure)
        ssc.start()
        try:
            if not sc_common.wait_for(lambda: len([m for m in KinesisUtils.metrics(stream).values()
                                                   if m["owner"]]) == 4, 60):
                raise RuntimeError(f"shards not all leased: {KinesisUtils.metrics(stream)}")
            producer = common.Producer(kinesis, stream, args.rate, args.duration)
            producer.start()
            producer.join()
            if producer.error is not None:
                raise producer.error
            if not sc_common.wait_for(lambda: len(seen) >= producer.sent, 30):
                common.progress(f"latency: only {len(seen)} of {producer.sent} records seen")
            pids = sc_common.live_worker_pids()
            result["worker_peak_rss"] = sc_common.peak_rss_mb(pids)
            result["worker_cpu_s"] = round(sum(common.process_cpu_seconds(p) for p in pids), 2)
        finally:
            stop_s = sc_common.stop_streaming(ssc)
            common.delete_table(dynamodb, app)
            h.delete_stream(kinesis, stream)
    median, p99 = statistics.median(latencies), percentile(latencies, 99)
    puts = producer.put_call_s
    result.update({
        "setup": {"stream": f"{kinesis_kind}, 4 shards", "dynamodb": "moto server",
                  "rate_rec_s": args.rate, "duration_s": args.duration,
                  "producer": "PutRecords every 50 ms, each record stamped with the wall time "
                              "just before its put call",
                  "spark": f"{MASTERS['latency']}, 1 s batches; foreachRDD collect(), now - put "
                           "time per record",
                  "createStream": "TRIM_HORIZON (empty stream, producer starts once the 4 shards "
                                  "are leased), defaults (idleTimeBetweenReads 200 ms)"},
        "records_put": producer.sent, "records_seen": len(seen),
        "latency_s": {"median": round(median, 3), "p90": round(percentile(latencies, 90), 3),
                      "p99": round(p99, 3), "min": round(min(latencies), 3),
                      "max": round(max(latencies), 3), "mean": round(statistics.fmean(latencies), 3)},
        "breakdown_median_s": {
            "put_to_batch_time": round(statistics.median(waits), 3),
            "batch_time_to_processed": round(statistics.median(
                [lat - wait for lat, wait in zip(latencies, waits)]), 3),
            "note": "a record put at second s.x waits until its batch's time; from there the "
                    "batch's read on executors, Spark's scheduling and the output job"},
        "put_call_s": {"median": round(statistics.median(puts), 4), "p99": round(percentile(puts, 99), 4)},
        "targets": {"median_s": TARGETS["latency_median_s"], "p99_s": TARGETS["latency_p99_s"],
                    "worker_rss_mb": TARGETS["worker_rss_mb"]},
        "meets_target": median <= TARGETS["latency_median_s"] and p99 <= TARGETS["latency_p99_s"]
        and len(seen) == producer.sent,
        "stop_s": round(stop_s, 3),
        "worker_peak_rss": result.pop("worker_peak_rss", None),
        "worker_cpu_s": result.pop("worker_cpu_s", None),
        "reference_not_measured_here": {"spark_kinesis_asl_median_s": 2.48,
                                        "spark_kinesis_asl_p99_s": 3.72, "source": REFERENCE["source"]},
    })
    return result


# -- (e) 64 shards ------------------------------------------------------------------------------
class PlanTimer:
    """Times the driver's batch planning from outside the library, per batch with shards.

    ``plan_s``: ShardCoordinator.plan (which shards, from where). ``batch_s``: the planner's
    whole batch function as Spark's JobGenerator calls it (the plan, the ranges, the
    read-ahead job on executors, the report to Spark's input tracker).
    """

    def __init__(self) -> None:
        self.plan_s: list[float] = []
        self.batch_s: list[float] = []
        self.planned_shards: list[int] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> "PlanTimer":
        from kinesis_dstream.spark.coordinator import ShardCoordinator
        from kinesis_dstream.spark.planner import BatchPlanner

        timer = self
        plan, batch_rdd = ShardCoordinator.plan, BatchPlanner.batch_rdd

        def timed_plan(coordinator: Any, member: str, batch_ms: int) -> Any:
            began = time.perf_counter()
            planned = plan(coordinator, member, batch_ms)
            if planned.shards:
                timer.plan_s.append(time.perf_counter() - began)
                timer.planned_shards.append(len(planned.shards))
            return planned

        def timed_batch_rdd(planner: Any, sc: Any, batch_ms: int, values: Any) -> Any:
            began, known = time.perf_counter(), len(timer.plan_s)
            rdd = batch_rdd(planner, sc, batch_ms, values)
            if len(timer.plan_s) > known:  # a batch with shards planned
                timer.batch_s.append(time.perf_counter() - began)
            return rdd

        self._saved = [(ShardCoordinator, "plan", plan), (BatchPlanner, "batch_rdd", batch_rdd)]
        ShardCoordinator.plan, BatchPlanner.batch_rdd = timed_plan, timed_batch_rdd
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)


def bench_plan64(sc: Any, args: argparse.Namespace) -> dict[str, Any]:
    from kinesis_dstream import KinesisUtils

    h = common.helpers()
    shards = args.shards
    result: dict[str, Any] = {"benchmark": f"(e) {shards}-shard stream: driver planning time per "
                                           "batch, lease-table writes per minute"}
    with common.running_emulators("kinesalite", "moto") as emu, \
            counting_proxy.CountingProxy(emu["moto"].endpoint) as proxy:
        kinesis = emu["kinesalite"].endpoint
        stream, app = h.unique_name("bench-spark-plan"), h.unique_name("bench-spark-plan")
        h.create_stream(kinesis, stream, shards)
        ssc = sc_common.streaming_context(sc)
        counter = sc_common.BatchCounter()
        sc_common.create_stream(ssc, app, stream, kinesis, proxy.endpoint).foreachRDD(
            counter.function())
        timer = PlanTimer().__enter__()
        try:
            started = time.monotonic()
            ssc.start()
            if not sc_common.wait_for(lambda: len([m for m in KinesisUtils.metrics(stream).values()
                                                   if m["owner"]]) == shards, 120):
                leased = len([m for m in KinesisUtils.metrics(stream).values() if m["owner"]])
                raise RuntimeError(f"only {leased} of {shards} shards leased in 120 s")
            result["all_shards_leased_after_s"] = round(time.monotonic() - started, 2)
            # Measure from here: every shard leased, steady producing.
            first_batch = len(timer.batch_s)
            calls0, cpu = proxy.counts(), sc_common.DriverCpu(sc)
            counted0, measured0 = counter.total, time.monotonic()
            producer = common.Producer(kinesis, stream, args.plan_rate, args.plan_duration)
            producer.start()
            producer.join()
            if producer.error is not None:
                raise producer.error
            minutes = (time.monotonic() - measured0) / 60.0
            calls1, driver = proxy.counts(), cpu.used()
            sc_common.wait_for(lambda: counter.total - counted0 >= producer.sent, 30)
            batch_s, plan_s = timer.batch_s[first_batch:], timer.plan_s[first_batch:]
        finally:
            timer.__exit__()
            stop_s = sc_common.stop_streaming(ssc)
            common.delete_table(proxy.endpoint, app)
            common.delete_table(proxy.endpoint, f"{app}-kinesis-dstream-ranges")
            h.delete_stream(kinesis, stream)
    batches = len(batch_s)
    lease_writes = counting_proxy.writes_to(calls0, calls1, app)
    range_writes = counting_proxy.writes_to(calls0, calls1, f"{app}-kinesis-dstream-ranges")
    result.update({
        "setup": {"stream": f"kinesalite, {shards} shards", "producer_rec_s": args.plan_rate,
                  "measured_s": args.plan_duration,
                  "dynamodb": "moto server behind bench/counting_proxy.py (its own process)",
                  "spark": f"{MASTERS['plan64']}, 1 s batches, foreachRDD(rdd.count())",
                  "createStream": "TRIM_HORIZON, checkpointInterval 1 s, defaults (failover "
                                  "10 s: leases renewed every 10/3 s)",
                  "measured": "from every shard leased to the producer's end"},
        "batches_measured": batches,
        "shards_planned_per_batch": common.summary(timer.planned_shards[first_batch:], 0),
        "coordinator_plan_ms": common.summary([v * 1000 for v in plan_s], 2),
        "batch_function_s": common.summary(batch_s, 3),
        "batch_function_note": "the whole batch function: plan, ranges, the read-ahead job "
                               f"reading {shards} shards in tasks of shardsPerTask shards, "
                               "the input report; the share over 1 s is what the cluster's "
                               "2 cores cannot read within the batch",
        "records_put": producer.sent, "records_counted": counter.total - counted0,
        "lease_table_writes_per_minute": round(lease_writes / minutes, 1),
        "range_table_writes_per_minute": round(range_writes / minutes, 1),
        "range_table_writes_per_batch": round(range_writes / max(1, batches), 2),
        "dynamodb_calls": counting_proxy.calls_between(calls0, calls1),
        "driver_cpu_s": driver,
        "driver_cpu_s_per_minute": round((driver["python_s"] + driver["jvm_s"]) / minutes, 2),
        "stop_s": round(stop_s, 3),
    })
    return result


BENCHMARKS = {"start": bench_start, "drain": bench_drain, "latency": bench_latency,
              "plan64": bench_plan64}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("which", nargs="*", help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--runs", type=int, default=5, help="start: runs")
    parser.add_argument("--records", type=int, default=400_000,
                        help="drain: backlog records (issue 7: 4 shards x 100k)")
    parser.add_argument("--rounds", type=int, default=5, help="drain: rounds")
    parser.add_argument("--rate", type=int, default=200, help="latency: records/s")
    parser.add_argument("--duration", type=float, default=30.0, help="latency: seconds of producing")
    parser.add_argument("--latency-kinesis", choices=("kinesis-local", "kinesalite"),
                        default="kinesis-local")
    parser.add_argument("--shards", type=int, default=64, help="plan64: shards")
    parser.add_argument("--plan-rate", type=int, default=2000, help="plan64: records/s")
    parser.add_argument("--plan-duration", type=float, default=60.0, help="plan64: seconds")
    parser.add_argument("--master", help="one Spark master for every sub-benchmark "
                                         f"(default: {MASTERS})")
    parser.add_argument("--timeout", type=float, default=120.0, help="per measurement, seconds")
    parser.add_argument("--log-level", default="WARNING",
                        help="kinesis_dstream's log level in the driver (INFO: leases taken, batches "
                             "completed; DEBUG: each batch's read-ahead)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("kinesis_dstream").setLevel(args.log_level.upper())
    unknown = set(args.which) - {*BENCHMARKS, "all"}
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    which = list(BENCHMARKS) if not args.which or "all" in args.which else args.which
    sc_common.use_dummy_aws_env()
    for name in which:
        master = args.master or MASTERS[name]
        sc = sc_common.spark_context(master)  # one at a time: a process holds one SparkContext
        try:
            warm_up_s = sc_common.warm_up(sc)
            common.progress(f"{name}: SparkContext on {master}, warm-up job {warm_up_s:.2f} s")
            load = os.getloadavg()
            started = time.monotonic()
            result = BENCHMARKS[name](sc, args)
            result["benchmark_wall_s"] = round(time.monotonic() - started, 1)
            result["spark_master"] = master
            result["spark_warm_up_job_s"] = round(warm_up_s, 2)  # paid once, before measuring
            result["machine"] = common.machine(load)
            common.emit(result)
        finally:
            sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
