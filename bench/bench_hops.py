"""Benchmark: cross-module calls on the DStream path's driver side, per batch (issue 23).

``bench_hops.py [--shards N] [--verbose]`` prints one JSON document: the calls whose caller
and callee are in different ``kinesis_dstream`` modules (``sys.setprofile``), and the modules
they pass through, while one batch of one input stream is planned, read ahead, completed
and checkpointed. The driver's real objects run (coordinator, lease coordinator, checkpoint
policy, planner, read-ahead, the storageLevel gate, the UI report); only the AWS tables and
the SparkContext are fakes, driven as tests/test_coordinator_unit.py drives them, and the
read-ahead's tasks are stood in for by the fake (they run on executors). A first batch is
planned and completed unmeasured, so the figure is a steady batch's.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark import StorageLevel  # noqa: E402

from kinesis_dstream.aws.lease_table import Lease  # noqa: E402
from kinesis_dstream.aws.range_table import BatchRange  # noqa: E402
from kinesis_dstream.config import ConsumerConfig  # noqa: E402
from kinesis_dstream.records import ExtendedSequenceNumber as ESN  # noqa: E402
from kinesis_dstream.retrieval import ReadReport  # noqa: E402
from kinesis_dstream.spark.coordinator import ShardCoordinator  # noqa: E402
from kinesis_dstream.spark.planner import BatchPlanner, StreamSpec  # noqa: E402

PACKAGE = "kinesis_dstream"


class Table:
    """The lease table's checkpoint write (the only call a batch makes of it)."""

    def update_checkpoint(self, lease: Lease, position: ESN) -> Lease:
        return replace(lease, checkpoint=position, lease_counter=lease.lease_counter + 1)


class Ranges:
    def delete(self, ranges: Any) -> int:
        return len(list(ranges))


class SparkContext:
    """What the planner asks of a SparkContext; the read-ahead's ``count`` reports each
    planned range as read, as the tasks would through the accumulator."""

    defaultParallelism = 2

    def __init__(self) -> None:
        self.acc: Any = None
        self.position = 0

    def accumulator(self, value: Any, param: Any) -> Any:
        self.acc = type("Accumulator", (), {"value": value})()
        return self.acc

    def setLocalProperty(self, key: str, value: Any) -> None:  # noqa: N802 - Spark's name
        pass

    def emptyRDD(self) -> Any:  # noqa: N802
        return None

    def parallelize(self, groups: list, slices: int) -> Any:
        ranges = [r for group in groups for r in group]
        sc = self

        class JavaRdd:
            def count(self) -> int:
                sc.position += 1
                for r in ranges:
                    sc.acc.value[(r.stream_key, r.shard_id, r.batch_ms)] = ReadReport(
                        BatchRange(r.stream_key, r.shard_id, r.batch_ms, r.start or ESN("0"),
                                   end=ESN(str(sc.position)), records=1))
                return len(ranges)

        class Rdd:
            _jrdd = JavaRdd()
            _jrdd_deserializer = None  # the context's: spark.task.batch_values keeps it

            def mapPartitions(self, f: Any) -> "Rdd":  # noqa: N802
                return self

            def persist(self, level: Any) -> "Rdd":
                return self

        return Rdd()


def _module(frame: Any) -> str | None:
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name if name == PACKAGE or name.startswith(PACKAGE + ".") else None


def measure(shards: int) -> dict[str, Any]:
    config = ConsumerConfig(application_name="app", stream_name="s", region_name="us-east-1",
                            aws_access_key_id="AKIDEXAMPLE", aws_secret_key="secret",
                            checkpoint_interval_ms=0)
    coordinator = ShardCoordinator(config, kinesis=object(), lease_table=Table(),
                                   range_table=Ranges())
    coordinator.add_member("m1")
    for i in range(shards):
        lease = Lease(f"shardId-{i:012d}", lease_owner=config.worker_id, lease_counter=1)
        coordinator.leases._owned[lease.lease_key] = lease
        coordinator.leases._last_renewed[lease.lease_key] = coordinator.leases._clock()
        coordinator.periods.open(lease)
    planner = BatchPlanner(StreamSpec("m1", config.to_dict(),
                                      storage_level=StorageLevel.MEMORY_AND_DISK), coordinator)
    planner.attached = True
    sc = SparkContext()

    def batch(batch_ms: int) -> None:
        planner.batch_rdd(sc, batch_ms, list)
        planner.batch_completed(batch_ms, True, 10, 0, None)
        coordinator._write_checkpoints(force=False)  # the pass the completion wakes

    batch(1000)  # the first batch of a lease period starts at its floor: not measured
    hops: Counter[tuple[str, str]] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee, caller = _module(frame), _module(frame.f_back)
        if callee and caller and callee != caller:
            hops[(f"{caller}.{frame.f_back.f_code.co_name}",
                  f"{callee}.{frame.f_code.co_name}")] += 1

    sys.setprofile(profile)
    try:
        batch(2000)
    finally:
        sys.setprofile(None)
    modules = {m.rsplit(".", 1)[0] for pair in hops for m in pair}
    return dict(shards=shards, cross_module_calls=sum(hops.values()), modules=len(modules),
                edges={f"{a} -> {b}": n for (a, b), n in sorted(hops.items())})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1,
                        help="leases held by the driver (default 1: one record's path)")
    parser.add_argument("--verbose", action="store_true", help="every caller -> callee pair")
    args = parser.parse_args()
    result = measure(args.shards)
    if not args.verbose:
        result.pop("edges")
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
