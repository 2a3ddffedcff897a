"""Benchmark: reads at Kinesis' per-shard read limits (issue 16), one JSON document.

A 4-shard kinesalite backlog of 1,000-byte records (``--mb``, default 240) is read through
tests/fault_proxy.py in limits mode (GetRecords 5 calls/s and 2 MiB/s per shard,
GetShardIterator 5 calls/s per shard), run in a process of its own so that its JSON work does
not compete with the readers for this process' GIL:

* ``kcl_boto3``: a KCL-style boto3 reader in the same run: a thread per shard, one GetRecords
  (10,000 records at most) at least 1 s after the last (the KCL's idleTimeBetweenReads),
  a refusal waited out the same way (botocore's own retries off, so each one is seen);
* ``dstream_default``: ``createStream`` with the default storage level, on
  local-cluster[2,1,1024], 1 s batches, foreachRDD collecting each record's index;
* ``dstream_none``: the same with ``StorageLevel.NONE`` (no read-ahead: the output
  operation's read decides each batch's ranges, and the next batch waits for its completion);
* ``sql`` (``--sql`` or ``--only sql``): ``readStream.format("aws-kinesis")`` TRIM_HORIZON
  on the same cluster, 1 s triggers, foreachBatch collecting each record's index. Measured
  as the DStream: from ``start()`` (the query defined before, as the DStream is before
  ``ssc.start()``), after a warm-up of the Python workers Spark SQL reads through
  (``warm_up_sql``: ``warm_up``'s RDD workers, which the DStream reuses, do not serve them).

Per variant: MiB/s per shard from its start to its last record (and from its first record),
the ratio to 2 MiB/s and to ``kcl_boto3``, the proxy's refusals by operation, the refusals
metrics() counted, failed batches (the planner's ERROR lines) and exact counts;
``idle_s_per_shard``, the seconds a shard's budget stood full with nobody reading, from the
variant's clock start to its end (its start-up, its gaps, and the tail after a shard's last
record: what it left unread); for ``sql`` each micro-batch's rows and trigger milliseconds.

``live`` (``--live-s``, 0 skips it): three DStream applications (different names, one
StreamingContext) on one 4-shard stream while a producer puts ``--live-kib`` KiB/s per shard;
after the producer stops, each application's lag (seconds until it had every record) and
its counts (every record once).

Quote figures with the machine's load: ``python bench/bench_limits.py --mb 40``.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable

import common
import spark_common as sc_common

MiB = 1024 * 1024
LIMIT_MIB_S = 2.0
RECORD_BYTES = 1000


# -- the limits proxy, in a process of its own --------------------------------------------------
def _serve_proxy(upstream: str, conn: Any) -> None:
    sys.path.insert(0, str(common.TESTS_DIR))
    from fault_proxy import FaultProxy, ShardLimits

    limits = ShardLimits()
    proxy = FaultProxy(upstream, share=0.0, limits=limits, max_lifetime_s=6 * 3600).start()
    conn.send(proxy.endpoint)
    while True:
        command = conn.recv()
        if command == "stats":
            idle = limits.idle_until_now()
            with limits._lock:
                conn.send({"refused": {f"{op} {shard}": n for (op, shard), n
                                       in sorted(limits.refused.items())},
                           "served_bytes": dict(limits.served_bytes), "idle_s": idle,
                           "unattributed": limits.unattributed})
        else:
            proxy.stop()
            conn.send("stopped")
            return


class LimitsProxy(common.ServedProcess):
    def __init__(self, upstream: str) -> None:
        super().__init__(_serve_proxy, upstream)

    def stats(self) -> dict[str, Any]:
        return self.ask("stats")


def refusals_between(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    by_operation: Counter[str] = Counter()
    for key, n in after["refused"].items():
        by_operation[key.split(" ")[0]] += n - before["refused"].get(key, 0)
    return dict(by_operation)


class Window:
    """What the proxy sees of one variant, from its clock's start (``start``, which a Spark
    variant calls once its set-up is done) to ``costs``: refusals, and the budget left idle."""

    def __init__(self, proxy: LimitsProxy) -> None:
        self.proxy = proxy
        self.before = proxy.stats()

    def start(self) -> None:
        self.before = self.proxy.stats()

    def costs(self) -> dict[str, Any]:
        after = self.proxy.stats()
        return {"refusals": refusals_between(self.before, after),
                "idle_s_per_shard": idle_between(self.before, after)}


def idle_between(before: dict[str, Any], after: dict[str, Any]) -> float:
    """Seconds each shard's budget stood full with nobody reading (mean over the shards)
    between two stats: the variant's start-up, its gaps and its tail, all it left unread."""
    idle = after["idle_s"]
    return round(sum(s - before["idle_s"].get(k, 0.0) for k, s in idle.items())
                 / max(1, len(idle)), 2)


