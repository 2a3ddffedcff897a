"""Benchmark: ``kinesis-dstream leases status`` on a 200-shard table, lag included.

Issue 26's target: under 3 s on the 2-core machine.

A 200-shard stream on kinesalite (``--kinesis``; both emulators allow 200 shards; kinesis-local
answers each call in about 60 ms on this machine against kinesalite's 6 ms, so it measures the
emulator more than the command), a few records in every shard, and a lease table on moto
written with our lease-table module (no worker: the leases are created directly): half the
shards checkpointed at their first record, the other half at TRIM_HORIZON, so every lag figure
comes from a real GetRecords. Measured:

* ``in_process``: ``cli.main(["leases", "status", ..., "--json"])`` (boto3 already imported);
* ``command``: ``python -m kinesis_dstream leases status ...`` as an operator types it,
  interpreter start and imports included; also its CPU time (user + system).

Prints one JSON document: seconds as median / min / max per variant.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import common

TARGET_S = 3.0


def build(kinesis: str, dynamodb: str, shards: int, per_shard: int) -> tuple[str, str]:
    """The stream (records in every shard) and its lease table; returns (stream, app)."""
    from kinesis_dstream.aws.lease_table import Lease, LeaseTable
    from kinesis_dstream.records import ExtendedSequenceNumber

    emulators = common.helpers()
    stream, app = emulators.unique_name("bench-status"), emulators.unique_name("bench-status-app")
    emulators.create_stream(kinesis, stream, shards, timeout=120)
    client = emulators.client("kinesis", kinesis)
    answer = client.list_shards(StreamName=stream)
    shard_list = answer["Shards"]
    while answer.get("NextToken"):  # pages of 100 on kinesis-local
        answer = client.list_shards(NextToken=answer["NextToken"])
        shard_list += answer["Shards"]
    # One explicit hash key per shard, so every shard gets records.
    first: dict[str, str] = {}
    for _ in range(per_shard):
        for start in range(0, len(shard_list), 100):
            chunk = shard_list[start:start + 100]
            answer = client.put_records(StreamName=stream, Records=[
                {"Data": b"x" * 100, "PartitionKey": "k",
                 "ExplicitHashKey": shard["HashKeyRange"]["StartingHashKey"]} for shard in chunk])
            for shard, entry in zip(chunk, answer["Records"], strict=True):
                first.setdefault(shard["ShardId"], entry["SequenceNumber"])
    table = LeaseTable(common.consumer_config(app, stream, kinesis, dynamodb))
    table.create_table_if_not_exists()
    for index, shard in enumerate(shard_list):
        shard_id = shard["ShardId"]
        checkpoint = (ExtendedSequenceNumber(first[shard_id]) if index % 2 == 0
                      else ExtendedSequenceNumber("TRIM_HORIZON"))
        table.create_lease_if_not_exists(Lease(
            lease_key=shard_id, lease_owner=f"worker-{index % 4}", lease_counter=1,
            checkpoint=checkpoint, starting_hash_key=shard["HashKeyRange"]["StartingHashKey"],
            ending_hash_key=shard["HashKeyRange"]["EndingHashKey"]))
    return stream, app


def run_in_process(argv: list[str]) -> tuple[float, dict[str, Any]]:
    from kinesis_dstream import cli

    out = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out):
        code = cli.main(argv)
    elapsed = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"leases status exited {code}")
    return elapsed, json.loads(out.getvalue())


def run_command(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds, and the CPU seconds (user + system) the command itself used: on a
    shared machine the wall time follows the load, the CPU time much less."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "kinesis_dstream", *argv], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    elapsed = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--records-per-shard", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kinesis", choices=("kinesalite", "kinesis-local"), default="kinesalite")
    args = parser.parse_args()
    load = os.getloadavg()
    with common.running_emulators(args.kinesis, "moto") as emus:
        kinesis, dynamodb = emus[args.kinesis].endpoint, emus["moto"].endpoint
        common.progress(f"creating a {args.shards}-shard stream and its leases")
        stream, app = build(kinesis, dynamodb, args.shards, args.records_per_shard)
        os.environ.update(common.aws_env())
        argv = ["leases", "status", "--app", app, "--stream", stream, "--json",
                "--kinesis-endpoint", kinesis, "--dynamodb-endpoint", dynamodb]
        in_process: list[float] = []
        command: list[float] = []
        command_cpu: list[float] = []
        report: dict[str, Any] = {}
        run_in_process(argv)  # warm-up: clients' endpoint data loaded once, as in a session
        for run in range(args.runs):
            elapsed, report = run_in_process(argv)
            in_process.append(elapsed)
            wall, cpu = run_command(argv, common.aws_env())
            command.append(wall)
            command_cpu.append(cpu)
            common.progress(f"run {run}: in process {elapsed:.2f} s, command {wall:.2f} s "
                            f"({cpu:.2f} s CPU)")
        lags = [row["lag_ms"] for row in report["shards"]]
    common.emit({
        "benchmark": "leases status, lag included",
        "shards": args.shards, "kinesis_emulator": args.kinesis, "leases_listed": len(report["shards"]),
        "lag_figures": sum(lag is not None for lag in lags),
        "in_process_s": common.summary(in_process), "command_s": common.summary(command),
        "command_cpu_s": common.summary(command_cpu),
        "target_s": TARGET_S, "machine": common.machine(load),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
