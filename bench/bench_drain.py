"""Benchmark: backlog drain records/s from a 4-shard kinesalite stream (issue 2, target >= 0.8 of boto3).

A backlog of 100-byte records (default 100,000, put with PutRecords batches of 500) is read
from TRIM_HORIZON to the end, several rounds, the variants alternating within each round:

* ``boto3_loop``: a plain boto3 get_records loop, one thread per shard (what a user would write);
* ``ours_in_process``: ``Scheduler`` in this process with a counting processor that
  checkpoints every batch; a fresh application name (empty lease table) every round;
* ``ours_worker_process``: the same processor in ``python -m kinesis_dstream worker``.

``rec_s`` counts from the consumer's start (client creation, lease table, leases, iterators;
for the worker process also interpreter start) to the last record, so start-up is paid in
full; ``first_batch_after_s`` says how much of it passed before the first batch (kinesalite
takes seconds to serve the first 10,000-record pages of four shards at once). CPU seconds are the
consumer's own (this process via getrusage, a worker via /proc) and each emulator's.
``--profile`` adds a cProfile of one in-process drain (top functions by own time) to stderr.

Prints one JSON document.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import common

TARGET_RATIO = 0.8
# Not measured here: ../shared/notes/emulators.md and kcl-compat.md (same machines, 100k x 100 B,
# 4 shards, kinesalite unless said).
REFERENCE = {
    "spark_kinesis_asl_receiver_rec_s": 4300,
    "java_multilang_tuned_rec_s": 10000,
    "boto3_loop_thread_per_shard_rec_s": 19300,
    "async_kinesis_3_0_1_rec_s": 11500,
    "kinesis_python_0_2_1_rec_s": 14100,
    "source": "shared/notes/emulators.md, kcl-compat.md (measured earlier on these machines)",
}


class Drain:
    """One drain's measurements; times are monotonic or wall clock, never mixed."""

    def __init__(self, total: int):
        self.total = total
        self.count = 0
        self.start = 0.0
        self.first = 0.0
        self.end = 0.0
        self.cpu_s = 0.0
        self.peak_rss_mb: float | None = None
        self.emulator_cpu_s: dict[str, float] = {}

    def as_dict(self) -> dict[str, Any]:
        wall = self.end - self.start
        out = {"records": self.count, "wall_s": round(wall, 3),
               "rec_s": round(self.count / wall) if wall > 0 else None,
               "first_batch_after_s": round(self.first - self.start, 3),
               "cpu_s": round(self.cpu_s, 2),
               "emulator_cpu_s": {k: round(v, 2) for k, v in self.emulator_cpu_s.items()}}
        if self.peak_rss_mb is not None:
            out["peak_rss_mb"] = self.peak_rss_mb
        return out


