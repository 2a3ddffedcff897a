"""Benchmark: a SQL query stopped and started again many times in one SparkSession (issue 37).

``bench_restarts.py [--mode polling|fanout|both|rate|python] [--cycles 50] [--rate 20]
[--shards 2]``. One SparkSession on local-cluster[2,1,1024], the formats registered by
``register(spark)`` as the docs say, kinesis-local behind the fan-out front (bench_fanout's,
in a process of its own, its real 300 s subscriptions), moto for the range table. A producer
puts ``--rate`` records/s through the front for the whole run, each "<index> <words>". Each
cycle starts ``readStream.format("aws-kinesis")`` from the same checkpointLocation (polling,
or ``kinesis.consumerType SubscribeToShard``), waits until the query has read every record
put before the cycle began (and a batch with rows), samples, and stops the query.

Sampled at the end of each cycle (the query running), from /proc: RSS (VmRSS, MB), threads,
open descriptors and listening TCP sockets of the driver's Python process, the driver's JVM,
the Python processes the driver JVM runs (the source's driver side: Spark's streaming source
runner and planning workers), each executor JVM and the Python processes under each executor
(daemon and workers, summed: workers come and go); the names of the threads that grew
(/proc/PID/task/*/comm) go into the JSON, with the range table's items and the
subscriptions open at the front. A table at cycles 1, 10, 20, ... and a verdict per process:
the change from cycle 10 to the last, flat when threads, descriptors and listening sockets
grew by at most ``max(2, 5%)`` and RSS by at most 10% (JVM heaps and Python arenas settle for
a few cycles; a leak of one thread or socket a query shows as +40).

Baselines, the same restarts and foreachBatch without our source: ``--mode rate`` (Spark's
rate source) and ``--mode python`` (a minimal Python data source of Spark's own API), to tell
what Spark itself adds per query from what ours does.

Every record once over all cycles: foreachBatch keeps each batch's record indexes by batch
id (a batch Spark replays after a stop replaces its first attempt, as an idempotent sink
does); after the last cycle the producer stops and a last query reads to the end.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import bench_fanout
import bench_soak
import bench_sql_source
import common
import spark_common as sc_common

TRIGGER = "1 second"
THREADS_FDS_SLACK = (2, 0.05)  # flat: growth <= max(2, 5%)
RSS_SLACK = 0.10
TABLE_CYCLES = 10  # the table's rows: cycle 1, then every 10th


class ByBatch:
    """foreachBatch: each batch's record indexes by batch id (a replayed batch replaces its
    first attempt); 4 bytes a record, so the tally itself hardly grows the driver."""

    def __init__(self, index: str = "cast(substring(cast(data as string), 1, 10) as int)") -> None:
        self.index = f"{index} as i"  # the record's index, as SQL over the batch's columns
        self.lock = threading.Lock()
        self.batches: dict[int, array] = {}
        self.with_rows = 0  # foreachBatch calls that had records

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.selectExpr(self.index).collect()
        indexes = array("I", (row.i for row in rows))
        with self.lock:
            self.batches[batch_id] = indexes
            self.with_rows += bool(indexes)

    def counts(self, sent: int) -> dict[str, int]:
        seen = bytearray(sent)
        records = twice = unknown = 0
        with self.lock:
            batches = list(self.batches.values())
        for indexes in batches:
            for i in indexes:
                records += 1
                if i >= sent:
                    unknown += 1
                elif seen[i]:
                    twice += 1
                else:
                    seen[i] = 1
        return {"sent": sent, "read": records, "distinct": sent - seen.count(0),
                "twice": twice, "unknown": unknown}

    def distinct_below(self, sent: int) -> int:
        return self.counts(sent)["distinct"]


def thread_names(pids: list[int]) -> Counter:
    names: Counter = Counter()
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                names[Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()] += 1
            except OSError:
                continue
    return names


def listening_sockets(pids: list[int]) -> int:
    """TCP sockets in LISTEN held by ``pids`` (servers: the executors' peer servers are
    counted here, one a query until 60 s unused)."""
    held = 0
    for pid in pids:
        try:
            listening = {line.split()[9] for name in ("tcp", "tcp6")
                         for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
                         if line.split()[3] == "0A"}
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed meanwhile
                continue
            held += link.startswith("socket:[") and link[8:-1] in listening
    return held


def processes(driver_jvm: int, app_id: str) -> dict[str, list[int]]:
    """driver_python, driver_jvm, the Python processes the driver JVM runs itself (the
    source's driver-side reader: Spark's Python streaming source runner), and executor N's
    JVM and its Python processes apart."""
    groups = bench_soak.process_groups(driver_jvm, app_id)
    tree = bench_soak._children()
    out = {"driver_python": groups["driver_python"], "driver_jvm": groups["driver_jvm"]}
    under_executors = {p for e in groups["executor_jvm"] for p in sc_common.descendants(e, tree)}
    out["driver_jvm_python"] = [p for p in sc_common.descendants(driver_jvm, tree)
                                if p not in under_executors and p not in groups["executor_jvm"]
                                and "python" in sc_common.cmdline(p)]
    for n, executor in enumerate(sorted(groups["executor_jvm"])):
        out[f"executor{n}_jvm"] = [executor]
        out[f"executor{n}_python"] = [c for c in sc_common.descendants(executor, tree)
                                      if "python" in sc_common.cmdline(c)]
    return out


def sample(cycle: int, driver_jvm: int, app_id: str, source: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"cycle": cycle, **source.figures()}
    for name, pids in processes(driver_jvm, app_id).items():
        row[name] = bench_soak.usage(pids)
        row[name]["thread_names"] = dict(thread_names(pids))
        row[name]["pids"] = pids
        row[name]["listening"] = listening_sockets(pids)
    return row


def flat(before: float, after: float, key: str) -> bool:
    if key == "rss_mb":
        return after - before <= RSS_SLACK * before
    absolute, relative = THREADS_FDS_SLACK
    return after - before <= max(absolute, relative * before)


def verdicts(rows: list[dict[str, Any]], from_cycle: int) -> dict[str, Any]:
    """Per process: its figures at ``from_cycle`` and at the last cycle, the growth, whether
    flat, and the thread names whose count grew."""
    base, last = rows[from_cycle - 1], rows[-1]
    out: dict[str, Any] = {}
    for name in (k for k in last if isinstance(last[k], dict)):
        if name not in base:
            continue
        figures = {key: {"at": base[name][key], "last": last[name][key],
                         "growth": round(last[name][key] - base[name][key], 1),
                         "flat": flat(base[name][key], last[name][key], key)}
                   for key in ("rss_mb", "threads", "fds", "listening")}
        grew = Counter(last[name]["thread_names"]) - Counter(base[name]["thread_names"])
        out[name] = {**figures, "flat": all(f["flat"] for f in figures.values()),
                     "threads_that_grew": dict(grew)}
    return out


def table(rows: list[dict[str, Any]]) -> str:
    names = [k for k in rows[-1] if isinstance(rows[-1][k], dict)]
    shown = [r for r in rows if r["cycle"] == 1 or r["cycle"] % TABLE_CYCLES == 0 or r is rows[-1]]
    lines = ["cycle | " + " | ".join(f"{n} MB/thr/fd" for n in names)]
    for r in shown:
        lines.append(f"{r['cycle']:5d} | " + " | ".join(
            f"{r[n]['rss_mb']:.0f}/{r[n]['threads']}/{r[n]['fds']}" if n in r else "-"
            for n in names))
    return "\n".join(lines)


def spark_session() -> Any:
    """bench_sql_source's session, the formats registered as the docs say (``register``:
    with the listener that deregisters a query's fan-out consumer as it stops)."""
    from pyspark.sql import SparkSession

    from kinesis_dstream.sql.datasource import register

    spark = SparkSession(sc_common.spark_context(sc_common.CLUSTER))
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    register(spark)
    return spark


