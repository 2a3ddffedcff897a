"""Benchmark: what the SQL source's batch-range store costs per batch, counted, by store.

``bench_sql_ranges.py [--metadata dynamodb|hdfs-local|hdfs-s3|all] [--shards 100]
[--batches 10]``. One SparkSession on ``local-cluster[2,1,1024]``, a kinesis-local stream of
``--shards`` shards, a producer putting one record to every shard every 0.5 s (so every
batch reads every shard), a 1 s trigger. moto serves DynamoDB and S3 behind the counting
proxy (tests/fault_proxy.py, in its own process), which counts every call by operation.

* ``dynamodb``: ``kinesis.metadataCommitterType`` DYNAMODB (the range table).
* ``hdfs-local``: HDFS, ``kinesis.metadataPath`` the checkpointLocation (a local directory):
  no AWS call to count; the files written are counted instead (``files_created``).
* ``hdfs-s3``: HDFS, ``kinesis.metadataPath`` an s3:// prefix (AWS_ENDPOINT_URL_S3: the proxy).

Counts are taken in foreachBatch of batch 21 (the start-up's calls, such as the table's
creation, are left out) and again ``--batches`` (20) batches later, so that the deletions
of committed ranges (every 10 batches) are counted for every batch counted: calls per batch by
operation, and their price at the ``PRICES`` below (us-east-1, on-demand DynamoDB, S3
Standard).
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
from pathlib import Path
from typing import Any

import common
import spark_common as sc_common
from counting_proxy import CountingProxy

from kinesis_dstream.sql.reader import CLEANUP_EVERY

MASTER = "local-cluster[2,1,1024]"
TRIGGER = "1 second"
MODES = ("dynamodb", "hdfs-local", "hdfs-s3")
# The SQL source deletes committed ranges every CLEANUP_EVERY batches, those of the batches
# CLEANUP_EVERY to 2 x CLEANUP_EVERY back: counting from batch 2 x CLEANUP_EVERY + 1 over a
# multiple of CLEANUP_EVERY batches counts each batch's deletions once.
FIRST_COUNTED = 2 * CLEANUP_EVERY + 1
# US$ per request (us-east-1), from aws.amazon.com/dynamodb/pricing/on-demand/ (write request
# unit $0.625 / million, read request unit $0.125 / million, since the price cut of 1 Nov.
# 2024) and aws.amazon.com/s3/pricing/ (S3 Standard: PUT, COPY, POST, LIST $0.005 / 1,000;
# GET $0.0004 / 1,000; DELETE free). One range item is < 1 KB (one WRU to write or delete)
# and < 4 KB (one RRU to read strongly consistently).
PRICES = {"dynamodb_wru": 0.625e-6, "dynamodb_rru": 0.125e-6, "s3_put_class": 0.005e-3,
          "s3_get_class": 0.0004e-3}
DYNAMODB_WRITES = {"PutItem", "UpdateItem", "DeleteItem"}
DYNAMODB_READS = {"GetItem", "Query"}
S3_PUT_CLASS = {"PutObject", "ListObjectsV2", "ListObjects", "DeleteObjects"}
S3_GET_CLASS = {"GetObject"}


class ShardFeeder(threading.Thread):
    """Puts one record to every shard (by its starting hash key) every ``every_s``."""

    def __init__(self, kinesis: str, stream: str, every_s: float = 0.5) -> None:
        super().__init__(name="shard-feeder", daemon=True)
        h = common.helpers()
        self.client = h.client("kinesis", kinesis)
        self.stream, self.every_s = stream, every_s
        shards = self.client.list_shards(StreamName=stream)["Shards"]
        self.keys = [s["HashKeyRange"]["StartingHashKey"] for s in shards]
        self.halt = threading.Event()
        self.sent = 0

    def run(self) -> None:
        while not self.halt.wait(self.every_s):
            for i in range(0, len(self.keys), 500):
                self.client.put_records(StreamName=self.stream, Records=[
                    {"Data": f"r{self.sent + j}".encode(), "PartitionKey": "k",
                     "ExplicitHashKey": key} for j, key in enumerate(self.keys[i:i + 500])])
            self.sent += len(self.keys)


class Snapshots:
    """foreachBatch: the proxy's counts (and the files under the range path) after each
    batch that read records, by batch id."""

    def __init__(self, proxy: CountingProxy, ranges_dir: Path | None) -> None:
        self.proxy, self.ranges_dir = proxy, ranges_dir
        self.taken: list[tuple[int, Any, int, int]] = []  # (batch, counts, files ever, rows)
        self.created: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.count()
        if self.ranges_dir is not None and self.ranges_dir.exists():
            self.created.update(str(p) for p in self.ranges_dir.rglob("*.json"))
        with self.lock:
            self.taken.append((batch_id, self.proxy.counts(), len(self.created), rows))


def per_batch(first: tuple[int, Any, int, int], last: tuple[int, Any, int, int]) -> dict[str, Any]:
    batches = last[0] - first[0]
    delta = last[1] - first[1]
    by_op: dict[str, float] = {}
    for (op, _table), n in delta.items():
        by_op[op] = by_op.get(op, 0) + n
    calls = {op: round(n / batches, 2) for op, n in sorted(by_op.items())}
    # A BatchWriteItem call deletes up to 25 items, a WRU each: the items it deletes are the
    # ranges written (each once, after its batch is committed), as many as the PutItems.
    written = by_op.get("PutItem", 0)
    wru = sum(by_op.get(op, 0) for op in DYNAMODB_WRITES) + \
        (written if by_op.get("BatchWriteItem") else 0)
    rru = sum(by_op.get(op, 0) for op in DYNAMODB_READS)
    put_class = sum(by_op.get(op, 0) for op in S3_PUT_CLASS)
    get_class = sum(by_op.get(op, 0) for op in S3_GET_CLASS)
    dollars = (wru * PRICES["dynamodb_wru"] + rru * PRICES["dynamodb_rru"]
               + put_class * PRICES["s3_put_class"] + get_class * PRICES["s3_get_class"])
    return {"batches": batches, "calls_per_batch": calls,
            "dynamodb_wru_per_batch": round(wru / batches, 2),
            "dynamodb_rru_per_batch": round(rru / batches, 2),
            "calls_per_batch_total": round(sum(by_op.values()) / batches, 2),
            "files_created_per_batch": round((last[2] - first[2]) / batches, 2),
            "usd_per_batch": round(dollars / batches, 7),
            "usd_per_day_at_one_batch_a_second": round(dollars / batches * 86_400, 2)}


def measure(spark: Any, mode: str, kinesis: str, proxy: CountingProxy, stream: str,
            bucket: str, args: argparse.Namespace) -> dict[str, Any]:
    h = common.helpers()
    table = h.unique_name("bench-ranges")
    checkpoint = tempfile.mkdtemp(prefix="bench-ranges-ckpt-")
    opts = {"kinesis.streamName": stream, "kinesis.endpointUrl": kinesis,
            "kinesis.region": "us-east-1", "kinesis.dynamodb.endpointUrl": proxy.endpoint,
            "kinesis.dynamodb.tableName": table, "kinesis.startingPosition": "LATEST"}
    ranges_dir = None
    if mode == "dynamodb":
        opts["kinesis.metadataCommitterType"] = "DYNAMODB"
    elif mode == "hdfs-local":
        opts.update({"kinesis.metadataCommitterType": "HDFS", "kinesis.metadataPath": checkpoint})
        ranges_dir = Path(checkpoint) / "kinesis-ranges"
    else:
        opts.update({"kinesis.metadataCommitterType": "HDFS",
                     "kinesis.metadataPath": f"s3://{bucket}/{table}"})
    snapshots = Snapshots(proxy, ranges_dir)
    query = (spark.readStream.format("aws-kinesis").options(**opts).load().writeStream
             .foreachBatch(snapshots).option("checkpointLocation", checkpoint)
             .trigger(processingTime=TRIGGER).start())
    try:
        def by_batch() -> dict[int, tuple[int, Any, int, int]]:
            with snapshots.lock:
                return {t[0]: t for t in snapshots.taken}

        last_id = FIRST_COUNTED + args.batches
        if not sc_common.wait_for(lambda: last_id in by_batch()
                                  or query.exception() is not None, args.timeout):
            raise RuntimeError(f"{mode}: batch {last_id} not reached in {args.timeout} s")
        if query.exception() is not None:
            raise RuntimeError(f"{mode}: {query.exception()}")
        taken = by_batch()
        if FIRST_COUNTED not in taken:
            raise RuntimeError(f"{mode}: no foreachBatch call for batch {FIRST_COUNTED}")
        counted = [taken[b] for b in range(FIRST_COUNTED + 1, last_id + 1) if b in taken]
        if any(t[3] == 0 for t in counted):
            raise RuntimeError(f"{mode}: a counted batch read nothing (the feeder lags)")
        result = per_batch(taken[FIRST_COUNTED], taken[last_id])
        result["rows_per_batch"] = round(sum(t[3] for t in counted) / len(counted), 1)
        result["batch_duration_ms_median"] = median(
            [p["durationMs"]["triggerExecution"] for p in query.recentProgress
             if p.get("numInputRows")])
        return result
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
        if mode == "dynamodb":
            common.delete_table(proxy.endpoint, f"{table}-kinesis-dstream-ranges")


def median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--metadata", choices=[*MODES, "all"], default="all",
                        help="the range store to measure (kinesis.metadataCommitterType)")
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--batches", type=int, default=2 * CLEANUP_EVERY,
                        help=f"batches counted (a multiple of {CLEANUP_EVERY})")
    parser.add_argument("--timeout", type=float, default=600.0, help="per store, seconds")
    args = parser.parse_args(argv)
    if args.batches <= 0 or args.batches % CLEANUP_EVERY:
        parser.error(f"--batches: a positive multiple of {CLEANUP_EVERY}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    modes = list(MODES) if args.metadata == "all" else [args.metadata]
    sc_common.use_dummy_aws_env()
    load_before = os.getloadavg()
    h = common.helpers()
    with common.running_emulators("kinesis-local", "moto") as emu:
        kinesis, moto = emu["kinesis-local"].endpoint, emu["moto"].endpoint
        with CountingProxy(moto) as proxy:
            os.environ["AWS_ENDPOINT_URL_S3"] = proxy.endpoint  # read on the driver
            bucket = f"bench-ranges-{os.getpid()}"
            h.client("s3", moto).create_bucket(Bucket=bucket)
            stream = h.unique_name("bench-ranges")
            h.create_stream(kinesis, stream, args.shards, timeout=120)
            from bench_sql_source import spark_session

            spark = spark_session()
            common.progress(f"Spark warm-up job: {sc_common.warm_up(spark.sparkContext):.2f} s")
            feeder = ShardFeeder(kinesis, stream)
            feeder.start()
            results: dict[str, Any] = {}
            try:
                for mode in modes:
                    started = time.monotonic()
                    results[mode] = measure(spark, mode, kinesis, proxy, stream, bucket, args)
                    results[mode]["wall_s"] = round(time.monotonic() - started, 1)
                    common.progress(f"{mode}: {results[mode]}")
            finally:
                feeder.halt.set()
                spark.sparkContext.stop()
    common.emit({"benchmark": "sql_ranges", "shards": args.shards, "trigger": TRIGGER,
                 "prices_usd": PRICES, "stores": results,
                 "machine": common.machine(load_before)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
