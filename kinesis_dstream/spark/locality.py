"""Runs in the driver: a shard's tasks on one executor batch after batch (fan-out).

A shard's subscription is held by the Python worker of the executor that read its last
batch (``retrieval.subscriptions``); it is reused only if the next batch's task lands
there. PySpark's Python RDDs have no preferred locations, but Spark's scheduler follows a
narrow dependency to its parent's: the batch's partitions are made as a JVM
``ParallelCollectionRDD`` with locations (``SparkContext.makeRDD``, each element a group of
ranges pickled as PySpark would), which the tasks' ``mapPartitions`` then reads. A location
names the executor (``executor_<host>_<id>``, Spark's ``ExecutorCacheTaskLocation``), so the
scheduler waits ``spark.locality.wait`` for it before it sends the task elsewhere.

Shards keep their executor while it lives; new shards (and those of a lost executor) go
to the executor with the fewest.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from ..retrieval import ShardRange, group_shards

log = logging.getLogger(__name__)

Executor = tuple[str, str]  # (executor id, host)


def live_executors(sc: Any) -> list[Executor]:
    """The executors Spark knows now (not the driver), by id."""
    summaries = sc._jsc.sc().statusStore().executorList(True)
    found = []
    for index in range(summaries.size()):
        summary = summaries.apply(index)
        if summary.id() != "driver":
            found.append((summary.id(), summary.hostPort().rsplit(":", 1)[0]))
    return sorted(found)


class ShardPlacement:
    """Which executor reads each shard, kept across batches."""

    def __init__(self) -> None:
        self.executor_of: dict[str, Executor] = {}

    def place(self, shard_ids: Sequence[str], executors: Sequence[Executor]) -> dict[str, Executor]:
        live = set(executors)
        for shard_id, executor in list(self.executor_of.items()):
            if executor not in live:
                del self.executor_of[shard_id]
                log.info("shard %s: executor %s is gone; its tasks go elsewhere", shard_id,
                         executor[0])
        load = {e: 0 for e in executors}
        for executor in self.executor_of.values():
            load[executor] += 1
        for shard_id in sorted(shard_ids):
            if shard_id not in self.executor_of:
                executor = min(executors, key=lambda e: (load[e], e))
                self.executor_of[shard_id] = executor
                load[executor] += 1
        return {s: self.executor_of[s] for s in shard_ids}


def located_groups(ranges: Sequence[ShardRange], placement: dict[str, Executor],
                   shards_per_task: int, parallelism: int) -> list[tuple[tuple, Executor]]:
    """The batch's tasks, each of one executor's shards, with that executor."""
    executors = sorted(set(placement.values()))
    per_executor = max(1, parallelism // max(1, len(executors)))
    tasks = []
    for executor in executors:
        mine = [r for r in ranges if placement[r.shard_id] == executor]
        tasks += [(group, executor) for group in
                  group_shards(mine, shards_per_task, per_executor)]
    return tasks


def located_rdd(sc: Any, tasks: Sequence[tuple[Any, Executor]]) -> Any:
    """A Python RDD of one element per partition, each partition preferring its executor."""
    from pyspark import RDD
    from pyspark.serializers import CPickleSerializer

    jvm = sc._jvm
    serializer = CPickleSerializer()
    pairs = jvm.java.util.ArrayList()
    for element, (executor_id, host) in tasks:
        locations = jvm.java.util.ArrayList()
        locations.add(f"executor_{host}_{executor_id}")
        pairs.add(jvm.scala.Tuple2(bytearray(serializer.dumps(element)),
                                   jvm.PythonUtils.toSeq(locations)))
    tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Object().getClass())
    jrdd = sc._jsc.sc().makeRDD(jvm.PythonUtils.toSeq(pairs), tag)
    return RDD(jrdd.toJavaRDD(), sc, serializer)