# -- the backlog --------------------------------------------------------------------------------
def fill(kinesis: str, stream: str, records: int) -> dict[str, int]:
    """``records`` 1,000-byte records whose first 10 characters are their index; per shard."""
    h = common.helpers()
    per_shard: Counter[str] = Counter()
    chunk = 20_000
    for start in range(0, records, chunk):
        put = h.put_records(kinesis, stream, [
            (f"pk{i}", f"{i:010d}".ljust(RECORD_BYTES, "x"))
            for i in range(start, min(records, start + chunk))])
        per_shard.update(p.shard_id for p in put)
        common.progress(f"put {min(records, start + chunk)} of {records}")
    return dict(per_shard)


def rates(total_bytes: int, shards: int, started: float, first: float | None,
          done: float) -> dict[str, Any]:
    wall = done - started
    per_shard = total_bytes / MiB / shards / wall
    result = {"wall_s": round(wall, 2), "mib_s_per_shard": round(per_shard, 3),
              "of_limit": round(per_shard / LIMIT_MIB_S, 3)}
    if first is not None and done > first:
        steady = total_bytes / MiB / shards / (done - first)
        result.update(first_record_s=round(first - started, 2),
                      mib_s_per_shard_after_first=round(steady, 3),
                      of_limit_after_first=round(steady / LIMIT_MIB_S, 3))
    return result


