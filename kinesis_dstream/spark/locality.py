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
to the executor with the fewest. Shards are placed before anyone knows which are busy, so
a few busy shards may land on one executor, whose task then makes every batch wait: once
the records read show it, one busy shard at a time moves to the least loaded executor
(``ShardPlacement.balance``), at most every ``MOVE_EVERY_S``, only a shard placed that long
ago (its subscription is as old: one younger than 5 s cannot be taken over) and only for a
clear gain. The moved shard's task subscribes in its new process, taking the subscription
over (a refused subscribe is tried again the next batch, the shard's records waiting
meanwhile, never lost).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Sequence

from ..retrieval import ShardRange, group_shards
from .jvm import jvm

log = logging.getLogger(__name__)

Executor = tuple[str, str]  # (executor id, host)
PYTHON_UTILS = "org.apache.spark.api.python.PythonUtils"

# At most one shard moves between executors this often: a move costs its shard a new
# subscription, and the records-read weights it follows change from batch to batch.
MOVE_EVERY_S = 10.0
# A move must lower the heaviest executor's load by this share at least.
MOVE_MIN_GAIN = 0.15
# Batches a moved shard's task keeps subscribing in its new process before the move is
# given up (its tasks then ask the old process, as for any shard read elsewhere).
MOVE_TRIES = 15
# A shard no batch planned for this long is forgotten (its lease went to another driver, or
# it was read to its end): it no longer counts in an executor's load, and a move of it ends.
FORGET_AFTER_S = 60.0


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

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.executor_of: dict[str, Executor] = {}
        self._clock = clock
        # when each shard was placed where it is: its subscription there is about as old,
        # and one younger than 5 s cannot be taken over (the move would stall the shard)
        self._placed_at: dict[str, float] = {}
        self._moved_at: float | None = None
        # moved shard -> (the subscriber that held it before the move, batches tried)
        self.moving: dict[str, tuple[str | None, int]] = {}
        self._planned_at: dict[str, float] = {}  # the last batch each placed shard was in

    def place(self, shard_ids: Sequence[str], executors: Sequence[Executor]) -> dict[str, Executor]:
        now = self._clock()
        self._planned_at.update((s, now) for s in shard_ids)
        for shard_id, planned_at in list(self._planned_at.items()):
            if now - planned_at >= FORGET_AFTER_S:
                self._forget(shard_id)
        live = set(executors)
        for shard_id, executor in list(self.executor_of.items()):
            if executor not in live:
                del self.executor_of[shard_id]
                self._placed_at.pop(shard_id, None)
                log.info("shard %s: executor %s is gone; its tasks go elsewhere", shard_id,
                         executor[0])
        load = {e: 0 for e in executors}
        for executor in self.executor_of.values():
            load[executor] += 1
        for shard_id in sorted(shard_ids):
            if shard_id not in self.executor_of:
                executor = min(executors, key=lambda e: (load[e], e))
                self.executor_of[shard_id] = executor
                self._placed_at[shard_id] = now
                load[executor] += 1
        return {s: self.executor_of[s] for s in shard_ids}

    def _forget(self, shard_id: str) -> None:
        for held in (self.executor_of, self._placed_at, self.moving, self._planned_at):
            held.pop(shard_id, None)

    def balance(self, weights: Mapping[str, float], executors: Sequence[Executor],
                subscribers: Mapping[str, str | None]) -> str | None:
        """Move one shard from the executor reading the most records to the one reading
        the fewest, if that lowers the most by ``MOVE_MIN_GAIN`` at least; the shard moved.
        ``weights``: what each placed shard read last batch; ``subscribers``: the process
        holding each one's subscription now (the move is done once that changes)."""
        now = self._clock()
        if self._moved_at is None:  # the first batches' weights are the start's, not the load's
            self._moved_at = now
        if now - self._moved_at < MOVE_EVERY_S:
            return None
        live = list(executors)
        if len(live) < 2:
            return None
        load = {e: 0.0 for e in live}
        for shard_id, executor in self.executor_of.items():
            if executor in load:
                load[executor] += weights.get(shard_id, 0.0)
        heavy = max(live, key=lambda e: (load[e], e))
        light = min(live, key=lambda e: (load[e], e))
        gap = load[heavy] - load[light]
        settled = now - MOVE_EVERY_S
        movable = [(abs(gap / 2 - weights.get(s, 0.0)), s) for s, e in self.executor_of.items()
                   if e == heavy and 0 < weights.get(s, 0.0) < gap and s not in self.moving
                   and self._placed_at.get(s, float("-inf")) <= settled]
        if not movable:
            return None
        shard_id = min(movable)[1]
        weight = weights[shard_id]
        others = [load[e] for e in live if e not in (heavy, light)]
        if max([load[heavy] - weight, load[light] + weight, *others]) > \
                (1 - MOVE_MIN_GAIN) * load[heavy]:
            return None
        self.executor_of[shard_id] = light
        self._placed_at[shard_id] = now
        self.moving[shard_id] = (subscribers.get(shard_id), 0)
        self._moved_at = now
        log.info("shard %s moves from executor %s to %s (records read last batch: %.0f "
                 "there, %.0f here; the shard's %.0f)", shard_id, heavy[0], light[0],
                 load[heavy], load[light], weight)
        return shard_id

    def subscribe_anew(self, shard_id: str, subscriber: str | None) -> bool:
        """Should the moved shard's task subscribe in its own process (its subscription is
        still where it was before the move)? Counts the try; False once moved or given up."""
        moving = self.moving.get(shard_id)
        if moving is None:
            return False
        before, tries = moving
        if subscriber != before or tries >= MOVE_TRIES:
            del self.moving[shard_id]
            if subscriber == before:
                log.warning("shard %s: its subscription did not move in %d batches; its new "
                            "executor's tasks ask the old one", shard_id, tries)
            return False
        self.moving[shard_id] = (before, tries + 1)
        return True


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

    serializer = CPickleSerializer()
    array_list, to_seq = jvm(sc, "java.util.ArrayList"), jvm(sc, PYTHON_UTILS + ".toSeq")
    located: dict[Executor, Any] = {}
    for executor_id, host in {executor for _, executor in tasks}:
        names = array_list()
        names.add(f"executor_{host}_{executor_id}")
        located[(executor_id, host)] = to_seq(names)
    pairs = array_list()
    pair = jvm(sc, "scala.Tuple2")
    for element, executor in tasks:
        pairs.add(pair(bytearray(serializer.dumps(element)), located[executor]))
    tag = jvm(sc, "scala.reflect.ClassTag.apply")(jvm(sc, "java.lang.Object")().getClass())
    jrdd = sc._jsc.sc().makeRDD(to_seq(pairs), tag)
    return RDD(jrdd.toJavaRDD(), sc, serializer)
