"""Benchmark: a SQL query started on a backlog at Kinesis' read limits (issue 25), one JSON.

A 4-shard kinesalite stream holds ``--records`` (80,000) records of 1,000 bytes behind
bench_limits' proxy in limits mode (GetRecords 5 calls/s and 2 MiB/s per shard,
GetShardIterator 5 calls/s per shard, a process of its own), read on ``local[2]``:

* ``sql``: ``readStream.format("aws-kinesis")`` TRIM_HORIZON, 1 s processing-time trigger,
  foreachBatch collecting each record's index, as the README starts it: no registration
  (PySpark's own lookup finds the format), measured from the line that defines the query
  (issue 38); the SparkContext warmed by an RDD job. ``--register ours`` calls
  ``register(spark)`` first and ``--register spark`` ``spark.dataSource.register``, each
  inside the measured time; ``--warm-sql`` warms the SQL workers before the clock starts
  (a cost moved, not removed: for comparison only);
* ``dstream``: ``createStream`` TRIM_HORIZON, 1 s batches, foreachRDD collecting each
  record's index, measured from ``ssc.start()``, after the SQL query in the same run (the
  proxy's byte budgets refilled in between);
* ``python_source``: the floor Spark itself sets for any Python streaming data source: a
  minimal one of Spark's own API (bench_restarts' counting source, no I/O, no import of
  ours), registered with ``spark.dataSource.register`` and started as the SQL query is, same
  trigger and foreachBatch; measured from the line that defines the query to its first
  rows. Spark starts its Python processes for it as for ours (planning, the source runner,
  the reading task's worker), so what ours takes beyond it is ours. Each variant runs in a
  process of its own (its own JVM, its SparkContext warmed by an RDD job), so each meets
  Spark cold, as a new application does (``--one-jvm``: all in one, where the first Spark
  variant pays some 3.5 s of Spark's once-a-JVM start for the others);
* ``kcl_boto3``: bench_limits' KCL-style boto3 reader (a thread a shard, one GetRecords of up
  to 10,000 a second), last: what this machine reads of the same backlog with no Spark at
  all, the ceiling the other two are judged against.

Per variant: the seconds from start to the first rows and to the last, the whole backlog's
share of 2 MiB/s per shard counted from start (``of_limit``), the proxy's refusals, exact
counts. For ``sql`` also batch 0's durations and rows, and the source's read, wait and convert
times and lag as its progress reports them (``latestOffset``, pyspark >= 4.2). Targets: the
SQL source's first rows within 5 s of the query's definition, the backlog at >= 0.85 of
the limit. ``side_by_side`` sets them against the same run's references: ours over Spark's
floor (``python_source``) for first rows, ours over the boto3 reader for the backlog.
``--trace FILE`` has every Python process write its timeline (``spark_trace/``), to find
where a start goes; it costs time, so a traced run gives no figure.

Quote figures with the machine's load: ``python bench/bench_sql_backlog.py``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from typing import Any

import bench_limits
import common
import spark_common as sc_common

TARGETS = {"first_rows_s": 5.0, "of_limit": 0.85}
SHARDS = 4


REGISTRATIONS = {"none": "none: PySpark's lookup (the README)",
                 "spark": "spark.dataSource.register", "ours": "kinesis_dstream register(spark)"}


def sql(sc: Any, kinesis: str, dynamodb: str, stream: str, total: int, timeout_s: float,
        warm: bool, registration: str) -> dict[str, Any]:
    """The SQL query from the line that defines it (a registration before it included) until
    it had every record, and batch 0's progress."""
    from pyspark.sql import SparkSession

    import bench_sql_source

    from kinesis_dstream.sql.datasource import KinesisDataSource, register

    spark = SparkSession(sc)
    if warm:
        common.progress(f"SQL workers warmed: {sc_common.warm_up_sql(spark):.1f} s")
    table = common.helpers().unique_name("bench-sql-backlog")
    checkpoint = tempfile.mkdtemp(prefix="bench-sql-backlog-ckpt-")
    rows = bench_limits.DistinctRows(total)
    started = time.time()
    _mark("defined", started)
    if registration == "spark":  # Spark's own registration: no probe
        spark.dataSource.register(KinesisDataSource)
    elif registration == "ours":  # the optional shortcut: its probe read starts the workers
        register(spark)
    registered_s = time.time() - started
    writer = (spark.readStream.format("aws-kinesis")
              .options(**bench_sql_source.source_options(stream, kinesis, dynamodb, table))
              .load().writeStream.foreachBatch(rows)
              .option("checkpointLocation", checkpoint).trigger(processingTime="1 second"))
    query = writer.start()
    try:
        finished = sc_common.wait_for(lambda: rows.done_at is not None, timeout_s, 0.2)
        sc_common.wait_for(lambda: any(p.get("numInputRows") for p in query.recentProgress),
                           30, 0.2)
        progress = list(query.recentProgress)
    finally:
        bench_limits.stop_query(query, checkpoint, dynamodb, table)
    _mark("first_rows", rows.first)
    result = bench_limits.query_result(query, rows, SHARDS, started, bool(finished), total)
    result["register"] = {"how": REGISTRATIONS[registration], "s": round(registered_s, 2),
                          "inside_the_measured_time": True}
    with_rows = [p for p in progress if p.get("numInputRows")]
    result.update(batches_with_rows=len(with_rows),
                  first_batch=_batch(with_rows[0], started) if with_rows else None,
                  batches=[_batch(p, started) for p in with_rows[1:]])
    return result


