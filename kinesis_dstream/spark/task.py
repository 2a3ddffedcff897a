"""Runs in Spark tasks, on executors: the body of a Kinesis batch's partitions.

A partition carries a group of ``ShardRange``s, never records. Its task reads them, reports
each read to the driver through an accumulator (``RangeReports``), and yields the records'
values. Only the read-ahead's own job may decide a new range (see ``read_ahead``): its
tasks find the batch time in the ``READ_AHEAD`` local property. Nothing of the driver's
planning is imported here, so a task unpickles only what it runs.

The batch RDD's serializer (``BatchSerializer``) is PySpark's own with one addition: a task
that reads a batch's cached values (an output operation's) acknowledges its input at once,
as the read itself does, instead of waiting 40 ms for it (Spark over TCP).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Iterator

from pyspark.serializers import AutoBatchedSerializer, CPickleSerializer

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


class BatchSerializer(AutoBatchedSerializer):
    """PySpark's default serializer (``AutoBatchedSerializer(CPickleSerializer())``) for a
    batch's values; a task loading them first acknowledges its input (``load_stream`` runs
    once the task's command is read, before its data is: the data's write waits for that
    acknowledgement). Equal to PySpark's default, so ``union`` and ``_reserialize`` add no
    pass over the data. Spark's checkpoint holds it by name (with the stream's ``foreachRDD``
    functions): renaming it breaks ``getOrCreate`` on older checkpoints."""

    def __init__(self) -> None:
        super().__init__(CPickleSerializer())

    def load_stream(self, stream: Any) -> Any:
        from pyspark import TaskContext

        if TaskContext.get() is not None:  # a task on an executor, not the driver's collect
            acknowledge_input_at_once()
        return super().load_stream(stream)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AutoBatchedSerializer) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:  # as PySpark's: its repr, the default's
        return hash(str(self))


def batch_values(rdd: Any) -> Any:
    """``rdd`` (a batch's values, or the DStream of them) with ``BatchSerializer``, unless
    the SparkContext has a serializer of its own (then nothing changes: the batch RDD and
    the stream, which ``foreachRDD`` reads it with, keep the context's alike)."""
    if rdd._jrdd_deserializer == BatchSerializer():
        rdd._jrdd_deserializer = BatchSerializer()
    return rdd