# -- (a) a KCL-style boto3 reader ----------------------------------------------------------------
def kcl_boto3(endpoint: str, stream: str, per_shard: dict[str, int],
              timeout_s: float) -> dict[str, Any]:
    import boto3
    from botocore.config import Config

    from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY

    seen: set[int] = set()
    counted = [0]
    lock = threading.Lock()
    throttled: Counter[str] = Counter()
    first: list[float] = []
    errors: list[BaseException] = []

    def read(shard: str) -> None:
        try:
            kinesis = boto3.client(
                "kinesis", endpoint_url=endpoint, region_name=DUMMY_REGION,
                aws_access_key_id=DUMMY_ACCESS_KEY_ID, aws_secret_access_key=DUMMY_SECRET_ACCESS_KEY,
                config=Config(retries={"total_max_attempts": 1, "mode": "standard"},
                              max_pool_connections=2))
            refused = kinesis.exceptions.ProvisionedThroughputExceededException
            iterator = None
            got = 0
            deadline = time.monotonic() + timeout_s
            last_call = 0.0
            while got < per_shard[shard] and time.monotonic() < deadline:
                time.sleep(max(0.0, last_call + 1.0 - time.monotonic()))
                last_call = time.monotonic()
                try:
                    if iterator is None:
                        iterator = kinesis.get_shard_iterator(
                            StreamName=stream, ShardId=shard,
                            ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
                    page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
                except refused:
                    throttled[shard] += 1
                    continue
                iterator = page["NextShardIterator"]
                ids = [int(r["Data"][:10]) for r in page["Records"]]
                got += len(ids)
                with lock:
                    if ids and not first:
                        first.append(time.time())
                    seen.update(ids)
                    counted[0] += len(ids)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    started = time.time()
    threads = [threading.Thread(target=read, args=(s,), daemon=True) for s in sorted(per_shard)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = time.time()
    if errors:
        raise errors[0]
    total = sum(per_shard.values())
    result = rates(len(seen) * RECORD_BYTES, len(per_shard), started, first[0] if first else None,
                   done)
    result.update(records=len(seen), records_counted=counted[0], exact=counted[0] == total == len(seen),
                  reader_refusals_seen=sum(throttled.values()))
    return result


# -- (b, c) the DStream ---------------------------------------------------------------------------
class FailedBatches(logging.Handler):
    """Counts the planner's "batch N failed" lines (a batch whose output operation failed)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "failed" in record.getMessage():
            self.count += 1


def dstream(sc: Any, kinesis: str, dynamodb: str, stream: str, total: int, timeout_s: float,
            at_start: Callable[[], None], **create_kwargs: Any) -> dict[str, Any]:
    from kinesis_dstream import KinesisUtils

    h = common.helpers()
    app = h.unique_name("bench-limits")
    ssc = sc_common.streaming_context(sc)
    counter = sc_common.BatchCounter(unique=True)
    counter.target = total
    kstream = sc_common.create_stream(ssc, app, stream, kinesis, dynamodb, **create_kwargs)
    kstream.foreachRDD(counter.function())
    failed = FailedBatches()
    logging.getLogger("kinesis_dstream").addHandler(failed)
    result: dict[str, Any] = {}
    at_start()
    started = time.time()
    try:
        ssc.start()
        finished = counter.done.wait(timeout_s)
        metrics = KinesisUtils.metrics(stream)
        done = counter.done_at or time.time()
        result = rates(counter.distinct * RECORD_BYTES, 4, started, counter.first_data_at, done)
        result.update(records=counter.distinct, records_counted=counter.total,
                      exact=finished and counter.total == counter.distinct == total,
                      batches=counter.batches, failed_batches=failed.count,
                      refusals_in_metrics=sum(m.get("throttled", 0) for m in metrics.values()))
    finally:
        logging.getLogger("kinesis_dstream").removeHandler(failed)
        sc_common.stop_streaming(ssc)
        common.delete_table(dynamodb, app)
        common.delete_table(dynamodb, f"{app}-kinesis-dstream-ranges")
    return result


# -- (d) the Structured Streaming source -----------------------------------------------------------
class DistinctRows:
    """foreachBatch target: each row's record index (the data's first 10 characters)."""

    def __init__(self, total: int) -> None:
        self.lock = threading.Lock()
        self.seen: Counter[int] = Counter()
        self.first: float | None = None
        self.done_at: float | None = None
        self.total = total

    def __call__(self, df: Any, batch_id: int) -> None:
        ids = [int(r[0]) for r in df.selectExpr("cast(substring(data, 1, 10) as string)").collect()]
        with self.lock:
            if ids and self.first is None:
                self.first = time.time()
            self.seen.update(ids)
            if self.done_at is None and len(self.seen) >= self.total:
                self.done_at = time.time()


def sql(sc: Any, kinesis: str, dynamodb: str, stream: str, total: int,
        timeout_s: float, at_start: Callable[[], None]) -> dict[str, Any]:
    """``readStream.format("aws-kinesis")`` TRIM_HORIZON, 1 s triggers, until every record."""
    import tempfile

    from pyspark.sql import SparkSession

    import bench_sql_source

    from kinesis_dstream.sql.datasource import KinesisDataSource

    spark = SparkSession(sc)
    spark.dataSource.register(KinesisDataSource)
    table = common.helpers().unique_name("bench-limits-sql")
    checkpoint = tempfile.mkdtemp(prefix="bench-limits-ckpt-")
    rows = DistinctRows(total)
    opts = bench_sql_source.source_options(stream, kinesis, dynamodb, table)
    sc_common.warm_up_sql(spark)
    # Measured from start(), as dstream() from ssc.start(): the query is defined first, as
    # the DStream is (load() asks the source's schema of a Python process of its own).
    writer = (spark.readStream.format("aws-kinesis").options(**opts).load().writeStream
              .foreachBatch(rows).option("checkpointLocation", checkpoint)
              .trigger(processingTime="1 second"))
    at_start()
    started = time.time()
    query = writer.start()
    try:
        finished = sc_common.wait_for(lambda: rows.done_at is not None, timeout_s, 0.5)
        progress = query.recentProgress
    finally:
        stop_query(query, checkpoint, dynamodb, table)
    result = query_result(query, rows, 4, started, bool(finished), total)
    # Each micro-batch's rows and trigger time (ms), where the time between records went.
    result.update(batches_reported=len(progress), batches=[
        [p.numInputRows, p.durationMs.get("triggerExecution")] for p in progress],
        first_batches_ms=[dict(p.durationMs) for p in progress[:2]])
    return result


def stop_query(query: Any, checkpoint: str, dynamodb: str, table: str) -> None:
    """Stops a SQL variant's query and drops its checkpoint and range table."""
    query.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    common.delete_table(dynamodb, f"{table}-kinesis-dstream-ranges")


def query_result(query: Any, rows: Any, shards: int, started: float, finished: bool,
                 total: int) -> dict:
    """A SQL variant's rates from what its rows counted, and whether it counted exactly."""
    with rows.lock:
        distinct, counted = len(rows.seen), sum(rows.seen.values())
    result = rates(distinct * RECORD_BYTES, shards, started, rows.first,
                   rows.done_at or time.time())
    result.update(records=distinct, records_counted=counted,
                  exact=finished and counted == distinct == total,
                  query_failed=str(query.exception() or "") or None)
    return result


# -- (e) three applications at live traffic -------------------------------------------------------
class Producer(threading.Thread):
    def __init__(self, kinesis: str, stream: str, records_s: int, duration_s: float) -> None:
        super().__init__(name="bench-producer", daemon=True)
        self.client = common.helpers().client("kinesis", kinesis)
        self.stream, self.records_s, self.duration_s = stream, records_s, duration_s
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            start = time.monotonic()
            while time.monotonic() - start < self.duration_s:
                want = int((time.monotonic() - start + 0.2) * self.records_s) - self.sent
                for offset in range(0, max(0, want), 500):
                    entries = [{"PartitionKey": f"pk{i}",
                                "Data": f"{i:010d}".ljust(RECORD_BYTES, "x").encode()}
                               for i in range(self.sent, self.sent + min(500, want - offset))]
                    reply = self.client.put_records(StreamName=self.stream, Records=entries)
                    if reply.get("FailedRecordCount"):
                        raise RuntimeError(f"{reply['FailedRecordCount']} puts failed")
                    self.sent += len(entries)
                time.sleep(0.2)
        except BaseException as exc:  # noqa: BLE001 - reported by the benchmark
            self.error = exc


def live(sc: Any, kinesis: str, dynamodb: str, args: argparse.Namespace) -> dict[str, Any]:
    h = common.helpers()
    stream = h.unique_name("bench-limits-live")
    h.create_stream(kinesis, stream, 4)
    ssc = sc_common.streaming_context(sc)
    apps = [h.unique_name(f"bench-limits-app{i}") for i in range(3)]
    counters = []
    for app in apps:
        counter = sc_common.BatchCounter(unique=True)
        sc_common.create_stream(ssc, app, stream, kinesis, dynamodb).foreachRDD(counter.function())
        counters.append(counter)
    failed = FailedBatches()
    logging.getLogger("kinesis_dstream").addHandler(failed)
    records_s = int(args.live_kib * 1024 * 4 / RECORD_BYTES)
    producer = Producer(kinesis, stream, records_s, args.live_s)
    result: dict[str, Any] = {"producer_records_s": records_s,
                              "producer_kib_s_per_shard": args.live_kib}
    try:
        ssc.start()
        producer.start()
        producer.join()
        stopped = time.time()
        if producer.error is not None:
            raise producer.error
        for counter in counters:
            counter.target = producer.sent
            if counter.distinct >= producer.sent:
                counter.done_at = counter.done_at or stopped
                counter.done.set()
        for counter in counters:
            counter.done.wait(args.timeout_s)
        result.update(sent=producer.sent, sent_mib_s_per_shard=round(
            producer.sent * RECORD_BYTES / MiB / 4 / args.live_s, 3),
            failed_batches=failed.count,
            apps=[{"records": c.distinct, "records_counted": c.total,
                   "exact": c.total == c.distinct == producer.sent,
                   "caught_up_s_after_producer_stopped":
                       round(c.done_at - stopped, 2) if c.done_at else None}
                  for c in counters])
    finally:
        logging.getLogger("kinesis_dstream").removeHandler(failed)
        sc_common.stop_streaming(ssc)
        for app in apps:
            common.delete_table(dynamodb, app)
            common.delete_table(dynamodb, f"{app}-kinesis-dstream-ranges")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=240.0, help="backlog size, MB (default 240)")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--live-s", type=float, default=60.0, help="live part length; 0 skips it")
    parser.add_argument("--live-kib", type=float, default=256.0,
                        help="live traffic, KiB/s per shard (three applications read it)")
    parser.add_argument("--sql", action="store_true", help="the SQL source too")
    parser.add_argument("--only", choices=["kcl_boto3", "dstream_default", "dstream_none", "sql",
                                           "live"], action="append")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from pyspark import StorageLevel

    h = common.helpers()
    load = os.getloadavg()
    records = int(args.mb * 1_000_000 / RECORD_BYTES)
    wanted = set(args.only or ["kcl_boto3", "dstream_default", "dstream_none", "live"]
                 + (["sql"] if args.sql else []))
    result: dict[str, Any] = {"benchmark": "bench_limits", "backlog_mb": args.mb,
                              "records": records, "record_bytes": RECORD_BYTES,
                              "limit_mib_s_per_shard": LIMIT_MIB_S}
    sc_common.use_dummy_aws_env()
    with common.running_emulators("kinesalite", "moto") as emu, \
            LimitsProxy(emu["kinesalite"].endpoint) as proxy:
        kinesis, dynamodb = emu["kinesalite"].endpoint, emu["moto"].endpoint
        stream = h.unique_name("bench-limits")
        h.create_stream(kinesis, stream, 4)
        per_shard = fill(kinesis, stream, records)
        result["records_per_shard"] = per_shard
        variants: dict[str, Any] = {}
        if "kcl_boto3" in wanted:
            common.progress("kcl_boto3")
            window = Window(proxy)
            variants["kcl_boto3"] = kcl_boto3(proxy.endpoint, stream, per_shard, args.timeout_s)
            variants["kcl_boto3"].update(window.costs())
        sc = sc_common.spark_context(sc_common.CLUSTER)
        try:
            sc_common.warm_up(sc)
            for name, kwargs in (("dstream_default", {}),
                                 ("dstream_none", {"storageLevel": StorageLevel.NONE})):
                if name not in wanted:
                    continue
                common.progress(name)
                window = Window(proxy)
                variants[name] = dstream(sc, proxy.endpoint, dynamodb, stream, records,
                                         args.timeout_s, window.start, **kwargs)
                variants[name].update(window.costs())
            if "sql" in wanted:
                common.progress("sql")
                window = Window(proxy)
                variants["sql"] = sql(sc, proxy.endpoint, dynamodb, stream, records,
                                      args.timeout_s, window.start)
                variants["sql"].update(window.costs())
            boto = variants.get("kcl_boto3", {}).get("mib_s_per_shard")
            for name, figures in variants.items():
                if boto and name != "kcl_boto3":
                    figures["of_kcl_boto3"] = round(figures["mib_s_per_shard"] / boto, 3)
            result["drain"] = variants
            if "live" in wanted and args.live_s > 0:
                common.progress("live: three applications")
                window = Window(proxy)
                result["live"] = live(sc, proxy.endpoint, dynamodb, args)
                result["live"]["refusals"] = window.costs()["refusals"]
        finally:
            sc.stop()
    result["machine"] = common.machine(load)
    common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