def python_source(sc: Any, timeout_s: float) -> dict[str, Any]:
    """Spark's own floor: a minimal Python streaming source's first rows, from the line that
    defines its query (its registration inside the measured time)."""
    from pyspark.sql import SparkSession

    import bench_restarts

    spark = SparkSession(sc)
    checkpoint = tempfile.mkdtemp(prefix="bench-sql-backlog-python-")
    first: list[float] = []

    def batch(df: Any, batch_id: int) -> None:
        if not first and df.count():
            first.append(time.time())

    started = time.time()
    _mark("defined", started)
    source = bench_restarts.counting_source(1000)
    spark.dataSource.register(source)
    query = (spark.readStream.format(source.name()).load().writeStream.foreachBatch(batch)
             .option("checkpointLocation", checkpoint).trigger(processingTime="1 second")
             .start())
    try:
        got = sc_common.wait_for(lambda: bool(first), timeout_s, 0.1)
        sc_common.wait_for(lambda: any(p.get("numInputRows") for p in query.recentProgress),
                           30, 0.2)
        progress = list(query.recentProgress)
    finally:
        query.stop()
    _mark("first_rows", first[0] if first else None)
    with_rows = [p for p in progress if p.get("numInputRows")]
    return {"first_record_s": round(first[0] - started, 2) if got else None,
            "first_batch": _batch(with_rows[0], started) if with_rows else None,
            "what": "a minimal Python streaming data source of Spark's API (no I/O)"}


def _mark(name: str, at: float | None) -> None:
    """A moment of the bench's own in the trace file (``--trace``), if one is written."""
    if at is not None:
        from spark_trace.trace_file import append

        append({"t": at, "pid": os.getpid(), "ev": "mark", "name": name})


