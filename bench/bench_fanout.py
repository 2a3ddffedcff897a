"""Benchmark: enhanced fan-out beside polling (issue 24), one JSON document a part.

``bench_fanout.py [latency] [throttle] [drain] [idle] [wide]`` (no part: all). Each part runs
polling and fan-out one after the other in the same run, on the same emulators. Fan-out is
served by the fan-out front of ``kinesis-dstream local`` (kinesis_dstream.fanout_front, its
defaults: 300 s subscriptions, a heartbeat every 5 s, 2 MiB/s per consumer and shard), in a
process of its own so its threads do not compete with the reader for one GIL. It counts every
call by operation and shard (tests/fanout_faults.py) and every SubscribeToShard it refused.
Records are put through the front, which pushes them at once, as Kinesis pushes a put record.

* ``latency``: put -> processed at ``--rate`` (200) records/s on a 4-shard kinesis-local
  stream, for the worker (``Scheduler`` in this process, KCL defaults: polling sleeps
  idleTimeBetweenReads 1 s between reads) and the DStream (local-cluster[2,1,1024], 1 s
  batches, foreachRDD collect); p50 / p90 / p99. Goals: worker fan-out p50 <= 0.2 s; the
  DStream's fan-out p50 below polling's.
* ``throttle``: a 1-shard stream at 200 records/s also read by four other polling
  applications (KCL-style loops, one GetRecords a second each) through the limits proxy
  (tests/fault_proxy.py: 5 GetRecords/s and 2 MiB/s per shard, shared by every poller). The
  worker reads it by polling through the same limits, then by fan-out (not subject to them):
  refusals counted for each, the others' and the worker's apart, and the worker's latency.
* ``drain``: a kinesalite backlog of 1,000-byte records (``--drain-mb``, 30) on
  ``--drain-shards`` (1) drained by the worker by fan-out (the front, keeping the consumers
  itself, paces each consumer's shard at 2 MiB/s), beside polling through the limits proxy;
  MiB/s per shard from the first record to the last, as a fraction of 2 MiB/s (goal >= 0.9).
* ``idle``: a worker process (``python -m kinesis_dstream worker``) holding every shard of an
  idle stream of 1 and of ``--idle-shards`` (50) shards, once subscribed (or polling) for
  ``--idle-s`` (60) s: its CPU seconds and resident memory, per shard and per minute, and
  what one more idle shard adds between the two sizes.
* ``wide``: bench_wide.py's measurement (200 shards, 8 busy at 1,000 records/s on kinesalite,
  a DStream on local-cluster[2,1,1024] at 1 s batches, 40 s measured after 10 s): median
  batch time and the lag behind the clock at the window's end; the Spark conf
  ``spark.streaming.kinesis.consumerType = SubscribeToShard`` for fan-out. kinesalite has no
  consumer API, so the front in front of it keeps the consumers itself
  (``ConsumersInFront``, below); everything else passes through to kinesalite. The lease and
  range tables are on ``--wide-dynamodb`` (dynalite; moto's server costs about eight times the
  CPU a call, which on 2 cores is taken from Spark). Goals: fan-out median <= 0.5 s, within
  2 s of the clock.

Not a timed test: it prints figures, the goals beside them.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

import common

PARTS = ("latency", "throttle", "drain", "idle", "wide")
MiB = 1024 * 1024
GOALS = {"worker_fanout_p50_s": 0.2, "drain_of_limit": 0.9, "wide_batch_median_s": 0.5,
         "wide_lag_s": 2.0}


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))]


def latency_stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"p50": round(statistics.median(values), 3), "p90": round(percentile(values, 90), 3),
            "p99": round(percentile(values, 99), 3), "max": round(max(values), 3),
            "n": len(values)}


# -- the fan-out front, in a process of its own ----------------------------------------------
def _front_classes() -> tuple[type, type]:
    sys.path.insert(0, str(common.TESTS_DIR))
    from fanout_faults import FaultyFanOutFront

    from kinesis_dstream.fanout_front import Refused
    from kinesis_dstream.fanout_front.upstream import send_body

    class CountingFront(FaultyFanOutFront):
        """The tests' front (calls counted by operation and shard), its own refusals counted."""

        def __init__(self, upstream: str, **settings: Any) -> None:
            super().__init__(upstream, **settings)
            self.refusals: Counter[str] = Counter()

        def subscribe(self, handler: Any, body: bytes) -> None:
            send_error = handler.send_error_body

            def counted(code: str, message: str, status: int = 400) -> None:
                with self._fault_lock:
                    self.refusals[code] += 1
                send_error(code, message, status)

            handler.send_error_body = counted
            super().subscribe(handler, body)

    class ConsumersInFront(CountingFront):
        """For an emulator without a consumer API (kinesalite): Register, Describe, List and
        DeregisterStreamConsumer answered by the front from a table of its own, every
        consumer ACTIVE at once; everything else passes through."""

        OPERATIONS = ("RegisterStreamConsumer", "DescribeStreamConsumer",
                      "ListStreamConsumers", "DeregisterStreamConsumer")

        def __init__(self, upstream: str, **settings: Any) -> None:
            super().__init__(upstream, **settings)
            self.consumers: dict[str, dict[str, Any]] = {}  # ARN -> description

        def forward(self, operation: str, handler: Any, body: bytes) -> None:
            if operation not in self.OPERATIONS:
                super().forward(operation, handler, body)
                return
            call = json.loads(body or b"{}")
            with self._fault_lock:
                self.calls[(operation, "")] += 1
                status, answer = self._answer(operation, call)
            send_body(handler, status, [("Content-Type", "application/x-amz-json-1.1")],
                      json.dumps(answer).encode())

        def _find(self, call: dict[str, Any]) -> dict[str, Any] | None:
            if call.get("ConsumerARN"):
                return self.consumers.get(call["ConsumerARN"])
            return next((c for c in self.consumers.values()
                         if c["StreamARN"] == call.get("StreamARN")
                         and c["ConsumerName"] == call.get("ConsumerName")), None)

        def _answer(self, operation: str, call: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            found = self._find(call)
            missing = (400, {"__type": "ResourceNotFoundException", "message": "not found"})
            if operation == "RegisterStreamConsumer":
                if found:
                    return 400, {"__type": "ResourceInUseException", "message": "exists"}
                now = int(time.time())
                arn = f"{call['StreamARN']}/consumer/{call['ConsumerName']}:{now}"
                self.consumers[arn] = {"ConsumerName": call["ConsumerName"], "ConsumerARN": arn,
                                       "ConsumerStatus": "ACTIVE", "StreamARN": call["StreamARN"],
                                       "ConsumerCreationTimestamp": now}
                return 200, {"Consumer": {k: v for k, v in self.consumers[arn].items()
                                          if k != "StreamARN"}}
            if operation == "DescribeStreamConsumer":
                return (200, {"ConsumerDescription": found}) if found else missing
            if operation == "DeregisterStreamConsumer":
                if not found:
                    return missing
                del self.consumers[found["ConsumerARN"]]
                return 200, {}
            return 200, {"Consumers": [c for c in self.consumers.values()
                                       if c["StreamARN"] == call.get("StreamARN")]}

        def _describe_consumer(self, consumer_arn: str, auth: dict[str, str]) -> dict[str, Any]:
            with self._fault_lock:
                found = self.consumers.get(consumer_arn)
            if found is None:
                raise Refused("ResourceNotFoundException", f"Consumer {consumer_arn} not found.")
            return found

    return CountingFront, ConsumersInFront


def _serve_front(upstream: str, consumers_in_front: bool, settings: dict[str, Any],
                 conn: Any) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    counting, in_front = _front_classes()
    front = (in_front if consumers_in_front else counting)(upstream, **settings).start()
    conn.send(front.endpoint)
    while True:
        command = conn.recv()
        if command == "calls":
            with front._fault_lock:
                conn.send({"calls": Counter(front.calls), "refusals": dict(front.refusals),
                           "upstream_calls": dict(front.upstream_calls),
                           "open": len(front.subscriptions())})
        else:
            front.stop()
            conn.send("stopped")
            return


class FrontProcess(common.ServedProcess):
    """The fan-out front in a child process; ``calls()`` its counts, ``pid`` for its CPU."""

    def __init__(self, upstream: str, consumers_in_front: bool = False, **settings: Any) -> None:
        super().__init__(_serve_front, upstream, consumers_in_front, settings)

    def calls(self) -> dict[str, Any]:
        return self.ask("calls")

    def counts(self) -> Counter:
        """(operation, shard) -> calls: what bench_wide's counting proxy gives."""
        return self.calls()["calls"]


def by_operation(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    counted: Counter[str] = Counter()
    for (operation, _), n in (after["calls"] - before["calls"]).items():
        counted[operation] += n
    return dict(sorted(counted.items()))


# -- the limits proxy, with the other applications' reads apart from ours ----------------------
def _serve_limits(upstream: str, stream: str, others: int, conn: Any) -> None:
    sys.path.insert(0, str(common.TESTS_DIR))
    from fault_proxy import FaultProxy, ShardLimits

    shared = ShardLimits()

    class Apart:
        """One reader's view of the shared limits: its refusals counted apart."""

        def __init__(self) -> None:
            self.refused: Counter[str] = Counter()

        def admit(self, operation: str, shard: str) -> bool:
            ok = shared.admit(operation, shard)
            if not ok:
                self.refused[operation] += 1
            return ok

        def charge(self, shard: str, data_bytes: int) -> None:
            shared.charge(shard, data_bytes)

    ours, theirs = Apart(), Apart()
    ours_proxy = FaultProxy(upstream, share=0.0, limits=ours, max_lifetime_s=3600).start()
    their_proxy = FaultProxy(upstream, share=0.0, limits=theirs, max_lifetime_s=3600).start()
    stop = threading.Event()
    reads: Counter[str] = Counter()
    if stream:
        for i in range(others):
            threading.Thread(target=_other_application, daemon=True,
                             args=(their_proxy.endpoint, stream, stop, reads, i)).start()
    conn.send(ours_proxy.endpoint)
    while True:
        command = conn.recv()
        if command == "stats":
            conn.send({"ours": dict(ours.refused), "others": dict(theirs.refused),
                       "others_served": dict(reads)})
        else:
            stop.set()
            ours_proxy.stop()
            their_proxy.stop()
            conn.send("stopped")
            return


def _other_application(endpoint: str, stream: str, stop: threading.Event, reads: Counter,
                       number: int) -> None:
    """A KCL-style polling application: one GetRecords a second per shard, from LATEST;
    a refusal is waited out the same second; botocore's own retries off."""
    import boto3
    from botocore.config import Config

    from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY

    h = common.helpers()
    kinesis = boto3.client("kinesis", endpoint_url=endpoint, region_name=DUMMY_REGION,
                           aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                           aws_secret_access_key=DUMMY_SECRET_ACCESS_KEY,
                           config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))
    shard = h.list_shard_ids(endpoint, stream)[0]
    iterator = None
    time.sleep(number * 0.25)  # the applications did not start in the same instant
    while not stop.is_set():
        began = time.monotonic()
        try:
            if iterator is None:
                iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard,
                                                      ShardIteratorType="LATEST")["ShardIterator"]
            iterator = kinesis.get_records(ShardIterator=iterator, Limit=10_000)[
                "NextShardIterator"]
            reads["GetRecords"] += 1
        except kinesis.exceptions.ProvisionedThroughputExceededException:
            pass
        except Exception:  # noqa: BLE001 - the proxy stopping under it
            if stop.is_set():
                return
        stop.wait(max(0.0, began + 1.0 - time.monotonic()))


