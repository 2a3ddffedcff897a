"""Benchmark: wide streams, mostly idle shards (issue 14), one JSON document a configuration.

``bench_wide.py [dstream] [sql] [64] [128] ...`` runs every API named with every shard count
named (no API: both; no count: 64 and 128). Each configuration gets its own SparkContext on
``local-cluster[2,1,1024]`` (two executor processes of one core each, where the shards are
read), 1 s batches, a fresh kinesalite stream and a fresh lease / range table (moto server).
A counting proxy (bench/counting_proxy.py, its own process) sits in front of kinesalite and
another in front of moto: every Kinesis and DynamoDB call of the driver and the executors is
counted by operation (lease renewals apart). A producer in a process of its own puts
``--rate`` records/s onto ``--busy`` shards (ExplicitHashKey at each shard's first hash key),
straight into kinesalite, so its puts are neither counted nor charged to the driver.

Measured from once every shard is leased (DStream) or the query's first batch ended (SQL),
plus ``--settle`` seconds, for ``--duration`` seconds:

* batch times: DStream: the planner's batch function (the coordinator's plan and the
  read-ahead job in which the executors read every shard) plus Spark's processing delay (the
  output operation), from a StreamingListener; SQL: the query progress' triggerExecution;
* the lag of the newest completed batch's time behind the wall clock at the window's end;
* CPU seconds of our processes (the emulators, proxies and producer excluded): the driver's
  Python, the driver's JVM (which on local-cluster also hosts the master and the workers) and
  its Python children (the SQL source's planning runs in one), the executors' Python workers
  (the pyspark daemon and its workers under each CoarseGrainedExecutorBackend) and, apart,
  the executors' JVMs; per idle shard per batch is the total over idle shards x batches
  (the busy shards' cost included: ``--busy 0`` gives the pure idle cost);
* Kinesis and DynamoDB calls per second by operation;
* records put against records counted (exactly once: equal).

Not a timed test: it prints figures. Issue 14's targets are printed beside them.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common
import counting_proxy
import spark_common as sc_common

TARGETS = {"batch_processing_median_s": 0.5, "lag_s": 2.0, "cpu_ms_per_idle_shard_batch": 3.0}
APIS = ("dstream", "sql")
DEFAULT_SHARDS = (64, 128)
TICK_S = 0.05
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))]


def stats(values: list[float], digits: int = 3) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"median": round(statistics.median(values), digits),
            "p90": round(percentile(values, 90), digits), "max": round(max(values), digits),
            "n": len(values)}


# -- the producer, a process of its own ----------------------------------------------------------
def produce(spec: dict[str, Any]) -> int:
    """``rate`` records/s for ``duration_s``, round robin over ``hash_keys``; prints the count."""
    client = common.helpers().client("kinesis", spec["endpoint"])
    keys, rate, duration = spec["hash_keys"], spec["rate"], spec["duration_s"]
    sent, tick, start = 0, 0, time.monotonic()
    while keys and tick * TICK_S < duration:
        delay = start + tick * TICK_S - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        want = int(round((tick + 1) * TICK_S * rate)) - sent
        entries = [{"PartitionKey": f"pk{sent + i}", "ExplicitHashKey": keys[(sent + i) % len(keys)],
                    "Data": f"{sent + i:010d}".ljust(100, "x").encode()} for i in range(want)]
        if entries:
            reply = client.put_records(StreamName=spec["stream"], Records=entries)
            if reply.get("FailedRecordCount"):
                raise RuntimeError(f"{reply['FailedRecordCount']} puts failed")
            sent += len(entries)
        tick += 1
    print(json.dumps({"sent": sent, "late_s": round(time.monotonic() - start - duration, 2)}),
          flush=True)
    return 0


class Producer:
    def __init__(self, kinesis: str, stream: str, hash_keys: list[str], rate: int,
                 duration_s: float) -> None:
        spec = {"endpoint": kinesis, "stream": stream, "hash_keys": hash_keys, "rate": rate,
                "duration_s": duration_s}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--produce",
                                      json.dumps(spec)], stdout=subprocess.PIPE, text=True,
                                     env=common.aws_env())

    def result(self, timeout_s: float) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=timeout_s)
        if self.proc.returncode:
            raise RuntimeError(f"producer failed (exit {self.proc.returncode})")
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def busy_hash_keys(kinesis: str, stream: str, busy: int) -> tuple[list[str], list[str]]:
    """``busy`` shards spread over the stream, and each one's first hash key."""
    client = common.helpers().client("kinesis", kinesis)
    shards = sorted(client.list_shards(StreamName=stream)["Shards"], key=lambda s: s["ShardId"])
    if len(shards) < busy:
        raise ValueError(f"--busy {busy} exceeds the {len(shards)} shards")
    chosen = [shards[i * len(shards) // busy] for i in range(busy)] if busy else []
    return [s["ShardId"] for s in chosen], [s["HashKeyRange"]["StartingHashKey"] for s in chosen]


# -- CPU of our processes ------------------------------------------------------------------------
def _processes() -> dict[int, tuple[int, float, float]]:
    """pid -> (parent, own CPU s, own + reaped children's CPU s), from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        own = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        reaped = (int(fields[13]) + int(fields[14])) / _CLOCK_TICKS
        table[int(name)] = (int(fields[1]), own, own + reaped)
    return table


def jit_cpu_seconds(pid: int) -> float:
    """CPU of a JVM's JIT compiler threads (C1 / C2 CompilerThread): warm-up, not batches.

    A driver JVM is still compiling minutes after start (each batch runs Spark code paths
    the JIT has not finished with), so a window soon after start carries that cost."""
    total = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii", errors="replace") as handle:
                head, _, tail = handle.read().rpartition(")")
        except OSError:
            continue
        if "CompilerThre" in head:
            fields = tail.split()
            total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return total


class ClusterCpu:
    """CPU seconds by role: driver Python (getrusage), driver JVM, the driver JVM's Python
    children (not under an executor), executor JVMs, executors' Python (daemons, workers)."""

    def __init__(self, sc: Any) -> None:
        self.jvm = sc_common.driver_jvm_pid(sc)

    def snapshot(self) -> dict[str, Any]:
        table = _processes()
        children: dict[int, list[int]] = {}
        for pid, (parent, _, _) in table.items():
            children.setdefault(parent, []).append(pid)

        def below(pid: int) -> list[int]:
            return sc_common.descendants(pid, children)

        roles: dict[str, dict[int, float]] = {"driver_jvm_python": {}, "executor_jvm": {},
                                              "executor_python": {}}
        executor_side: set[int] = set()
        for pid in children.get(self.jvm, []):
            if "CoarseGrainedExecutorBackend" in sc_common.cmdline(pid):
                roles["executor_jvm"][pid] = table[pid][1]
                for p in below(pid):
                    roles["executor_python"][p] = table[p][2]
                    executor_side.add(p)
        for p in below(self.jvm) if self.jvm else []:
            if p not in executor_side and p not in roles["executor_jvm"]:
                roles["driver_jvm_python"][p] = table[p][2]
        return {"driver_python": common.self_cpu_seconds(),
                "driver_jvm": table.get(self.jvm, (0, 0.0, 0.0))[1],
                "driver_jvm_jit": jit_cpu_seconds(self.jvm) if self.jvm else 0.0, **roles}

    @staticmethod
    def between(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
        used = {}
        for role, value in after.items():
            if isinstance(value, dict):
                used[role] = sum(v - before[role].get(pid, 0.0) for pid, v in value.items())
            else:
                used[role] = value - before[role]
        return {role: round(v, 2) for role, v in used.items()}


# -- per-API runs --------------------------------------------------------------------------------
class BatchListener:
    """Spark's BatchInfo of each completed DStream batch (StreamingListener on the driver)."""

    def __init__(self) -> None:
        from pyspark.streaming.listener import StreamingListener

        owner = self

        class Listener(StreamingListener):
            def onBatchCompleted(self, completed: Any) -> None:  # noqa: N802 - PySpark's name
                info = completed.batchInfo()

                def opt(value: Any) -> int | None:  # JavaBatchInfo: -1 for "none"
                    return int(value) if int(value) >= 0 else None

                row = {"batch_ms": int(info.batchTime().milliseconds()),
                       "submitted_ms": int(info.submissionTime()),
                       "started_ms": opt(info.processingStartTime()),
                       "scheduling_ms": opt(info.schedulingDelay()),
                       "processing_ms": opt(info.processingDelay()),
                       "end_ms": opt(info.processingEndTime()),
                       "records": int(info.numRecords()), "at": time.time()}
                with owner.lock:
                    owner.batches.append(row)

        self.lock = threading.Lock()
        self.batches: list[dict[str, Any]] = []
        self.listener = Listener()

    def since(self, wall: float) -> list[dict[str, Any]]:
        with self.lock:
            return [b for b in self.batches if b["batch_ms"] / 1000.0 >= wall]


def run_dstream(sc: Any, emu: dict[str, Any], kproxy: Any, dproxy: Any, stream: str, shards: int,
                busy_keys: list[str], args: argparse.Namespace) -> dict[str, Any]:
    import bench_spark

    from kinesis_dstream import KinesisUtils

    h = common.helpers()
    app = h.unique_name("bench-wide")
    ssc = sc_common.streaming_context(sc)
    counter = sc_common.BatchCounter()
    listener = BatchListener()
    ssc.addStreamingListener(listener.listener)
    sc_common.create_stream(ssc, app, stream, kproxy.endpoint, dproxy.endpoint).foreachRDD(
        counter.function())
    timer = bench_spark.PlanTimer().__enter__()
    result: dict[str, Any] = {}
    try:
        started = time.monotonic()
        ssc.start()

        def leased() -> int:
            return len([m for m in KinesisUtils.metrics(stream).values() if m["owner"]])

        if not sc_common.wait_for(leased, args.timeout, 0.2):
            raise RuntimeError(f"only {leased()} of {shards} shards leased in {args.timeout} s")
        result["all_shards_leased_after_s"] = round(time.monotonic() - started, 1)
        result.update(measure(sc, emu, kproxy, dproxy, stream, busy_keys, args,
                              lambda: counter.total, timer=timer, listener=listener,
                              lease_table=app))
    finally:
        timer.__exit__()
        result["stop_s"] = round(sc_common.stop_streaming(ssc), 2)
        common.delete_table(dproxy.endpoint, app)
        common.delete_table(dproxy.endpoint, f"{app}-kinesis-dstream-ranges")
    return result


class QueryCounter:
    """foreachBatch(df.count()) summed on the driver."""

    def __init__(self) -> None:
        self.total, self.lock = 0, threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        n = df.count()
        with self.lock:
            self.total += n


def run_sql(spark: Any, emu: dict[str, Any], kproxy: Any, dproxy: Any, stream: str, shards: int,
            busy_keys: list[str], args: argparse.Namespace) -> dict[str, Any]:
    import bench_sql_source

    h = common.helpers()
    table = h.unique_name("bench-wide-sql")
    checkpoint = tempfile.mkdtemp(prefix="bench-wide-ckpt-")
    counter = QueryCounter()
    extra = {"kinesis.shardsPerTask": str(args.shards_per_task)} if args.shards_per_task else {}
    opts = bench_sql_source.source_options(stream, kproxy.endpoint, dproxy.endpoint, table, **extra)
    started = time.monotonic()
    query = (spark.readStream.format("aws-kinesis").options(**opts).load().writeStream
             .foreachBatch(counter).option("checkpointLocation", checkpoint)
             .trigger(processingTime="1 second").start())
    result: dict[str, Any] = {}
    try:
        if not sc_common.wait_for(lambda: query.lastProgress is not None, args.timeout, 0.2):
            raise RuntimeError(f"no query progress in {args.timeout} s: {query.exception()}")
        result["first_trigger_after_s"] = round(time.monotonic() - started, 1)
        result.update(measure(spark.sparkContext, emu, kproxy, dproxy, stream, busy_keys, args,
                              lambda: counter.total, query=query))
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
        common.delete_table(dproxy.endpoint, f"{table}-kinesis-dstream-ranges")
    return result


def _iso_epoch(stamp: str) -> float:
    import datetime as dt

    return dt.datetime.strptime(stamp.rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=dt.timezone.utc).timestamp()


def measure(sc: Any, emu: dict[str, Any], kproxy: Any, dproxy: Any, stream: str,
            busy_keys: list[str], args: argparse.Namespace, counted: Any, *, timer: Any = None,
            listener: BatchListener | None = None, query: Any = None,
            lease_table: str | None = None) -> dict[str, Any]:
    """The measured window: producer on, settle, counters and CPU before and after."""
    shards = args.current_shards
    cpu = ClusterCpu(sc)
    put_to = getattr(args, "put_endpoint", None) or emu["kinesalite"].endpoint
    producer = Producer(put_to, stream, busy_keys, args.rate,
                        args.settle + args.duration) if busy_keys else None
    emulator_cpu0 = {k: common.process_cpu_seconds(e.pid) for k, e in emu.items()}
    try:
        time.sleep(args.settle)
        k0, d0, cpu0 = kproxy.counts(), dproxy.counts(), cpu.snapshot()
        wall0, batch_fn0 = time.time(), len(timer.batch_s) if timer else 0
        time.sleep(args.duration)
        k1, d1, cpu1 = kproxy.counts(), dproxy.counts(), cpu.snapshot()
        wall1 = time.time()
        batch_fn = timer.batch_s[batch_fn0:] if timer else []
        # a loaded machine may leave the producer minutes behind its schedule
        grace_s = getattr(args, "producer_grace_s", 60.0)
        sent = producer.result(args.settle + grace_s)["sent"] if producer else 0
    finally:
        if producer is not None:
            producer.kill()
    window = wall1 - wall0
    emulator_cpu = {k: round(common.process_cpu_seconds(e.pid) - emulator_cpu0[k], 1)
                    for k, e in emu.items()}
    sc_common.wait_for(lambda: counted() >= sent, 60, 0.2)
    out: dict[str, Any] = {"window_s": round(window, 1)}
    # batch times and lag
    if listener is not None:
        rows = [b for b in listener.since(wall0) if b["batch_ms"] / 1000.0 < wall1]
        done_by_end = [b for b in listener.batches if b["end_ms"] and b["end_ms"] / 1000.0 <= wall1]
        newest = max((b["batch_ms"] for b in done_by_end), default=None)
        processing = [b["processing_ms"] / 1000.0 for b in rows if b["processing_ms"] is not None]
        batches = round(window / sc_common.BATCH_INTERVAL_S)
        out["batches_in_window"] = batches
        out["batch_s"] = {
            "batch_function": stats(batch_fn),
            "output_processing_delay": stats(processing),
            "scheduling_delay": stats([b["scheduling_ms"] / 1000.0 for b in rows
                                       if b["scheduling_ms"] is not None]),
            "generated_after_batch_time": stats([(b["submitted_ms"] - b["batch_ms"]) / 1000.0
                                                 for b in rows]),
            "done_after_batch_time": stats([(b["end_ms"] - b["batch_ms"]) / 1000.0 for b in rows
                                            if b["end_ms"]]),
        }
        paired = min(len(batch_fn), len(processing))
        processing_total = [f + p for f, p in zip(batch_fn[-paired:], processing[-paired:])] \
            if paired else []
        out["batch_processing_s"] = stats(processing_total)
        out["batch_processing_note"] = ("the batch function (plan + read-ahead job: the shards "
                                        "read on executors) + Spark's processingDelay (the "
                                        "output job); batches completed in the window")
        out["lag_at_end_s"] = round(wall1 - newest / 1000.0, 2) if newest else None
    else:
        progress = [p for p in query.recentProgress if _iso_epoch(p["timestamp"]) >= wall0
                    and _iso_epoch(p["timestamp"]) < wall1]
        ran = [p for p in progress if p.get("numInputRows") or p["durationMs"].get("addBatch")]
        out["batches_in_window"] = len(ran)
        out["triggers_reported_in_window"] = len(progress)
        out["batch_processing_s"] = stats([p["durationMs"]["triggerExecution"] / 1000.0 for p in ran])
        out["batch_processing_note"] = "the query progress' triggerExecution of batches that ran"
        out["batch_phase_ms_median"] = {
            phase: statistics.median(p["durationMs"].get(phase, 0) for p in ran)
            for phase in ("latestOffset", "queryPlanning", "addBatch", "walCommit",
                          "commitOffsets", "triggerExecution")} if ran else None
        ended = [_iso_epoch(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000.0
                 for p in query.recentProgress]
        starts = [_iso_epoch(p["timestamp"]) for p, e in zip(query.recentProgress, ended)
                  if e <= wall1 and (p.get("numInputRows") or p["durationMs"].get("addBatch"))]
        # No batch in the window (nothing to read): nothing lags.
        out["lag_at_end_s"] = round(wall1 - max(starts), 2) if starts and ran else None
        out["lag_note"] = ("wall clock at the window's end minus the start of the newest batch "
                           "completed by then (a processing-time trigger skips missed intervals "
                           "instead of queueing them)")
        batches = out["batches_in_window"] or round(window)
    # CPU
    used = ClusterCpu.between(cpu0, cpu1)
    ours = used["driver_python"] + used["driver_jvm"] + used["driver_jvm_python"] + \
        used["executor_python"]
    idle = shards - len(busy_keys)
    triggers = max(1, batches)  # DStream: every batch interval; SQL: the batches that ran
    out["cpu_s"] = dict(used, ours_total=round(ours, 2),
                        note="ours_total: driver Python + driver JVM + its Python children + "
                             "executors' Python; executor_jvm apart; driver_jvm_jit: the part "
                             "of driver_jvm its JIT compiler threads used (warm-up)")
    out["cpu_ms_per_idle_shard_per_batch"] = round(ours * 1000 / max(1, idle * triggers), 3) \
        if idle else None
    out["cpu_ms_per_shard_per_batch"] = round(ours * 1000 / (shards * triggers), 3)
    out["executor_jvm_cpu_ms_per_shard_per_batch"] = round(
        used["executor_jvm"] * 1000 / (shards * triggers), 3)
    out["emulator_cpu_s"] = emulator_cpu
    # calls
    kinesis = {op: n for (op, _), n in (k1 - k0).items()}
    dynamo = Counter()
    for (op, table), n in (d1 - d0).items():
        kind = "lease" if lease_table and table == lease_table else \
            ("ranges" if table.endswith("-kinesis-dstream-ranges") else (table or "-"))
        dynamo[f"{op} {kind}"] += n
    per_s = {"kinesis": {op: round(n / window, 2) for op, n in sorted(kinesis.items())},
             "dynamodb": {op: round(n / window, 2) for op, n in sorted(dynamo.items())}}
    renewals = sum(n for op, n in dynamo.items() if op.startswith(counting_proxy.RENEWAL))
    per_s["lease_renewals"] = round(renewals / window, 2)
    per_s["dynamodb_excluding_renewals"] = round((sum(dynamo.values()) - renewals) / window, 2)
    per_s["kinesis_total"] = round(sum(kinesis.values()) / window, 2)
    out["calls_per_s"] = per_s
    out["get_records_per_shard_per_batch"] = round(
        kinesis.get("GetRecords", 0) / (shards * triggers), 3)
    out["records_put"] = sent
    out["records_counted"] = counted()
    out["exactly_once"] = counted() == sent
    return out


# -- driver --------------------------------------------------------------------------------------
def run_config(api: str, shards: int, args: argparse.Namespace) -> dict[str, Any]:
    h = common.helpers()
    settings = {}
    if args.shards_per_task and api == "dstream":
        settings["spark.streaming.kinesis.shardsPerTask"] = str(args.shards_per_task)
    load = os.getloadavg()
    sc = sc_common.spark_context(sc_common.CLUSTER, settings)
    try:
        spark = None
        if api == "sql":
            from pyspark.sql import SparkSession

            from kinesis_dstream.sql.datasource import KinesisDataSource

            spark = SparkSession(sc)
            spark.conf.set("spark.sql.shuffle.partitions", "2")
            spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")
            spark.dataSource.register(KinesisDataSource)
        warm_up_s = sc_common.warm_up(sc)
        common.progress(f"{api} {shards}: SparkContext up, warm-up job {warm_up_s:.2f} s")
        args.current_shards = shards
        with common.running_emulators("kinesalite", "moto") as emu, \
                counting_proxy.CountingProxy(emu["kinesalite"].endpoint) as kproxy, \
                counting_proxy.CountingProxy(emu["moto"].endpoint, split_renewals=True) as dproxy:
            stream = h.unique_name("bench-wide")
            h.create_stream(emu["kinesalite"].endpoint, stream, shards)
            busy_ids, busy_keys = busy_hash_keys(emu["kinesalite"].endpoint, stream, args.busy)
            started = time.monotonic()
            if api == "dstream":
                result = run_dstream(sc, emu, kproxy, dproxy, stream, shards, busy_keys, args)
            else:
                result = run_sql(spark, emu, kproxy, dproxy, stream, shards, busy_keys, args)
            wall = time.monotonic() - started
        per_task = args.shards_per_task or 32
        meets = {
            "batch_processing_median": (result["batch_processing_s"].get("median") or 99)
            <= TARGETS["batch_processing_median_s"],
            "lag": result["lag_at_end_s"] is not None and result["lag_at_end_s"] <= TARGETS["lag_s"],
            "cpu_per_idle_shard_batch": (result["cpu_ms_per_idle_shard_per_batch"] or 99)
            <= TARGETS["cpu_ms_per_idle_shard_batch"],
        }
        return {
            "benchmark": f"wide stream, {api}, {shards} shards, {args.busy} busy",
            "setup": {"api": api, "shards": shards, "busy_shards": busy_ids,
                      "rate_rec_s": args.rate, "record_bytes": 100,
                      "shards_per_task": per_task if args.shards_per_task else
                      f"{per_task} (default)",
                      "spark": f"{sc_common.CLUSTER}, 1 s batches"
                               + (", createStream TRIM_HORIZON, foreachRDD(rdd.count())"
                                  if api == "dstream" else
                                  ", readStream aws-kinesis TRIM_HORIZON, trigger 1 s, "
                                  "foreachBatch(df.count())"),
                      "emulators": "kinesalite and moto server, each behind a counting proxy "
                                   "(bench/counting_proxy.py); the producer puts straight into "
                                   "kinesalite from a process of its own",
                      "settle_s": args.settle, "duration_s": args.duration},
            **result,
            "targets": TARGETS, "meets_target": meets,
            "benchmark_wall_s": round(wall, 1), "spark_warm_up_job_s": round(warm_up_s, 2),
            "machine": common.machine(load),
        }
    finally:
        sc.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--produce"]:
        return produce(json.loads(argv[1]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("which", nargs="*", help="dstream, sql and shard counts (default: "
                                                 "dstream sql 64 128)")
    parser.add_argument("--busy", type=int, default=8, help="shards the producer writes to")
    parser.add_argument("--rate", type=int, default=1000, help="records/s in all")
    parser.add_argument("--duration", type=float, default=120.0, help="measured seconds")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds of producing before the measured window")
    parser.add_argument("--shards-per-task", type=int, default=None,
                        help="spark.streaming.kinesis.shardsPerTask / kinesis.shardsPerTask "
                             "(default: the library's, 32)")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds to wait for every shard leased / the first trigger")
    args = parser.parse_args(argv)
    apis = [w for w in args.which if w in APIS] or list(APIS)
    counts = [int(w) for w in args.which if w.isdigit()] or list(DEFAULT_SHARDS)
    unknown = [w for w in args.which if w not in APIS and not w.isdigit()]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sc_common.use_dummy_aws_env()
    for api in apis:
        results = []
        for shards in sorted(counts):
            results.append(run_config(api, shards, args))
            common.emit(results[-1])
        if len(results) > 1:
            common.emit(marginal_cost(api, results))
    return 0


def marginal_cost(api: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """What one more idle shard costs a batch: the CPU a batch of the wider run used beyond
    the narrower one's, over the idle shards it added (the same traffic in both). The
    fixed costs (Spark's per-batch jobs, the driver JVM's warm-up) cancel out; the average
    ``cpu_ms_per_idle_shard_per_batch`` of one run carries them."""
    pairs = []
    for narrow, wide in zip(results, results[1:]):
        def per_batch(r: dict[str, Any], key: str = "ours_total") -> float:
            return r["cpu_s"][key] / max(1, r["batches_in_window"] or 1)

        added = wide["setup"]["shards"] - narrow["setup"]["shards"]
        ours = (per_batch(wide) - per_batch(narrow)) * 1000 / added
        jit = (per_batch(wide, "driver_jvm_jit") - per_batch(narrow, "driver_jvm_jit")) * 1000 / added
        pairs.append({"shards": [narrow["setup"]["shards"], wide["setup"]["shards"]],
                      "cpu_ms_per_added_idle_shard_per_batch": round(ours, 3),
                      "of_it_driver_jvm_jit": round(jit, 3)})
    return {"benchmark": f"bench_wide marginal cost, {api}", "pairs": pairs,
            "target_ms": 3.0,
            "meets_target": all(p["cpu_ms_per_added_idle_shard_per_batch"] <= 3.0 for p in pairs)}


if __name__ == "__main__":
    sys.exit(main())