def _traced(path: str) -> None:
    """Every Python process started from here on (Spark's included) appends its timeline to
    ``path`` (``spark_trace/sitecustomize.py``; ``spark_trace/timeline.py`` prints it)."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_trace")
    os.environ["KD_TRACE_FILE"] = os.path.abspath(path)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p)


def _batch(progress: dict[str, Any], started: float) -> dict[str, Any]:
    """A batch's rows, when it was triggered (s after ``started``, the query's definition:
    what came before is the query's start), Spark's phases (ms), and what the source
    reported in latestOffset."""
    import datetime as dt

    source = (progress.get("sources") or [{}])[0]
    reported = source.get("latestOffset")
    if isinstance(reported, str):
        import json

        reported = json.loads(reported)
    reported = reported if isinstance(reported, dict) else {}
    triggered = dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
    return {"batch": progress.get("batchId"), "rows": progress.get("numInputRows"),
            "triggered_s": round(triggered.timestamp() - started, 2),
            "duration_ms": {k: v for k, v in (progress.get("durationMs") or {}).items()
                            if k in ("triggerExecution", "latestOffset", "queryPlanning",
                                     "addBatch", "walCommit", "commitOffsets")},
            "source_metrics": {k: v for k, v in reported.items()
                               if k not in ("millisBehindLatest", "stalls")}}


def dstream(sc: Any, kinesis: str, dynamodb: str, stream: str, total: int,
            timeout_s: float) -> dict[str, Any]:
    return bench_limits.dstream(sc, kinesis, dynamodb, stream, total, timeout_s,
                                at_start=lambda: None)  # no proxy window: counted whole


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=80_000,
                        help="backlog records of 1,000 bytes over 4 shards (issue 25: 80,000)")
    parser.add_argument("--only", choices=["sql", "python_source", "dstream", "kcl_boto3"],
                        action="append")
    parser.add_argument("--warm-sql", action="store_true",
                        help="warm the Python workers Spark SQL reads through first")
    parser.add_argument("--register", choices=sorted(REGISTRATIONS), default="none",
                        help="none: the README's code, no call (default); spark: "
                             "spark.dataSource.register; ours: register(spark), whose probe "
                             "starts the SQL workers (inside the measured time either way)")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--trace", metavar="FILE",
                        help="each Python process appends its timeline to FILE (imports, "
                             "worker mains, our reader's and AWS calls; it costs time: not "
                             "for figures); spark_trace/timeline.py prints it")
    parser.add_argument("--one-jvm", action="store_true",
                        help="run every variant in this process's one JVM (the first Spark "
                             "variant then pays Spark's once-a-JVM costs for all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.trace and not os.environ.get("KD_TRACE_FILE"):
        _traced(args.trace)
    wanted = args.only or ["sql", "python_source", "dstream", "kcl_boto3"]
    if len(wanted) > 1 and not args.one_jvm:
        return _each_in_its_own_process(wanted, argv if argv is not None else sys.argv[1:])
    h = common.helpers()
    load = os.getloadavg()
    result: dict[str, Any] = {"benchmark": "bench_sql_backlog", "records": args.records,
                              "record_bytes": bench_limits.RECORD_BYTES, "shards": SHARDS,
                              "master": sc_common.LOCAL, "trigger_s": 1,
                              "limit_mib_s_per_shard": bench_limits.LIMIT_MIB_S,
                              "targets": TARGETS}
    sc_common.use_dummy_aws_env()
    with common.running_emulators("kinesalite", "moto") as emu, \
            bench_limits.LimitsProxy(emu["kinesalite"].endpoint) as proxy:
        kinesis, dynamodb = emu["kinesalite"].endpoint, emu["moto"].endpoint
        stream = h.unique_name("bench-sql-backlog")
        h.create_stream(kinesis, stream, SHARDS)
        result["records_per_shard"] = bench_limits.fill(kinesis, stream, args.records)
        variants: dict[str, Any] = {}
        sc = None
        try:
            for name in wanted:
                if sc is not None:  # each variant meets Spark's Python processes cold
                    sc.stop()
                sc = sc_common.spark_context(sc_common.LOCAL)
                common.progress(f"Spark warm-up job: {sc_common.warm_up(sc):.1f} s")
                time.sleep(5.0)  # the proxy's byte budgets refill (a 10 MB page: 4 s of debt)
                common.progress(name)
                before = proxy.stats()
                if name == "kcl_boto3":  # the machine's own ceiling on this backlog: no Spark
                    variants[name] = bench_limits.kcl_boto3(
                        proxy.endpoint, stream, result["records_per_shard"], args.timeout_s)
                elif name == "python_source":
                    variants[name] = python_source(sc, args.timeout_s)
                elif name == "sql":
                    variants[name] = sql(sc, proxy.endpoint, dynamodb, stream, args.records,
                                         args.timeout_s, args.warm_sql, args.register)
                else:
                    variants[name] = dstream(sc, proxy.endpoint, dynamodb, stream,
                                             args.records, args.timeout_s)
                variants[name]["refusals"] = bench_limits.refusals_between(before, proxy.stats())
        finally:
            if sc is not None:
                sc.stop()
    result["variants"] = variants
    result["side_by_side"] = side_by_side(variants)
    result["machine"] = common.machine(load)
    common.emit(result)
    return 0


def side_by_side(variants: dict[str, Any]) -> dict[str, Any]:
    """The SQL source against the targets and against the same run's references: Spark's
    floor for first rows (``python_source``) and the machine's ceiling for the backlog
    (``kcl_boto3``). A target below its reference is one no source can meet here."""
    out: dict[str, Any] = {}
    sql, floor, reader = (variants.get(k) or {} for k in ("sql", "python_source", "kcl_boto3"))
    first, of_limit = sql.get("first_record_s"), sql.get("of_limit")
    if sql:
        out["meets_targets"] = {"first_rows": (first or 1e9) <= TARGETS["first_rows_s"],
                                "of_limit": (of_limit or 0) >= TARGETS["of_limit"]}
    if first and floor.get("first_record_s"):
        out["first_rows_of_spark_floor"] = round(first / floor["first_record_s"], 3)
        out["spark_floor_meets_first_rows_target"] = \
            floor["first_record_s"] <= TARGETS["first_rows_s"]
    if of_limit and reader.get("of_limit"):
        out["of_limit_of_reader"] = round(of_limit / reader["of_limit"], 3)
        out["reader_meets_of_limit_target"] = reader["of_limit"] >= TARGETS["of_limit"]
    return out


def _each_in_its_own_process(wanted: list[str], argv: list[str]) -> int:
    """Each variant in a process (and JVM) of its own, one after another, as a new
    application meets Spark: the first streaming query of a JVM paid some 3.5 s more than
    the next (Spark's lookup of Python data sources, its classes' first loading), which
    the variant run first was charged for the others. One JSON, the variants side by side."""
    import json
    import subprocess

    rest = [a for i, a in enumerate(argv) if a != "--only"
            and not (i > 0 and argv[i - 1] == "--only")]
    result: dict[str, Any] = {}
    variants: dict[str, Any] = {}
    load = os.getloadavg()
    for name in wanted:
        common.progress(f"{name}: a process of its own")
        out = subprocess.run([sys.executable, __file__, "--only", name, *rest], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        one = json.loads(out)
        variants[name] = one["variants"][name]
        result = {**one, **result}
    result["variants"] = variants
    result["side_by_side"] = side_by_side(variants)
    result["process_per_variant"] = True
    result["machine"] = common.machine(load)
    common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
