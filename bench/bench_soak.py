"""Benchmark: a soak of a DStream word count (issue 16), to show nothing grows with time.

``bench_soak.py [--minutes 60] [--rate 500] [--shards 2] [--fanout]`` on
local-cluster[2,1,1024], 1 s batches, kinesalite (flat put speed for an hour, unlike
kinesis-local) and moto's DynamoDB. With ``--fanout`` (issue 37) the executors read by
enhanced fan-out through the fan-out front (bench_fanout's, in a process of its own, keeping
the consumers itself since kinesalite has none) with its real 300 s subscription lifetime, so
an hour renews every shard's subscription about twelve times; the records are put through
the front, which pushes them at once. The DStream rather than the SQL source: its executors
hold their subscriptions for the whole hour (one long application, nothing restarted), the
renewal code is the one both APIs share, and the word count's exactness check is already
here; restarting SQL queries is bench_restarts.py's part.
A producer thread puts ``--rate`` records/s, each "<index> <words>"; the job counts words
(flatMap, reduceByKey) and collects each record's index, so that a record counted twice or
never is told apart from the count (a preallocated byte per index: the check itself does
not grow the driver).

Every minute a line (stderr) and a row (in the final JSON, stdout) with, from /proc:
RSS (MB), threads and open file descriptors of the driver's Python process, the driver's
JVM, the executor JVMs and their Python workers (summed over each group); the minute's
median batch processing time and its largest scheduling delay (Spark's lag); the items of
the batch-range table; records counted, distinct and sent; with ``--fanout`` the
SubscribeToShard calls so far and the subscriptions open at the front. At the end, per
figure: minute 1, minute ``--warmup-minutes`` (10), the last minute and the largest; the
growth from minute 10 to the last (target under 10%) and the least-squares slope per hour
over those minutes; and whether every record sent was counted exactly once.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common
import spark_common as sc_common

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]
GROWTH_TARGET = 0.10


def line(index: int) -> str:
    """Record ``index``: its index, then 1 to 4 words (what the word count must add up to)."""
    return f"{index:010d} " + " ".join(WORDS[(index + j) % 5] for j in range(1 + index % 4))


def expected_words(sent: int) -> Counter:
    return Counter(w for i in range(sent) for w in line(i).split()[1:])


class Producer(threading.Thread):
    """``rate`` records/s in PutRecords every 0.1 s, until ``halt``; partition keys spread."""

    def __init__(self, kinesis: str, stream: str, rate: int) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.client = common.helpers().client("kinesis", kinesis)
        self.stream, self.rate = stream, rate
        self.sent = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            started = time.monotonic()
            tick = 0
            while not self.halt.is_set():
                tick += 1
                delay = started + tick * 0.1 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                want = int(tick * 0.1 * self.rate) - self.sent
                for at in range(0, want, 500):  # PutRecords takes 500 at most
                    entries = [{"PartitionKey": f"pk{i}", "Data": line(i).encode()}
                               for i in range(self.sent, self.sent + min(500, want - at))]
                    reply = self.client.put_records(StreamName=self.stream, Records=entries)
                    if reply.get("FailedRecordCount"):
                        raise RuntimeError(f"{reply['FailedRecordCount']} puts failed")
                    self.sent += len(entries)
        except BaseException as exc:  # noqa: BLE001 - reported by the benchmark
            self.error = exc


class Tally:
    """What the job counted: words, and each record's index once (a byte per index)."""

    def __init__(self, capacity: int) -> None:
        self.lock = threading.Lock()
        self.words: Counter = Counter()
        self.seen = bytearray(capacity)
        self.records = 0
        self.distinct = 0
        self.twice = 0
        self.out_of_range = 0

    def add_words(self, pairs: list[tuple[str, int]]) -> None:
        with self.lock:
            self.words.update(dict(pairs))

    def add_indexes(self, indexes: list[int]) -> None:
        with self.lock:
            for i in indexes:
                self.records += 1
                if i >= len(self.seen):
                    self.out_of_range += 1
                elif self.seen[i]:
                    self.twice += 1
                else:
                    self.seen[i] = 1
                    self.distinct += 1


def batch_listener(sink: list[tuple[float, int, int]]) -> Any:
    """A StreamingListener appending (completion time, processing ms, scheduling ms)."""
    from pyspark.streaming.listener import StreamingListener

    class Batches(StreamingListener):
        def onBatchCompleted(self, batchCompleted: Any) -> None:  # noqa: N802 - Spark's name
            info = batchCompleted.batchInfo()
            processing, scheduling = info.processingDelay(), info.schedulingDelay()
            sink.append((time.monotonic(), int(processing) if processing is not None else -1,
                         int(scheduling) if scheduling is not None else -1))

    return Batches()