def start_query(spark: Any, source: str, opts: dict[str, str], checkpoint: str,
                sink: ByBatch) -> Any:
    return (spark.readStream.format(source).options(**opts).load().writeStream
            .foreachBatch(sink).option("checkpointLocation", checkpoint)
            .trigger(processingTime=TRIGGER).start())


def read_up_to(query: Any, sink: ByBatch, target: int, with_rows: int, timeout_s: float,
               what: str) -> None:
    """Until ``query`` has read records (a batch with rows after the ``with_rows``-th) and
    every record below index ``target``; raises naming ``what`` if it fails or times out."""
    if not sc_common.wait_for(lambda: (sink.with_rows > with_rows
                                       and sink.distinct_below(target) >= target)
                              or query.exception() is not None, timeout_s, 0.5):
        raise RuntimeError(f"{what}: read {sink.distinct_below(target)} of {target} records "
                           f"in {timeout_s:.0f} s")
    if query.exception() is not None:
        raise RuntimeError(f"{what}: {query.exception()}")


class RateSource:
    """The baseline: Spark's own rate source, the same foreachBatch and restarts, so what
    grows with Spark alone is told apart from what our source adds. Its values count from 0,
    so "every record once" is every value below the highest seen, once."""

    name, stream = "rate", "Spark's rate source"
    opts: dict[str, str]

    def __init__(self, rate: int) -> None:
        self.opts = {"rowsPerSecond": str(rate), "numPartitions": "2"}
        self.sink = ByBatch("cast(value as int)")

    def start(self) -> None:
        pass

    def target(self) -> int:
        return 1

    def stop(self) -> int:
        with self.sink.lock:
            return 1 + max((max(b) for b in self.sink.batches.values() if b), default=-1)

    def figures(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def counting_source(rate: int) -> type:
    """A minimal Python streaming data source of Spark's own API: ``rate`` values a second
    from 0, read in two partitions. The baseline of what a Python source costs per query in
    Spark itself (its driver-side source runner, its planning workers) beside ours. Local
    classes: pickled by value for the executors, as spark_common.warm_up_sql's."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    started = time.time()

    class CountingReader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
            return {"offset": 0}

        def latestOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
            return {"offset": int((time.time() - started) * rate)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            middle = (start["offset"] + end["offset"]) // 2
            return [InputPartition((start["offset"], middle)),
                    InputPartition((middle, end["offset"]))]

        def read(self, partition: InputPartition) -> Any:
            for value in range(*partition.value):
                yield (value,)

        def commit(self, end: dict[str, int]) -> None:
            pass

    class CountingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench-counting"

        def schema(self) -> str:
            return "value long"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
            return CountingReader()

    return CountingSource


class KinesisSource:
    """format("aws-kinesis") on a stream of its own behind the front, polling or fan-out, a
    producer putting through the front all along."""

    name = "aws-kinesis"

    def __init__(self, mode: str, front: Any, dynamodb: str, args: argparse.Namespace) -> None:
        h = common.helpers()
        self.dynamodb = dynamodb
        self.stream = h.unique_name(f"restarts-{mode}")
        self.table = h.unique_name(f"restarts-{mode}")
        h.create_stream(front.endpoint, self.stream, args.shards)
        extra = {"kinesis.clientRetryIntervalsMs": "100"}
        if mode == "fanout":
            extra.update({"kinesis.consumerType": "SubscribeToShard",
                          "kinesis.consumerName": f"{self.table}-c"})
        self.opts = bench_sql_source.source_options(self.stream, front.endpoint, dynamodb,
                                                    self.table, **extra)
        self.sink = ByBatch()
        self.producer = bench_soak.Producer(front.endpoint, self.stream, args.rate)
        self.front = front

    def figures(self) -> dict[str, Any]:
        """The range table's items and the subscriptions open at the front (neither may
        grow with restarts)."""
        return {"range_items": bench_soak.range_items(self.dynamodb,
                                                      f"{self.table}-kinesis-dstream-ranges"),
                "front_subscriptions_open": self.front.calls()["open"]}

    def start(self) -> None:
        self.producer.start()

    def target(self) -> int:
        """Every record put so far (one at least) is to be read in the cycle."""
        if self.producer.error is not None:
            raise self.producer.error
        return max(1, self.producer.sent)

    def stop(self) -> int:
        self.producer.halt.set()
        self.producer.join(30)
        return self.producer.sent

    def close(self) -> None:
        self.producer.halt.set()
        common.delete_table(self.dynamodb, f"{self.table}-kinesis-dstream-ranges")


def restarts(spark: Any, mode: str, front: Any, dynamodb: str,
             args: argparse.Namespace) -> dict[str, Any]:
    source: RateSource | KinesisSource
    if mode in ("rate", "python"):
        source = RateSource(args.rate)
        if mode == "python":
            spark.dataSource.register(counting_source(args.rate))
            source.name, source.stream = "bench-counting", "a minimal Python data source"
            source.opts = {}
    else:
        source = KinesisSource(mode, front, dynamodb, args)
    sink = source.sink
    checkpoint = tempfile.mkdtemp(prefix="bench-restarts-ckpt-")
    driver_jvm = sc_common.driver_jvm_pid(spark.sparkContext)
    app_id = spark.sparkContext.applicationId
    rows: list[dict[str, Any]] = []
    cycle_s: list[float] = []
    stop_s: list[float] = []  # of each cycle: query.stop() alone
    source.start()
    try:
        for cycle in range(1, args.cycles + 1):
            started, target, with_rows = time.monotonic(), source.target(), sink.with_rows
            query = start_query(spark, source.name, source.opts, checkpoint, sink)
            try:
                read_up_to(query, sink, target, with_rows, args.timeout, f"{mode} cycle {cycle}")
                rows.append(sample(cycle, driver_jvm, app_id, source))
            finally:
                stopping = time.monotonic()
                query.stop()
                stop_s.append(time.monotonic() - stopping)
            cycle_s.append(time.monotonic() - started)
            r = rows[-1]
            common.progress(f"{mode} cycle {cycle:3d} {cycle_s[-1]:5.1f} s | " + " | ".join(
                f"{n} {r[n]['rss_mb']:.0f} MB {r[n]['threads']} thr {r[n]['fds']} fd"
                f" {r[n]['listening']} srv" for n in r if isinstance(r[n], dict))
                + "".join(f" | {k} {v}" for k, v in r.items() if isinstance(v, int) and k != "cycle"))
        sent = source.stop()
        # the last records, then the count
        query = start_query(spark, source.name, source.opts, checkpoint, sink)
        try:
            caught_up = sc_common.wait_for(lambda: sink.distinct_below(sent) >= sent,
                                           args.timeout, 0.5)
        finally:
            query.stop()
    finally:
        source.close()
        shutil.rmtree(checkpoint, ignore_errors=True)
    counts = sink.counts(sent)
    from_cycle = min(10, len(rows))
    return {"mode": mode, "source": source.name,
            "stream": f"{source.stream}, {args.shards} shards" if isinstance(source, KinesisSource)
            else source.stream,
            "rate_rec_s": args.rate, "cycles": args.cycles,
            "cycle_s": common.summary(cycle_s, 1), "stop_s": common.summary(stop_s, 2),
            "table": table(rows).splitlines(),
            "flat_criterion": f"from cycle {from_cycle} to {len(rows)}: threads, fds, listening "
                              f"+max({THREADS_FDS_SLACK[0]}, {THREADS_FDS_SLACK[1]:.0%}), "
                              f"RSS +{RSS_SLACK:.0%}",
            "verdicts": verdicts(rows, from_cycle),
            "other": {k: {"at": rows[from_cycle - 1][k], "last": rows[-1][k],
                          "max": max(r[k] for r in rows)}
                      for k, v in rows[-1].items() if isinstance(v, int) and k != "cycle"},
            "rows": rows,
            "exact": {**counts, "caught_up": caught_up,
                      "every_record_once": caught_up and counts["twice"] == 0
                      and counts["unknown"] == 0 and counts["distinct"] == sent}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("polling", "fanout", "both", "rate", "python"),
                        default="both", help="rate: Spark's own rate source; python: a "
                        "minimal Python data source (baselines: what Spark itself adds)")
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--rate", type=int, default=20, help="records/s, all cycles long")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0, help="per cycle, seconds")
    args = parser.parse_args(argv)
    if args.cycles < 2:
        parser.error("--cycles: at least 2")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    modes = ["polling", "fanout"] if args.mode == "both" else [args.mode]
    sc_common.use_dummy_aws_env()
    load_before = os.getloadavg()
    ok = True
    with common.running_emulators("kinesis-local", "moto") as emu, \
            bench_fanout.FrontProcess(emu["kinesis-local"].endpoint) as front:
        spark = spark_session()
        try:
            common.progress(f"Spark warm-up: {sc_common.warm_up(spark.sparkContext):.1f} s, "
                            f"SQL {sc_common.warm_up_sql(spark):.1f} s")
            for mode in modes:
                result = restarts(spark, mode, front, emu["moto"].endpoint, args)
                result["machine"] = common.machine(load_before)
                result["machine"]["load_avg_during"] = [round(v, 2) for v in os.getloadavg()]
                common.progress("\n".join(result["table"]))
                for name, verdict in result["verdicts"].items():
                    common.progress(
                        f"{name}: " + ", ".join(
                            f"{k} {verdict[k]['at']} -> {verdict[k]['last']}"
                            f" ({verdict[k]['growth']:+})" for k in ("rss_mb", "threads", "fds"))
                        + (" flat" if verdict["flat"] else " GROWS")
                        + (f"; threads that grew {verdict['threads_that_grew']}"
                           if verdict["threads_that_grew"] else ""))
                common.progress(f"{mode}: {result['other']} {result['exact']}")
                common.emit(result)
                ok = ok and result["exact"]["every_record_once"]
                load_before = os.getloadavg()
        finally:
            spark.sparkContext.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
