"""Shard groups: which shards a Spark task reads (planned in the driver), read concurrently.

A wide stream is mostly quiet shards. A task per shard and batch would make each of them
pay a task's fixed cost (scheduling, a Python worker round trip) every batch, so a wide idle
stream would take cores just to stand still. A task reads several shards, concurrently in
threads (a read mostly waits on the network), and the planner groups the shards so that an
idle wide stream needs few tasks while a backlog on a few shards still spreads over the
cores (the Databricks connector's ``shardsPerTask``, default 5, is the same idea).
"""
from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

from ..config import ConsumerConfig
from ..records import Record
from .model import ReadReport, ShardRange
from .shard_reader import Convert, read_shard_range

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
MAX_READ_THREADS = 64
# A shard that read nothing in its last batch (weight 0) costs its task little: one empty
# GetRecords, or by fan-out a look at its subscription's queue. It counts as this much of a
# shard against ``shards_per_task``, so a wide, mostly idle stream needs few tasks (each task
# costs Spark's scheduler and a Python worker round trip a batch).
IDLE_SHARD_SHARE = 0.25


def group_shards(ranges: Sequence[ShardRange], shards_per_task: int, parallelism: int,
                 ) -> list[tuple[ShardRange, ...]]:
    """The batch's tasks: at most ``shards_per_task`` shards each, an idle shard counting as
    ``IDLE_SHARD_SHARE`` of one, and at least as many tasks as there are cores
    (``parallelism``) while there are shards to spread. The heaviest shards (by their
    ``weight``: what they read last time) are dealt out first, one per task, so a backlog
    never queues behind another in one task."""
    if not ranges:
        return []
    load = sum(1.0 if r.weight > 0 else IDLE_SHARD_SHARE for r in ranges)
    tasks = max(math.ceil(load / max(1, shards_per_task)), max(1, parallelism))
    tasks = min(tasks, len(ranges))
    groups: list[list[ShardRange]] = [[] for _ in range(tasks)]
    ordered = sorted(ranges, key=lambda r: (-r.weight, r.shard_id))
    for index, shard_range in enumerate(ordered):
        groups[index % tasks].append(shard_range)
    return [tuple(sorted(g, key=lambda r: r.shard_id)) for g in groups]


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_READ_THREADS,
                                       thread_name_prefix="kinesis-dstream-read")
        return _pool


def read_shards(config: ConsumerConfig, ranges: Sequence[ShardRange], *, fresh: bool = True,
                ) -> Iterator[tuple[list[Record], ReadReport]]:
    """Each range's records and report, in the group's order; the reads run concurrently.

    A read that fails fails the task (Spark retries it); the others finish and record their
    ranges, which the retry then reads exactly.
    """
    return read_each([(config, r) for r in ranges], fresh=fresh)


def read_each(reads: Sequence[tuple[ConsumerConfig, ShardRange]], *, fresh: bool = True,
              convert: Convert = None) -> Iterator[tuple[Any, ReadReport]]:
    """``read_shards`` of ranges that each name their stream's config (a task of a query
    that reads several streams). ``convert`` turns each range's records into what the task
    hands out, in the range's read thread, before the range is recorded (``read_shard_range``)."""
    if len(reads) == 1:
        yield read_shard_range(reads[0][0], reads[0][1], fresh=fresh, convert=convert)
        return
    pool = _threads()
    # The shards that read records last time start first: a wide group's idle shards each
    # take a thread and the GIL for a moment, and the busy ones would otherwise wait for
    # them, making the task longer. The results come in the group's order all the same.
    order = sorted(range(len(reads)), key=lambda i: -reads[i][1].weight)
    futures: dict[int, Any] = {}
    for index in order:
        config, shard_range = reads[index]
        futures[index] = pool.submit(read_shard_range, config, shard_range, fresh=fresh,
                                     convert=convert)
    for index in range(len(reads)):
        yield futures[index].result()