# -- processes, from /proc -----------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            tree.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return tree


def process_groups(driver_jvm: int, app_id: str) -> dict[str, list[int]]:
    """The driver's Python and JVM, this application's executor JVMs (children of the driver
    JVM on local-cluster) and the Python processes under them (daemon and workers)."""
    tree = _children()
    executors = [p for p in sc_common.descendants(driver_jvm, tree)
                 if "CoarseGrainedExecutorBackend" in sc_common.cmdline(p)
                 and app_id in sc_common.cmdline(p)]
    workers = [c for e in executors for c in sc_common.descendants(e, tree)
               if "python" in sc_common.cmdline(c)]
    return {"driver_python": [os.getpid()], "driver_jvm": [driver_jvm],
            "executor_jvm": executors, "executor_python": workers}


def usage(pids: list[int]) -> dict[str, float]:
    """RSS (MB), threads and open descriptors, summed over live ``pids``."""
    rss_kb = threads = fds = 0
    for pid in pids:
        try:
            for text in Path(f"/proc/{pid}/status").read_text().splitlines():
                if text.startswith("VmRSS:"):
                    rss_kb += int(text.split()[1])
                elif text.startswith("Threads:"):
                    threads += int(text.split()[1])
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return {"rss_mb": round(rss_kb / 1024, 1), "threads": threads, "fds": fds,
            "processes": len(pids)}


def range_items(dynamodb: str, table: str) -> int:
    ddb = common.helpers().client("dynamodb", dynamodb)
    pages = ddb.get_paginator("scan").paginate(TableName=table, Select="COUNT",
                                               ConsistentRead=True)
    return sum(page["Count"] for page in pages)