class LimitsProxy(common.ServedProcess):
    """tests/fault_proxy.py in limits mode, in a child process, for our reader (``endpoint``),
    with ``others`` polling applications reading ``stream`` through the same shared limits."""

    def __init__(self, upstream: str, stream: str = "", others: int = 0) -> None:
        super().__init__(_serve_limits, upstream, stream, others)

    def stats(self) -> dict[str, Any]:
        return self.ask("stats")


def minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


# -- the worker in this process ----------------------------------------------------------------
class Stamped:
    """Record processors that note put -> processed of records stamped ``<epoch>,<index>``,
    each index once, and the bytes they carried."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.seen: set[int] = set()
        self.delivered = 0
        self.bytes = 0
        self.first: float | None = None
        self.last: float | None = None

    def factory(self) -> Any:
        from kinesis_dstream.worker.processor import RecordProcessor

        owner = self

        class Processor(RecordProcessor):
            def process_records(self, process_records_input: Any) -> None:
                records = process_records_input.records
                if not records:
                    return
                now = time.time()
                with owner.lock:
                    owner.first = owner.first or now
                    owner.last = now
                    for record in records:
                        data = record.binary_data
                        owner.delivered += 1
                        owner.bytes += len(data)
                        stamp, _, rest = data.partition(b",")
                        index = int(rest.split(b"x", 1)[0])
                        if index not in owner.seen:
                            owner.seen.add(index)
                            if stamp != b"0":
                                owner.latencies.append(now - float(stamp))
                last = records[-1]
                process_records_input.checkpointer.checkpoint(last.sequence_number,
                                                              last.sub_sequence_number)

        return lambda shard_id: Processor()


def worker_ready(scheduler: Any, shards: int, fanout: bool) -> bool:
    metrics = scheduler.metrics()
    held = [m for m in metrics.values() if m.owner]
    return len(held) == shards and (not fanout or all(m.subscriptions for m in held))


def run_worker(kinesis: str, put_endpoint: str, dynamodb: str, stream: str, shards: int,
               fanout: bool, rate: int, duration_s: float) -> dict[str, Any]:
    """A Scheduler reading ``stream`` while ``rate`` records/s are put for ``duration_s``."""
    from kinesis_dstream.worker.scheduler import Scheduler

    h = common.helpers()
    app = h.unique_name("bench-fanout")
    extra = {"retrieval_mode": "FANOUT"} if fanout else {}
    config = common.consumer_config(app, stream, kinesis, dynamodb, initial_position="LATEST",
                                    **extra)
    stamped = Stamped()
    scheduler = Scheduler(config, stamped.factory())
    scheduler.start()
    try:
        if not common.wait_for(lambda: worker_ready(scheduler, shards, fanout), 90, 0.2):
            raise RuntimeError(f"worker not reading every shard: {scheduler.metrics()}")
        time.sleep(2.0)  # LATEST iterators / subscriptions in place before the first put
        producer = common.Producer(put_endpoint, stream, rate, duration_s)
        producer.start()
        producer.join()
        if producer.error is not None:
            raise producer.error
        common.wait_for(lambda: len(stamped.seen) >= producer.sent, 30, 0.1)
        metrics = scheduler.metrics()
    finally:
        scheduler.shutdown(timeout_s=10)
        common.delete_table(dynamodb, app)
    return {"records_put": producer.sent, "records_seen": len(stamped.seen),
            "records_delivered": stamped.delivered,
            "exactly_once": stamped.delivered == len(stamped.seen) == producer.sent,
            "latency_s": latency_stats(stamped.latencies),
            "subscriptions": sum(m.subscriptions for m in metrics.values())}


# -- part 1: latency ----------------------------------------------------------------------------
def part_latency(args: argparse.Namespace) -> dict[str, Any]:
    import spark_common as sc_common

    h = common.helpers()
    result: dict[str, Any] = {"benchmark": "bench_fanout latency: put -> processed",
                              "setup": {"stream": "kinesis-local, 4 shards, puts through the "
                                                  "front", "rate_rec_s": args.rate,
                                        "duration_s": args.duration,
                                        "polling": "reads kinesis-local directly, KCL defaults "
                                                   "(idleTimeBetweenReads 1 s; DStream 0.2 s)",
                                        "fanout": "reads through the front"}}
    with common.running_emulators("kinesis-local", "moto") as emu, \
            FrontProcess(emu["kinesis-local"].endpoint) as front:
        kinesis, dynamodb = emu["kinesis-local"].endpoint, emu["moto"].endpoint
        worker = {}
        for mode in ("polling", "fanout"):
            common.progress(f"latency: worker, {mode}")
            stream = h.unique_name("bench-fanout-lat")
            h.create_stream(kinesis, stream, 4)
            before = front.calls()
            worker[mode] = run_worker(front.endpoint if mode == "fanout" else kinesis,
                                      front.endpoint, dynamodb, stream, 4, mode == "fanout",
                                      args.rate, args.duration)
            worker[mode]["front_calls"] = by_operation(before, front.calls())
        result["worker"] = worker
        sc = sc_common.spark_context(sc_common.CLUSTER)
        try:
            sc_common.warm_up(sc)
            result["dstream"] = {}
            for mode in ("polling", "fanout"):
                common.progress(f"latency: DStream, {mode}")
                before = front.calls()
                result["dstream"][mode] = dstream_latency(sc, kinesis, front.endpoint, dynamodb,
                                                          mode == "fanout", args)
                result["dstream"][mode]["front_calls"] = by_operation(before, front.calls())
        finally:
            sc.stop()
    w, d = result["worker"], result["dstream"]
    result["goals"] = {"worker_fanout_p50_s": GOALS["worker_fanout_p50_s"],
                       "dstream_fanout_p50": "below polling's"}
    result["meets_goal"] = {
        "worker": (w["fanout"]["latency_s"].get("p50") or 99) <= GOALS["worker_fanout_p50_s"],
        "dstream": (d["fanout"]["latency_s"].get("p50") or 99)
        < (d["polling"]["latency_s"].get("p50") or 0)}
    return result


def dstream_latency(sc: Any, kinesis: str, front: str, dynamodb: str, fanout: bool,
                    args: argparse.Namespace) -> dict[str, Any]:
    import spark_common as sc_common

    from kinesis_dstream import KinesisUtils

    h = common.helpers()
    stream, app = h.unique_name("bench-fanout-dlat"), h.unique_name("bench-fanout-dlat")
    h.create_stream(kinesis, stream, 4)
    latencies: list[float] = []
    seen: set[int] = set()
    delivered = [0]
    lock = threading.Lock()

    def measure(batch_time: Any, rdd: Any) -> None:
        rows = rdd.collect()
        now = time.time()
        with lock:
            delivered[0] += len(rows)
            for row in rows:
                stamp, index = row.split(",", 2)[:2]
                index = int(index.rstrip("x"))
                if index not in seen:
                    seen.add(index)
                    latencies.append(now - float(stamp))

    ssc = sc_common.streaming_context(sc)
    overrides = {"configOverrides": {"retrieval_mode": "FANOUT"}} if fanout else {}
    sc_common.create_stream(ssc, app, stream, front if fanout else kinesis, dynamodb,
                            **overrides).foreachRDD(measure)
    ssc.start()
    try:
        if not sc_common.wait_for(lambda: len([m for m in KinesisUtils.metrics(stream).values()
                                               if m["owner"]]) == 4, 90, 0.2):
            raise RuntimeError(f"shards not all leased: {KinesisUtils.metrics(stream)}")
        time.sleep(5.0)  # a few batches: the executors' reads (and subscriptions) in place
        producer = common.Producer(front, stream, args.rate, args.duration)
        producer.start()
        producer.join()
        if producer.error is not None:
            raise producer.error
        sc_common.wait_for(lambda: len(seen) >= producer.sent, 30, 0.1)
    finally:
        sc_common.stop_streaming(ssc)
        common.delete_table(dynamodb, app)
        common.delete_table(dynamodb, f"{app}-kinesis-dstream-ranges")
    return {"records_put": producer.sent, "records_seen": len(seen),
            "exactly_once": delivered[0] == len(seen) == producer.sent,
            "latency_s": latency_stats(latencies),
            "spark": f"{sc_common.CLUSTER}, 1 s batches, TRIM_HORIZON on an empty stream"}


# -- part 2: four other polling applications ---------------------------------------------------
def part_throttle(args: argparse.Namespace) -> dict[str, Any]:
    h = common.helpers()
    result: dict[str, Any] = {
        "benchmark": "bench_fanout throttle: a shard also polled by four other applications",
        "setup": {"stream": "kinesis-local, 1 shard, puts through the front",
                  "rate_rec_s": args.rate, "duration_s": args.duration,
                  "others": "4 KCL-style loops, 1 GetRecords/s each from LATEST, through the "
                            "limits proxy (5 GetRecords/s and 2 MiB/s per shard, shared)",
                  "polling": "the worker through the same limits (idleTimeBetweenReads 1 s)",
                  "fanout": "the worker through the front (its subscription is not subject "
                            "to the shared 5 reads/s)"}}
    with common.running_emulators("kinesis-local", "moto") as emu, \
            FrontProcess(emu["kinesis-local"].endpoint) as front:
        kinesis, dynamodb = emu["kinesis-local"].endpoint, emu["moto"].endpoint
        for mode in ("polling", "fanout"):
            stream = h.unique_name("bench-fanout-thr")
            h.create_stream(kinesis, stream, 1)
            common.progress(f"throttle: {mode}")
            with LimitsProxy(kinesis, stream, others=4) as limits:
                time.sleep(2.0)  # the others polling
                before, calls0 = limits.stats(), front.calls()
                run = run_worker(front.endpoint if mode == "fanout" else limits.endpoint,
                                 front.endpoint, dynamodb, stream, 1, mode == "fanout",
                                 args.rate, args.duration)
                after, calls1 = limits.stats(), front.calls()
            run["refusals"] = {
                "worker_polling_refused": minus(after["ours"], before["ours"]),
                "other_applications_refused": minus(after["others"], before["others"]),
                "other_applications_served": minus(after["others_served"],
                                                   before["others_served"]),
                "subscribe_to_shard_refused": minus(calls1["refusals"], calls0["refusals"])}
            run["front_calls"] = by_operation(calls0, calls1)
            result[mode] = run
    return result


# -- part 3: drain at the per-consumer 2 MiB/s ---------------------------------------------------
def part_drain(args: argparse.Namespace) -> dict[str, Any]:
    from kinesis_dstream.worker.scheduler import Scheduler

    h = common.helpers()
    shards = args.drain_shards
    records = int(args.drain_mb * 1_000_000 / 1000)
    result: dict[str, Any] = {
        "benchmark": "bench_fanout drain at 2 MiB/s per shard",
        "setup": {"stream": f"kinesalite, {shards} shards", "backlog_mb": args.drain_mb,
                  "records": records, "record_bytes": 1000,
                  "fanout": "the worker through the front (2 MiB/s per consumer and shard)",
                  "polling": "the worker through the limits proxy (5 GetRecords/s and "
                             "2 MiB/s per shard; KCL defaults: 10,000 records a call, 1 s "
                             "between reads)"}}
    # kinesalite (the front keeping the consumers): kinesis-local takes minutes to be put a
    # 30 MB backlog on a loaded machine
    with common.running_emulators("kinesalite", "moto") as emu, \
            FrontProcess(emu["kinesalite"].endpoint, consumers_in_front=True) as front, \
            LimitsProxy(emu["kinesalite"].endpoint) as limits:
        kinesis, dynamodb = emu["kinesalite"].endpoint, emu["moto"].endpoint
        stream = h.unique_name("bench-fanout-drain")
        h.create_stream(kinesis, stream, shards)
        for start in range(0, records, 10_000):
            h.put_records(kinesis, stream, [
                (f"pk{i}", f"0,{i}".ljust(1000, "x"))
                for i in range(start, min(records, start + 10_000))])
            common.progress(f"drain: put {min(records, start + 10_000)} of {records}")
        for mode in ("fanout", "polling"):
            common.progress(f"drain: {mode}")
            app = h.unique_name("bench-fanout-drain")
            extra = {"retrieval_mode": "FANOUT"} if mode == "fanout" else {}
            config = common.consumer_config(
                app, stream, front.endpoint if mode == "fanout" else limits.endpoint,
                dynamodb, **extra)
            stamped = Stamped()
            before, calls0 = limits.stats(), front.calls()
            cpu0 = {"worker_s": common.self_cpu_seconds(),
                    "front_s": common.process_cpu_seconds(front.pid),
                    "limits_proxy_s": common.process_cpu_seconds(limits.pid),
                    "kinesalite_s": common.process_cpu_seconds(emu["kinesalite"].pid)}
            scheduler = Scheduler(config, stamped.factory())
            started = time.time()
            scheduler.start()
            try:
                done = common.wait_for(lambda: len(stamped.seen) >= records,  # noqa: B023 - this iteration's
                                args.drain_timeout, 0.1)
                cpu = {"worker_s": common.self_cpu_seconds(),
                       "front_s": common.process_cpu_seconds(front.pid),
                       "limits_proxy_s": common.process_cpu_seconds(limits.pid),
                       "kinesalite_s": common.process_cpu_seconds(emu["kinesalite"].pid)}
                wall = time.time() - started
            finally:
                scheduler.shutdown(timeout_s=10)
                common.delete_table(dynamodb, app)
            steady = (stamped.last or started) - (stamped.first or started)
            per_shard = stamped.bytes / MiB / shards / steady if steady > 0 else 0.0
            result[mode] = {
                "records": len(stamped.seen), "exactly_once": done and stamped.delivered
                == len(stamped.seen) == records,
                "first_record_s": round((stamped.first or started) - started, 2),
                "first_to_last_s": round(steady, 2),
                "mib_s_per_shard": round(per_shard, 3), "of_2_mib_s": round(per_shard / 2, 3),
                "polling_refused": minus(limits.stats()["ours"], before["ours"]),
                "subscribe_to_shard_refused": minus(front.calls()["refusals"],
                                                    calls0["refusals"]),
                "front_calls": by_operation(calls0, front.calls()),
                "cpu_s_while_draining": {k: round(v - cpu0[k], 2) for k, v in cpu.items()},
                "wall_s": round(wall, 2)}
    result["goal_of_limit"] = GOALS["drain_of_limit"]
    result["meets_goal"] = result["fanout"]["of_2_mib_s"] >= GOALS["drain_of_limit"]
    return result


# -- part 4: idle shards -------------------------------------------------------------------------
def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def part_idle(args: argparse.Namespace) -> dict[str, Any]:
    h = common.helpers()
    sizes = sorted(set(args.idle_shards))
    result: dict[str, Any] = {
        "benchmark": "bench_fanout idle shards: a worker process's CPU and memory",
        "setup": {"stream": "kinesis-local, nothing put", "shards": sizes,
                  "measured_s": args.idle_s,
                  "worker": "python -m kinesis_dstream worker, TRIM_HORIZON, KCL defaults; "
                            "both modes through the front (polling passes through it)",
                  "front": "heartbeat every 5 s on an idle subscription (kinesis-dstream "
                           "local's default)"}}
    workdir = Path(tempfile.mkdtemp(prefix="bench-fanout-idle-"))
    with common.running_emulators("kinesis-local", "moto") as emu, \
            FrontProcess(emu["kinesis-local"].endpoint) as front:
        kinesis, dynamodb = emu["kinesis-local"].endpoint, emu["moto"].endpoint
        env = common.aws_env()
        for mode in ("polling", "fanout"):
            rows = []
            for shards in sizes:
                common.progress(f"idle: {mode}, {shards} shards")
                stream = h.unique_name("bench-fanout-idle")
                h.create_stream(kinesis, stream, shards)
                app = h.unique_name("bench-fanout-idle")
                extra = {"retrieval_mode": "FANOUT"} if mode == "fanout" else {}
                config = common.consumer_config(app, stream, front.endpoint, dynamodb, **extra)
                proc = common.spawn_worker(config, "common:counting_factory",
                                           {"out_dir": str(workdir), "expected": {}}, workdir,
                                           env, f"{mode}-{shards}")
                operation = "SubscribeToShard" if mode == "fanout" else "GetRecords"
                try:
                    def reading(operation: str = operation, shards: int = shards) -> bool:
                        counted = front.counts()
                        return len({s for (op, s), n in counted.items()
                                    if op == operation and n}) >= shards

                    if not common.wait_for(lambda p=proc: reading() or p.poll() is not None, 120, 0.5) \
                            or proc.poll() is not None:
                        raise RuntimeError(f"worker not reading {shards} shards ({mode}); "
                                           f"see {workdir}")
                    time.sleep(5.0)
                    cpu0, calls0 = common.process_cpu_seconds(proc.pid), front.calls()
                    time.sleep(args.idle_s)
                    cpu = common.process_cpu_seconds(proc.pid) - cpu0
                    calls1, rss = front.calls(), rss_mb(proc.pid)
                finally:
                    common.stop_process(proc)
                    common.delete_table(dynamodb, app)
                minutes = args.idle_s / 60
                rows.append({"shards": shards, "cpu_s_per_min": round(cpu / minutes, 3),
                             "cpu_s_per_shard_per_min": round(cpu / minutes / shards, 4),
                             "rss_mb": rss, "rss_mb_per_shard": round(rss / shards, 2)
                             if rss else None,
                             "calls_per_shard_per_min": {
                                 op: round(n / shards / minutes, 1)
                                 for op, n in by_operation(calls0, calls1).items()}})
            marginal = None
            if len(rows) > 1:
                small, big = rows[0], rows[-1]
                added = big["shards"] - small["shards"]
                marginal = {
                    "cpu_s_per_added_shard_per_min": round(
                        (big["cpu_s_per_min"] - small["cpu_s_per_min"]) / added, 4),
                    "rss_mb_per_added_shard": round((big["rss_mb"] - small["rss_mb"]) / added, 3)
                    if big["rss_mb"] and small["rss_mb"] else None}
            result[mode] = {"runs": rows, "one_more_idle_shard": marginal}
    return result


# -- part 5: a wide stream -------------------------------------------------------------------
def part_wide(args: argparse.Namespace) -> dict[str, Any]:
    import bench_wide
    import counting_proxy
    import spark_common as sc_common

    h = common.helpers()
    wide_args = argparse.Namespace(busy=args.wide_busy, rate=1000, duration=args.wide_s,
                                   settle=10.0, shards_per_task=None, timeout=240.0,
                                   producer_grace_s=300.0,
                                   current_shards=args.wide_shards)
    result: dict[str, Any] = {
        "benchmark": f"bench_fanout wide: {args.wide_shards} shards, {args.wide_busy} busy at "
                     "1,000 rec/s, DStream",
        "setup": {"spark": f"{sc_common.CLUSTER}, 1 s batches, createStream TRIM_HORIZON, "
                           "foreachRDD(rdd.count())",
                  "polling": "kinesalite behind bench_wide's counting proxy; the producer "
                             "puts straight into kinesalite",
                  "fanout": "spark.streaming.kinesis.consumerType = SubscribeToShard; the "
                            "front in front of kinesalite (consumers kept in the front), "
                            "counting every call; " + (
                                "the producer puts straight into kinesalite (the front polls "
                                "a busy shard every 0.1 s)" if args.wide_put_upstream else
                                "the producer puts through the front, which pushes a put at "
                                "once, as Kinesis does"),
                  "front_idle_poll_s": args.wide_idle_poll_s,
                  "front_wake_only": not args.wide_put_upstream,
                  "dynamodb": args.wide_dynamodb,
                  "spark_conf": dict(pair.split("=", 1) for pair in args.wide_spark_conf),
                  "settle_s": wide_args.settle, "measured_s": wide_args.duration}}
    for mode in args.wide_modes:
        common.progress(f"wide: {mode}")
        settings = {"spark.streaming.kinesis.consumerType": "SubscribeToShard"} \
            if mode == "fanout" else {}
        if args.wide_shards_per_task:
            settings["spark.streaming.kinesis.shardsPerTask"] = str(args.wide_shards_per_task)
        settings.update(pair.split("=", 1) for pair in args.wide_spark_conf)
        load = os.getloadavg()
        sc = sc_common.spark_context(sc_common.CLUSTER, settings)
        try:
            sc_common.warm_up(sc)
            with common.running_emulators("kinesalite", args.wide_dynamodb) as emu, \
                    counting_proxy.CountingProxy(emu[args.wide_dynamodb].endpoint,
                                                 split_renewals=True) as dproxy:
                stream = h.unique_name("bench-fanout-wide")
                h.create_stream(emu["kinesalite"].endpoint, stream, args.wide_shards)
                busy_ids, busy_keys = bench_wide.busy_hash_keys(emu["kinesalite"].endpoint,
                                                                stream, args.wide_busy)
                if mode == "polling":
                    with counting_proxy.CountingProxy(emu["kinesalite"].endpoint) as kproxy:
                        run = bench_wide.run_dstream(sc, emu, kproxy, dproxy, stream,
                                                     args.wide_shards, busy_keys, wide_args)
                else:
                    # The front emulates pushing by polling kinesalite for each open
                    # subscription. Kinesis pushes without that cost, which on 2 cores
                    # competes with ours: the producer puts through the front, which wakes a
                    # shard's subscriptions at each put and reads a shard only then
                    # (wake_only: an idle shard's heartbeats need no GetRecords).
                    # --wide-put-upstream puts straight into kinesalite instead, and the
                    # front finds records by polling (an idle shard every --wide-idle-poll-s).
                    with FrontProcess(emu["kinesalite"].endpoint, consumers_in_front=True,
                                      idle_poll_interval_s=args.wide_idle_poll_s,
                                      wake_only=not args.wide_put_upstream) as front:
                        with_front = dict(emu, front=types.SimpleNamespace(pid=front.pid))
                        fan_args = argparse.Namespace(**vars(wide_args), put_endpoint=None
                                                      if args.wide_put_upstream
                                                      else front.endpoint)
                        run = bench_wide.run_dstream(sc, with_front, front, dproxy, stream,
                                                     args.wide_shards, busy_keys, fan_args)
                        run["front"] = {k: v for k, v in front.calls().items()
                                        if k in ("refusals", "upstream_calls", "open")}
        finally:
            sc.stop()
        run["machine"] = common.machine(load)
        result[mode] = run
        common.emit({"benchmark": f"{result['benchmark']}, {mode} (printed as it ends)",
                     mode: run})
    result["goals"] = {"batch_processing_median_s": GOALS["wide_batch_median_s"],
                       "lag_s": GOALS["wide_lag_s"]}
    fan = result.get("fanout")
    if fan:
        result["meets_goal"] = {
            "batch_processing_median": (fan["batch_processing_s"].get("median") or 99)
            <= GOALS["wide_batch_median_s"],
            "lag": fan["lag_at_end_s"] is not None
            and fan["lag_at_end_s"] <= GOALS["wide_lag_s"]}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("parts", nargs="*", help=f"any of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--rate", type=int, default=200, help="latency / throttle: records/s")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="latency / throttle: seconds of producing per variant")
    parser.add_argument("--drain-mb", type=float, default=30.0, help="drain: backlog, MB")
    parser.add_argument("--drain-shards", type=int, default=1)
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument("--idle-shards", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--wide-shards", type=int, default=200)
    parser.add_argument("--wide-busy", type=int, default=8)
    parser.add_argument("--wide-s", type=float, default=40.0)
    parser.add_argument("--wide-idle-poll-s", type=float, default=5.0,
                        help="wide, with --wide-put-upstream: the front's longest poll of an "
                             "idle subscription's shard")
    parser.add_argument("--wide-shards-per-task", type=int, default=None,
                        help="wide: spark.streaming.kinesis.shardsPerTask (default: ours, 32)")
    parser.add_argument("--wide-dynamodb", choices=("moto", "dynalite"), default="dynalite",
                        help="wide: the DynamoDB emulator of the lease and range tables (moto "
                             "spends about 13 ms of CPU a call, dynalite about 1.5)")
    parser.add_argument("--wide-put-upstream", action="store_true",
                        help="wide: the producer puts straight into kinesalite, not through "
                             "the front")
    parser.add_argument("--wide-spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="wide: a Spark setting for both modes, for example "
                             "spark.python.unix.domain.socket.enabled=true (Spark 4.1+: no "
                             "40 ms TCP stall at the start of each Python task)")
    parser.add_argument("--wide-modes", nargs="+", choices=("polling", "fanout"),
                        default=["polling", "fanout"])
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s): {', '.join(unknown)}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import spark_common as sc_common

    sc_common.use_dummy_aws_env()
    for part in args.parts or PARTS:
        load = os.getloadavg()
        started = time.monotonic()
        result = globals()[f"part_{part}"](args)
        result["benchmark_wall_s"] = round(time.monotonic() - started, 1)
        result["machine"] = common.machine(load)
        common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
