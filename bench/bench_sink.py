"""Benchmark: writing to Kinesis, records/s: the aws-kinesis sink and KinesisProducer against a
plain boto3 PutRecords loop (issue 8).

``--records`` (100,000) records of 100 bytes with 1,000 partition keys go to a fresh 4-shard
kinesalite stream per run, ``--rounds`` (3) rounds, the order rotating every round:

* ``boto3_loop``: one boto3 client, ``put_records`` of 500 entries in a loop, entries built
  before the clock starts (what a user would write; failed entries are counted, not retried);
* ``producer_plain`` / ``producer_aggregated``: ``KinesisProducer`` in this process, KPL
  aggregation off / on (defaults otherwise: one connection, 50 KiB aggregates);
* ``sink_plain`` / ``sink_aggregated``: ``df.write.format("aws-kinesis")`` on local[2] from
  ``spark.range`` (2 partitions, so 2 producers in Spark's Python workers), Spark job
  overhead included; a warm-up write runs before the first round.

``rec_s`` is user records / wall seconds; ``kinesis_records`` what the stream holds after the
run (aggregates count once). Prints one JSON document.
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from typing import Any, Callable

import common

VARIANTS = ("boto3_loop", "producer_plain", "producer_aggregated", "sink_plain", "sink_aggregated")
PARTITION_KEYS = 1000


def _records(total: int) -> list[tuple[str, bytes]]:
    return [(f"pk-{i % PARTITION_KEYS}", f"{i:010d}".ljust(100, "x").encode())
            for i in range(total)]


def run_boto3_loop(endpoint: str, stream: str, records: list[tuple[str, bytes]],
                   **_: Any) -> dict[str, Any]:
    kinesis = common.helpers().client("kinesis", endpoint)
    entries = [{"PartitionKey": k, "Data": d} for k, d in records]
    failed = 0
    started = time.monotonic()
    for start in range(0, len(entries), 500):
        failed += kinesis.put_records(StreamName=stream,
                                      Records=entries[start:start + 500])["FailedRecordCount"]
    return {"seconds": time.monotonic() - started, "failed": failed}


def _config(endpoint: str, stream: str) -> Any:
    from kinesis_dstream.config import ConsumerConfig
    from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY

    return ConsumerConfig(application_name="bench-sink", stream_name=stream,
                          region_name=DUMMY_REGION, kinesis_endpoint=endpoint,
                          aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                          aws_secret_key=DUMMY_SECRET_ACCESS_KEY)


def _run_producer(aggregation: bool) -> Callable[..., dict[str, Any]]:
    def run(endpoint: str, stream: str, records: list[tuple[str, bytes]],
            **_: Any) -> dict[str, Any]:
        from kinesis_dstream.aws.producer import KinesisProducer

        started = time.monotonic()
        with KinesisProducer(_config(endpoint, stream), aggregation=aggregation) as producer:
            for key, data in records:
                producer.put(data, key)
        seconds = time.monotonic() - started
        if producer.stats.user_records != len(records):
            raise RuntimeError(f"producer took {producer.stats.user_records} records")
        return {"seconds": seconds, "put_records_calls": producer.stats.put_records_calls}
    return run


def _sink_write(spark: Any, endpoint: str, stream: str, total: int, aggregation: bool) -> None:
    from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY

    df = spark.range(0, total, numPartitions=2).selectExpr(
        f"concat('pk-', cast(id % {PARTITION_KEYS} as string)) as partitionKey",
        "rpad(lpad(cast(id as string), 10, '0'), 100, 'x') as data")
    (df.write.format("aws-kinesis").mode("append")
     .option("kinesis.streamName", stream).option("kinesis.endpointUrl", endpoint)
     .option("kinesis.region", DUMMY_REGION).option("kinesis.awsAccessKeyId", DUMMY_ACCESS_KEY_ID)
     .option("kinesis.awsSecretKey", DUMMY_SECRET_ACCESS_KEY)
     .option("kinesis.sink.aggregationEnabled", str(aggregation).lower()).save())


def _run_sink(aggregation: bool) -> Callable[..., dict[str, Any]]:
    def run(endpoint: str, stream: str, records: list[tuple[str, bytes]], spark: Any,
            **_: Any) -> dict[str, Any]:
        started = time.monotonic()
        _sink_write(spark, endpoint, stream, len(records), aggregation)
        return {"seconds": time.monotonic() - started}
    return run


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "boto3_loop": run_boto3_loop,
    "producer_plain": _run_producer(False),
    "producer_aggregated": _run_producer(True),
    "sink_plain": _run_sink(False),
    "sink_aggregated": _run_sink(True),
}


def count_kinesis_records(endpoint: str, stream: str) -> int:
    return len(common.helpers().read_all(endpoint, stream, timeout=300))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated subset of " + ", ".join(VARIANTS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    load_before = os.getloadavg()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variant(s): {', '.join(sorted(unknown))}")
    h = common.helpers()
    records = _records(args.records)
    spark = None
    rounds: list[dict[str, Any]] = []
    with common.running_emulators("kinesalite") as emu:
        endpoint = emu["kinesalite"].endpoint
        if any(v.startswith("sink") for v in variants):
            from pyspark.sql import SparkSession

            import spark_common

            spark_common.spark_context()
            spark = SparkSession.builder.getOrCreate()
            warm = h.unique_name("bench-sink-warm")
            h.create_stream(endpoint, warm, 4)
            _sink_write(spark, endpoint, warm, 10_000, True)
            h.delete_stream(endpoint, warm)
        for number in range(args.rounds):
            shift = number % len(variants)
            this_round: dict[str, Any] = {}
            for name in variants[shift:] + variants[:shift]:
                stream = h.unique_name(f"bench-sink-{name}")
                h.create_stream(endpoint, stream, 4)
                cpu0 = common.process_cpu_seconds(emu["kinesalite"].pid)
                result = RUNNERS[name](endpoint=endpoint, stream=stream, records=records,
                                       spark=spark)
                result["kinesalite_cpu_s"] = round(
                    common.process_cpu_seconds(emu["kinesalite"].pid) - cpu0, 2)
                result["rec_s"] = round(args.records / result["seconds"])
                result["seconds"] = round(result["seconds"], 2)
                result["kinesis_records"] = count_kinesis_records(endpoint, stream)
                h.delete_stream(endpoint, stream)
                this_round[name] = result
                common.progress(f"round {number + 1} {name}: {result}")
            rounds.append(this_round)
    median = {name: {"rec_s": round(statistics.median(r[name]["rec_s"] for r in rounds)),
                     "kinesis_records": round(statistics.median(
                         r[name]["kinesis_records"] for r in rounds))}
              for name in variants}
    ratios = {}
    if "boto3_loop" in variants:
        for name in variants:
            if name != "boto3_loop":
                per_round = [r[name]["rec_s"] / r["boto3_loop"]["rec_s"] for r in rounds]
                ratios[f"{name}/boto3_loop"] = {"rec_s": round(statistics.median(per_round), 3),
                                                "per_round": [round(v, 3) for v in per_round]}
    common.emit({
        "benchmark": "writing to Kinesis, user records/s",
        "machine": common.machine(load_before),
        "setup": {"stream": "kinesalite, 4 shards, fresh per run", "records": args.records,
                  "record_bytes": 100, "partition_keys": PARTITION_KEYS, "rounds": args.rounds,
                  "boto3_loop": "one client, put_records 500 entries a call, sequential",
                  "sink": "df.write.format('aws-kinesis') from spark.range, local[2], "
                          "2 partitions; Spark job overhead included"},
        "median": median,
        "ratio_over_boto3": ratios,
        "rounds": rounds,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