def slope_per_hour(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of (minute, value), per hour; None under two points."""
    if len(points) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return round(60 * sum((x - mean_x) * (y - mean_y) for x, y in points) / spread, 2)


def growth(rows: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Each process figure's change from the row of minute ``warmup`` to the last row."""
    base, last = rows[warmup - 1], rows[-1]
    out: dict[str, Any] = {}
    for group in ("driver_python", "driver_jvm", "executor_jvm", "executor_python"):
        for key in ("rss_mb", "threads", "fds"):
            before, after = base[group][key], last[group][key]
            out[f"{group}.{key}"] = {
                "first": rows[0][group][key], "at_warmup": before, "last": after,
                "max": max(r[group][key] for r in rows),
                "growth": round((after - before) / before, 3) if before else None,
                "slope_per_hour": slope_per_hour([(r["minute"], r[group][key])
                                                  for r in rows[warmup - 1:]])}
    out["range_items"] = {"at_warmup": base["range_items"], "last": last["range_items"],
                          "max": max(r["range_items"] for r in rows)}
    out["within_target"] = all(v["growth"] is None or v["growth"] < GROWTH_TARGET
                               for k, v in out.items() if "." in k)
    return out


def soak(args: argparse.Namespace) -> dict[str, Any]:
    h = common.helpers()
    sc_common.use_dummy_aws_env()
    with common.running_emulators("kinesalite", "moto") as emulators, \
            contextlib.ExitStack() as fronts:
        kinesis, dynamodb = emulators["kinesalite"].endpoint, emulators["moto"].endpoint
        front = None
        if args.fanout:
            import bench_fanout

            front = fronts.enter_context(bench_fanout.FrontProcess(kinesis, True))
            kinesis = front.endpoint  # puts, reads and consumers all through the front
        stream = h.unique_name("soak")
        app = h.unique_name("app-soak")
        h.create_stream(kinesis, stream, args.shards)
        sc = sc_common.spark_context(sc_common.CLUSTER)
        producer = Producer(kinesis, stream, args.rate)
        try:
            sc_common.warm_up(sc)
            tally = Tally(int(args.rate * 60 * (args.minutes + 2)))
            batches: list[tuple[float, int, int]] = []
            ssc = sc_common.streaming_context(sc)
            overrides = {"configOverrides": {"retrieval_mode": "FANOUT"}} if front else {}
            lines = sc_common.create_stream(ssc, app, stream, kinesis, dynamodb, **overrides)
            lines.flatMap(lambda text: text.split(" ")[1:]).map(lambda w: (w, 1)) \
                .reduceByKey(lambda a, b: a + b).foreachRDD(lambda rdd: tally.add_words(rdd.collect()))
            lines.map(lambda text: int(text[:10])) \
                .foreachRDD(lambda rdd: tally.add_indexes(rdd.collect()))
            ssc.addStreamingListener(batch_listener(batches))
            ssc.start()
            producer.start()
            driver_jvm = sc_common.driver_jvm_pid(sc)
            started = time.monotonic()
            rows: list[dict[str, Any]] = []
            for minute in range(1, args.minutes + 1):
                time.sleep(max(0.0, started + minute * 60 - time.monotonic()))
                if producer.error is not None:
                    raise producer.error
                rows.append(sample(minute, started, batches, tally, producer, driver_jvm,
                                   sc.applicationId, dynamodb, f"{app}-kinesis-dstream-ranges",
                                   front))
            producer.halt.set()
            producer.join(30)
            sent = producer.sent
            caught_up = sc_common.wait_for(lambda: tally.distinct >= sent, 120, 0.2)
            time.sleep(3)  # a few more batches: a record counted twice would show by then
            sc_common.stop_streaming(ssc, graceful=True)
        finally:
            producer.halt.set()
            sc.stop()
            common.delete_table(dynamodb, app)
    words_exact = tally.words == expected_words(sent)
    warmup = max(1, min(args.warmup_minutes, len(rows) - 1))
    return {
        "benchmark": "soak", "minutes": args.minutes, "rate": args.rate, "shards": args.shards,
        "read_by": "enhanced fan-out through the front, 300 s subscriptions" if args.fanout
        else "polling",
        "spark_master": sc_common.CLUSTER, "batch_interval_s": sc_common.BATCH_INTERVAL_S,
        "minutes_rows": rows,
        "growth_after_minute": warmup, "growth": growth(rows, warmup),
        "growth_target": GROWTH_TARGET,
        "exact": {"sent": sent, "counted": tally.records, "distinct": tally.distinct,
                  "counted_twice": tally.twice, "unknown": tally.out_of_range,
                  "caught_up": caught_up, "words_exact": words_exact,
                  "every_record_once": caught_up and tally.twice == 0 and words_exact
                  and tally.records == sent},
    }


def sample(minute: int, started: float, batches: list[tuple[float, int, int]], tally: Tally,
           producer: Producer, driver_jvm: int, app_id: str, dynamodb: str,
           ranges_table: str, front: Any = None) -> dict[str, Any]:
    since = started + (minute - 1) * 60
    recent = [(p, s) for at, p, s in list(batches) if at >= since]
    row: dict[str, Any] = {"minute": minute}
    for group, pids in process_groups(driver_jvm, app_id).items():
        row[group] = usage(pids)
    row["batches"] = len(recent)
    row["processing_ms_median"] = statistics.median(p for p, _ in recent) if recent else None
    row["scheduling_ms_max"] = max(s for _, s in recent) if recent else None
    row["scheduling_ms_median"] = statistics.median(s for _, s in recent) if recent else None
    row["range_items"] = range_items(dynamodb, ranges_table)
    if front is not None:
        calls = front.calls()
        row["subscribes"] = sum(n for (operation, _), n in calls["calls"].items()
                                if operation == "SubscribeToShard")
        row["subscriptions_open"] = calls["open"]
    with tally.lock:
        row.update(counted=tally.records, distinct=tally.distinct, sent=producer.sent)
    common.progress(
        f"min {minute:3d} | " + " | ".join(
            f"{g} {row[g]['rss_mb']} MB {row[g]['threads']} thr {row[g]['fds']} fd"
            f" ({row[g]['processes']} p)"
            for g in ("driver_python", "driver_jvm", "executor_jvm", "executor_python"))
        + f" | batch {row['processing_ms_median']} ms median, lag {row['scheduling_ms_median']}"
          f"/{row['scheduling_ms_max']} ms median/max ({row['batches']} batches)"
        + f" | ranges {row['range_items']} | counted {row['counted']} / sent {row['sent']}"
        + (f" | SubscribeToShard {row['subscribes']}, {row['subscriptions_open']} open"
           if front is not None else ""))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--rate", type=int, default=500, help="records/s")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--fanout", action="store_true",
                        help="read by enhanced fan-out through the front (300 s subscriptions)")
    parser.add_argument("--warmup-minutes", type=int, default=10,
                        help="growth is measured from the end of this minute (shorter runs: "
                             "from the middle)")
    args = parser.parse_args(argv)
    if args.minutes < 2:
        parser.error("--minutes: at least 2")
    if args.warmup_minutes >= args.minutes:
        args.warmup_minutes = args.minutes // 2
    load = os.getloadavg()
    result = soak(args)
    result["machine"] = common.machine(load)
    for name, figure in result["growth"].items():
        if "." in name:
            common.progress(f"{name}: minute 1 {figure['first']}, minute {result['growth_after_minute']}"
                            f" {figure['at_warmup']}, last {figure['last']}, max {figure['max']},"
                            f" growth {figure['growth']}, slope {figure['slope_per_hour']}/h")
    common.progress(f"exact: {result['exact']}")
    common.emit(result)
    return 0 if result["exact"]["every_record_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