def drain_boto3(kinesis_endpoint: str, stream: str, expected: dict[str, int], **_: Any) -> Drain:
    h = common.helpers()
    drain = Drain(sum(expected.values()))
    lock = threading.Lock()
    cpu0 = common.self_cpu_seconds()
    drain.start = time.monotonic()
    kinesis = h.client("kinesis", kinesis_endpoint)
    shard_ids = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]

    def read(shard_id: str) -> None:
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id,
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        seen = 0
        while iterator and seen < expected.get(shard_id, 0):
            page = kinesis.get_records(ShardIterator=iterator, Limit=10000)
            records = page["Records"]
            if records:
                seen += len(records)
                with lock:
                    drain.count += len(records)
                    if not drain.first:
                        drain.first = time.monotonic()
            else:
                time.sleep(0.2)
            iterator = page.get("NextShardIterator")

    threads = [threading.Thread(target=read, args=(s,), daemon=True) for s in shard_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    drain.end = time.monotonic()
    drain.cpu_s = common.self_cpu_seconds() - cpu0
    return drain


class _Counting(common.RecordProcessor):
    def __init__(self, drain: Drain, lock: threading.Lock, done: threading.Event):
        self.drain, self.lock, self.done = drain, lock, done

    def process_records(self, process_records_input: Any) -> None:
        records = process_records_input.records
        if not records:
            return
        with self.lock:
            if not self.drain.first:
                self.drain.first = time.monotonic()
            self.drain.count += len(records)
            if self.drain.count >= self.drain.total and not self.done.is_set():
                self.drain.end = time.monotonic()
                self.done.set()
        process_records_input.checkpointer.checkpoint()


def drain_in_process(kinesis_endpoint: str, stream: str, expected: dict[str, int], *,
                     dynamodb_endpoint: str, timeout_s: float, **_: Any) -> Drain:
    from kinesis_dstream.worker.scheduler import Scheduler

    app = common.helpers().unique_name("bench-drain-inproc")
    config = common.consumer_config(app, stream, kinesis_endpoint, dynamodb_endpoint)
    drain = Drain(sum(expected.values()))
    lock, done = threading.Lock(), threading.Event()
    cpu0 = common.self_cpu_seconds()
    drain.start = time.monotonic()
    scheduler = Scheduler(config, lambda shard_id: _Counting(drain, lock, done))
    try:
        scheduler.start()
        if not done.wait(timeout_s):
            raise TimeoutError(f"in-process drain got {drain.count} of {drain.total} records")
        drain.cpu_s = common.self_cpu_seconds() - cpu0
    finally:
        scheduler.shutdown(timeout_s=5)
        common.delete_table(dynamodb_endpoint, app)
    return drain


def drain_worker_process(kinesis_endpoint: str, stream: str, expected: dict[str, int], *,
                         dynamodb_endpoint: str, timeout_s: float, workdir: Path, **_: Any) -> Drain:
    app = common.helpers().unique_name("bench-drain-proc")
    config = common.consumer_config(app, stream, kinesis_endpoint, dynamodb_endpoint)
    out_dir = workdir / app
    out_dir.mkdir()
    drain = Drain(sum(expected.values()))
    drain.start = time.time()
    proc = common.spawn_worker(config, "common:counting_factory",
                               {"out_dir": str(out_dir), "expected": expected},
                               workdir, common.aws_env(), app)
    try:
        deadline = time.monotonic() + timeout_s
        shards = [s for s, n in expected.items() if n > 0]
        while len(list(out_dir.glob("*.done"))) < len(shards):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker process drain incomplete; see {workdir}/{app}.stderr")
            time.sleep(0.01)
        drain.cpu_s = common.process_cpu_seconds(proc.pid)
        drain.peak_rss_mb = common.process_peak_rss_mb(proc.pid)
        reports = [json.loads(p.read_text()) for p in out_dir.glob("*.done")]
        drain.count = sum(r["count"] for r in reports)
        drain.first = min(r["first"] for r in reports)
        drain.end = max(r["done"] for r in reports)
    finally:
        common.stop_process(proc)
        common.delete_table(dynamodb_endpoint, app)
    return drain


VARIANTS: dict[str, Callable[..., Drain]] = {
    "boto3_loop": drain_boto3,
    "ours_in_process": drain_in_process,
    "ours_worker_process": drain_worker_process,
}


def load_backlog(kinesis_endpoint: str, stream: str, total: int) -> dict[str, int]:
    """Put ``total`` 100-byte records; returns how many landed in each shard."""
    h = common.helpers()
    expected: dict[str, int] = {}
    started = time.monotonic()
    for start in range(0, total, 10_000):
        batch = [f"{i:010d}".ljust(100, "x") for i in range(start, min(start + 10_000, total))]
        for put in h.put_records(kinesis_endpoint, stream, batch):
            expected[put.shard_id] = expected.get(put.shard_id, 0) + 1
    common.progress(f"put {total} records in {time.monotonic() - started:.1f} s: {expected}")
    return expected


def against_boto3(kinesis_endpoint: str, emulator_pid: int, stream: str,
                  expected: dict[str, int], rounds: int,
                  variants: dict[str, Callable[[], dict[str, Any]]]) -> list[dict[str, Any]]:
    """``rounds`` rounds of the boto3 loop (``drain_boto3``) and each variant's drain, in an
    order that rotates each round (none always runs first, on a cold emulator, or last);
    each result gets the emulator's CPU seconds during it (``kinesalite_cpu_s``)."""
    names = ["boto3_loop", *variants]
    out: list[dict[str, Any]] = []
    for number in range(rounds):
        shift = number % len(names)
        this_round: dict[str, Any] = {}
        for name in names[shift:] + names[:shift]:
            emu_cpu0 = common.process_cpu_seconds(emulator_pid)
            if name == "boto3_loop":
                drain = drain_boto3(kinesis_endpoint, stream, expected)
                if drain.count < drain.total:
                    raise RuntimeError(f"boto3 drained {drain.count} of {drain.total}")
                result = drain.as_dict()
                result.pop("emulator_cpu_s", None)
            else:
                result = variants[name]()
            result["kinesalite_cpu_s"] = round(
                common.process_cpu_seconds(emulator_pid) - emu_cpu0, 2)
            this_round[name] = result
            common.progress(f"drain round {number + 1} {name}: {result}")
        out.append(this_round)
    return out


def medians(rounds: list[dict[str, Any]], names: list[str],
            keys: tuple[str, ...]) -> dict[str, dict[str, float | None]]:
    """Each variant's median of each key the rounds have (None where no round has a value)."""
    def med(name: str, key: str) -> float | None:
        values = [r[name][key] for r in rounds if r[name].get(key) is not None]
        return round(statistics.median(values), 3) if values else None

    return {n: {k: med(n, k) for k in keys if any(k in r[n] for r in rounds)} for n in names}


def profile_in_process(kwargs: dict[str, Any], expected: dict[str, int], top: int = 30) -> str:
    """One in-process drain under cProfile, every thread profiled (one profiler each), merged."""
    profilers: list[cProfile.Profile] = []
    original_run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.runcall(original_run, self)

    threading.Thread.run = profiled_run  # type: ignore[method-assign]
    main_profiler = cProfile.Profile()
    try:
        main_profiler.runcall(drain_in_process, expected=expected, **kwargs)
    finally:
        threading.Thread.run = original_run  # type: ignore[method-assign]
    text = io.StringIO()
    stats = pstats.Stats(main_profiler, stream=text)
    for profiler in profilers:
        stats.add(profiler)
    stats.sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dynamodb", choices=("dynalite", "moto"), default="dynalite")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated subset of " + ", ".join(VARIANTS))
    parser.add_argument("--timeout", type=float, default=180.0, help="per drain, seconds")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile one in-process drain; the table goes to stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    load_before = os.getloadavg()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variant(s): {', '.join(sorted(unknown))}")

    h = common.helpers()
    rounds: list[dict[str, Any]] = []
    with common.running_emulators("kinesalite", args.dynamodb) as emu, \
            tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp:
        kinesis = emu["kinesalite"].endpoint
        stream = h.unique_name("bench-drain")
        h.create_stream(kinesis, stream, 4)
        expected = load_backlog(kinesis, stream, args.records)
        kwargs = dict(kinesis_endpoint=kinesis, stream=stream, dynamodb_endpoint=emu[args.dynamodb].endpoint,
                      timeout_s=args.timeout, workdir=Path(tmp))
        for number in range(args.rounds):
            shift = number % len(variants)
            order = variants[shift:] + variants[:shift]  # alternate who goes first
            this_round: dict[str, Any] = {}
            for name in order:
                emu_cpu0 = {k: common.process_cpu_seconds(e.pid) for k, e in emu.items()}
                drain = VARIANTS[name](expected=expected, **kwargs)
                drain.emulator_cpu_s = {k: common.process_cpu_seconds(e.pid) - emu_cpu0[k]
                                        for k, e in emu.items()}
                this_round[name] = drain.as_dict()
                common.progress(f"round {number + 1} {name}: {this_round[name]}")
                if drain.count < drain.total:
                    raise RuntimeError(f"{name} drained {drain.count} of {drain.total} records")
            rounds.append(this_round)
        if args.profile:
            sys.stderr.write(profile_in_process(kwargs, expected))
        h.delete_stream(kinesis, stream)

    def median_of(name: str, key: str) -> float | None:
        values = [r[name][key] for r in rounds if name in r and r[name][key] is not None]
        return round(statistics.median(values)) if values else None

    medians = {name: {"rec_s": median_of(name, "rec_s")} for name in variants}
    for name in variants:
        medians[name]["cpu_s"] = round(statistics.median(r[name]["cpu_s"] for r in rounds), 2)
        medians[name]["cpu_s_per_100k_records"] = round(
            medians[name]["cpu_s"] * 100_000 / args.records, 2)
    ratios: dict[str, Any] = {}
    if "boto3_loop" in variants:
        for name in variants:
            if name == "boto3_loop":
                continue
            per_round = [r[name]["rec_s"] / r["boto3_loop"]["rec_s"] for r in rounds]
            ratios[f"{name}/boto3_loop"] = {
                "rec_s": round(statistics.median(per_round), 3),
                "per_round": [round(v, 3) for v in per_round],
                "cpu_s": round(statistics.median(
                    r[name]["cpu_s"] / r["boto3_loop"]["cpu_s"] for r in rounds), 3),
                "meets_target": statistics.median(per_round) >= TARGET_RATIO,
            }
    common.emit({
        "benchmark": "backlog drain, records/s",
        "machine": common.machine(load_before),
        "setup": {"stream": "kinesalite, 4 shards", "records": args.records, "record_bytes": 100,
                  "per_shard": expected, "dynamodb": args.dynamodb, "rounds": args.rounds,
                  "ours_config": "KCL defaults: maxRecords 10000, idleTimeBetweenReadsInMillis 1000; "
                                 "TRIM_HORIZON; checkpoint every batch; empty lease table each round",
                  "boto3_loop": "one client, a thread per shard, get_records Limit 10000, no sleep"},
        "median": medians,
        "ratio_ours_over_boto3": ratios,
        "target_ratio": TARGET_RATIO,
        "rounds": rounds,
        "reference_not_measured_here": REFERENCE,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
