"""Benchmark: a soak (issue 16). Does a long-running DStream job stay flat?

``bench_soak.py [--minutes 60] [--rate 500] [--shards 4]`` runs a word-count-like DStream job
(two output operations: ``count()`` summed on the driver, and a ``reduceByKey`` word count)
on ``local-cluster[2,1,1024]`` with 1 s batches, reading a kinesalite stream that a producer
(a process of its own) feeds at ``--rate`` records/s, leases and ranges on moto server.

Every minute it prints one JSON line: resident memory (MB), threads and open file descriptors
of the driver's Python, the driver's JVM, the executors' JVMs and their Python workers (from
/proc), the minute's median batch processing time and scheduling delay (StreamingListener),
the lag of the newest completed batch behind the clock, the items in the batch-range table,
and records counted against records put so far. At the end: growth of each figure from the
10th minute's sample to the last (target: under 10 %), and whether every record was counted
exactly once.

Not a test: it prints figures.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import threading
import time
from typing import Any

import bench_wide
import common
import spark_common as sc_common

GROWTH_TARGET = 0.10
SETTLED_MINUTE = 10


def _status(pid: int) -> dict[str, float]:
    """RSS (MB) and threads from /proc/<pid>/status, open fds from /proc/<pid>/fd."""
    found = {"rss_mb": 0.0, "threads": 0.0, "fds": 0.0}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    found["rss_mb"] = int(line.split()[1]) / 1024.0
                elif line.startswith("Threads:"):
                    found["threads"] = float(line.split()[1])
        found["fds"] = float(len(os.listdir(f"/proc/{pid}/fd")))
    except OSError:
        pass
    return found


def _roles(jvm: int | None) -> dict[str, list[int]]:
    """The soak's processes by role: the driver's Python and JVM, the executors' JVMs and the
    Python processes under them (PySpark's daemon and workers)."""
    table = bench_wide._processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    roles: dict[str, list[int]] = {"driver_python": [os.getpid()],
                                   "driver_jvm": [jvm] if jvm else [],
                                   "executor_jvm": [], "executor_python": []}
    for pid in children.get(jvm, []) if jvm else []:
        if "CoarseGrainedExecutorBackend" in bench_wide._cmdline(pid):
            roles["executor_jvm"].append(pid)
            todo = list(children.get(pid, []))
            while todo:
                child = todo.pop()
                roles["executor_python"].append(child)
                todo.extend(children.get(child, []))
    return roles


def sample_processes(jvm: int | None) -> dict[str, dict[str, float]]:
    """Each role's RSS, threads and fds, summed over its processes."""
    out = {}
    for role, pids in _roles(jvm).items():
        totals = {"rss_mb": 0.0, "threads": 0.0, "fds": 0.0, "processes": float(len(pids))}
        for pid in pids:
            for key, value in _status(pid).items():
                totals[key] += value
        out[role] = {k: round(v, 1) for k, v in totals.items()}
    return out


def count_items(dynamodb: str, table: str) -> int:
    client = common.helpers().client("dynamodb", dynamodb)
    total, start = 0, None
    while True:
        kwargs: dict[str, Any] = {"TableName": table, "Select": "COUNT"}
        if start:
            kwargs["ExclusiveStartKey"] = start
        page = client.scan(**kwargs)
        total += page["Count"]
        start = page.get("LastEvaluatedKey")
        if not start:
            return total


def _growth(first: float, last: float) -> float | None:
    return round((last - first) / first, 3) if first else None


def soak(args: argparse.Namespace) -> dict[str, Any]:
    from kinesis_dstream import KinesisUtils

    h = common.helpers()
    sc = sc_common.spark_context(sc_common.CLUSTER)
    load = os.getloadavg()
    samples: list[dict[str, Any]] = []
    try:
        with common.running_emulators("kinesalite", "moto") as emu:
            kinesis, dynamodb = emu["kinesalite"].endpoint, emu["moto"].endpoint
            stream, app = h.unique_name("bench-soak"), h.unique_name("bench-soak")
            h.create_stream(kinesis, stream, args.shards)
            _, keys = bench_wide.busy_hash_keys(kinesis, stream, args.shards)
            ssc = sc_common.streaming_context(sc)
            counter = sc_common.BatchCounter()
            listener = bench_wide.BatchListener()
            ssc.addStreamingListener(listener.listener)
            lines = sc_common.create_stream(ssc, app, stream, kinesis, dynamodb)
            lines.foreachRDD(counter.function())
            words: dict[str, int] = {}
            words_lock = threading.Lock()

            def word_count(rdd: Any) -> None:
                pairs = rdd.flatMap(lambda line: line[:10].split()).map(lambda w: (w[-1], 1)) \
                    .reduceByKey(lambda a, b: a + b).collect()
                with words_lock:
                    for word, n in pairs:
                        words[word] = words.get(word, 0) + n

            lines.foreachRDD(word_count)
            ssc.start()
            jvm = sc_common.driver_jvm_pid(sc)
            producer = bench_wide.Producer(kinesis, stream, keys, args.rate, args.minutes * 60.0)
            started = time.time()
            try:
                for minute in range(1, int(args.minutes) + 1):
                    time.sleep(max(0.0, started + minute * 60.0 - time.time()))
                    now = time.time()
                    recent = [b for b in listener.since(now - 60.0)]
                    done = [b for b in listener.batches if b["end_ms"]]
                    newest = max((b["batch_ms"] for b in done), default=None)
                    row = {
                        "minute": minute,
                        "processes": sample_processes(jvm),
                        "batch_processing_median_s": round(statistics.median(
                            [b["processing_ms"] / 1000.0 for b in recent
                             if b["processing_ms"] is not None] or [0.0]), 3),
                        "scheduling_delay_median_s": round(statistics.median(
                            [b["scheduling_ms"] / 1000.0 for b in recent
                             if b["scheduling_ms"] is not None] or [0.0]), 3),
                        "lag_s": round(now - newest / 1000.0, 2) if newest else None,
                        "range_items": count_items(dynamodb, f"{app}-kinesis-dstream-ranges"),
                        "records_counted": counter.total,
                        "leases_held": len([m for m in KinesisUtils.metrics(stream).values()
                                            if m["owner"]]),
                    }
                    samples.append(row)
                    common.progress(json.dumps(row))
                sent = producer.result(120.0)["sent"]
            finally:
                producer.kill()
            def words_counted() -> int:
                with words_lock:
                    return sum(words.values())

            sc_common.wait_for(lambda: counter.total >= sent and words_counted() >= sent,
                               120.0, 0.2)
            counted, word_total = counter.total, words_counted()
            sc_common.stop_streaming(ssc)
            common.delete_table(dynamodb, app)
            common.delete_table(dynamodb, f"{app}-kinesis-dstream-ranges")
    finally:
        sc.stop()
    return summarise(samples, sent, counted, word_total, args, load)


def summarise(samples: list[dict[str, Any]], sent: int, counted: int, word_total: int,
              args: argparse.Namespace, load: tuple[float, float, float]) -> dict[str, Any]:
    settled = next((s for s in samples if s["minute"] == SETTLED_MINUTE), samples[0])
    last = samples[-1]
    growth: dict[str, Any] = {}
    for role, figures in last["processes"].items():
        growth[role] = {key: _growth(settled["processes"][role][key], value)
                        for key, value in figures.items() if key != "processes"}
    flat = all(g is None or g < GROWTH_TARGET for figures in growth.values()
               for g in figures.values())
    times = [s["batch_processing_median_s"] for s in samples]
    return {
        "benchmark": "soak: a DStream job for --minutes at --rate records/s",
        "setup": {"minutes": args.minutes, "rate_rec_s": args.rate, "shards": args.shards,
                  "spark": f"{sc_common.CLUSTER}, 1 s batches, two output operations "
                           "(count, reduceByKey word count)",
                  "emulators": "kinesalite, moto server"},
        "growth_from_minute": settled["minute"],
        "growth_to_minute": last["minute"],
        "growth": growth,
        "flat": flat,
        "target": f"growth under {GROWTH_TARGET:.0%} after minute {SETTLED_MINUTE}",
        "batch_processing_median_s_by_minute": {"min": min(times), "median":
                                                statistics.median(times), "max": max(times)},
        "lag_s_last": last["lag_s"],
        "range_items": {"max": max(s["range_items"] for s in samples),
                        "last": last["range_items"]},
        "first": samples[0], "settled": settled, "last": last,
        "records_put": sent, "records_counted": counted, "words_counted": word_total,
        "exactly_once": counted == sent and word_total == sent,
        "machine": common.machine(load),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=500, help="records/s in all")
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sc_common.use_dummy_aws_env()
    common.emit(soak(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
