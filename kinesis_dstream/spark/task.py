"""Runs in Spark tasks, on executors: the body of a Kinesis batch's partitions.

A partition carries a group of ``ShardRange``s, never records. Its task reads them, reports
each read to the driver through an accumulator (``RangeReports``), and yields the records'
values. Only the read-ahead's own job may decide a new range (see ``read_ahead``): its
tasks find the batch time in the ``READ_AHEAD`` local property. Nothing of the driver's
planning is imported here, so a task unpickles only what it runs.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Iterator

from ..config import ConsumerConfig
from ..retrieval import ShardRange, read_shards
from ..retrieval.executor_process import acknowledge_input_at_once
from .records import RecordValues

# The local property that marks the read-ahead job of a batch (its value: the batch time).
READ_AHEAD = "kinesis_dstream.readAhead"


class RangeReports:
    """Accumulator parameter: {(stream key, shard id, batch ms): ReadReport}, merged by key.

    A partition computed twice reports the same range twice; merging by key keeps one, with
    the refusals and faults of every computation added up (a re-read at the limits is
    throttled too, and counted).
    """

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:  # noqa: N802 - PySpark's name
        for key, report in value2.items():
            earlier = value1.get(key)
            if earlier is not None and (earlier.throttled or earlier.faults):
                report = replace(report, throttled=report.throttled + earlier.throttled,
                                 faults=report.faults + earlier.faults)
            value1[key] = report
        return value1


def _in_read_ahead(batch_ms: int) -> bool:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is not None and context.getLocalProperty(READ_AHEAD) == str(batch_ms)


def read_partition(config: ConsumerConfig, reports: Any, values: RecordValues,
                   groups: Iterable[tuple[ShardRange, ...]]) -> Iterator[Any]:
    """A task's body: read its group of shards, report, yield the values."""
    acknowledge_input_at_once()  # else the group below comes 40 ms late (Spark over TCP)
    for group in groups:
        fresh = _in_read_ahead(group[0].batch_ms)
        for records, report in read_shards(config, group, fresh=fresh):
            r = report.batch_range
            reports.add({(r.stream_key, r.shard_id, r.batch_ms): report})
            yield from values(records)
