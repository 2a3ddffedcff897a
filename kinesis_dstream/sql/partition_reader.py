"""The executors' side of the SQL source: one task's shards, read and turned into rows.

A ``ShardPartition`` is all a task knows (picklable, small): ``read_partition`` reads its
ranges with the executors' reader, which records each range before handing out a record, so
a retried task returns the same rows (see ``offsets``). Rows go to Spark as Arrow record
batches, or as tuples where ``kinesis.arrowBatches`` is false, in the layout of the format
read: the awslabs connector's columns for ``aws-kinesis``, Databricks' for ``kinesis``.
"""
from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..config import ConsumerConfig
from ..records import Record
from ..retrieval import ShardRange, shard_name

log = logging.getLogger(__name__)

# Rows per Arrow batch handed to Spark: bounded memory per batch, few batches per partition.
ARROW_ROWS = 10_000

# Each column a row may have: its Spark type and its value from a record and its stream.
_COLUMNS: dict[str, tuple[Any, Callable[[Record, str], Any]]] = {
    "data": (BinaryType(), lambda r, s: r.binary_data),
    "streamName": (StringType(), lambda r, s: s),
    "stream": (StringType(), lambda r, s: s),
    "partitionKey": (StringType(), lambda r, s: r.partition_key),
    "sequenceNumber": (StringType(), lambda r, s: r.sequence_number),
    "subSequenceNumber": (LongType(), lambda r, s: r.sub_sequence_number),
    "shardId": (StringType(), lambda r, s: r.shard_id),
    "approximateArrivalTimestamp": (TimestampType(), lambda r, s: datetime.datetime.fromtimestamp(
        r.approximate_arrival_timestamp / 1000.0, datetime.timezone.utc)),
}
# format("aws-kinesis"): the awslabs connector's five columns, in its order and nullable as
# its StructFields are (Spark's default), so positional access and unions with its output
# work; then ours, shardId and subSequenceNumber (KPL user records and their shards told apart).
AWSLABS_COLUMNS = ("data", "streamName", "partitionKey", "sequenceNumber",
                   "approximateArrivalTimestamp", "shardId", "subSequenceNumber")
# format("kinesis"): Databricks' columns in Databricks' order, plus subSequenceNumber last.
DATABRICKS_COLUMNS = ("partitionKey", "data", "stream", "shardId", "sequenceNumber",
                      "approximateArrivalTimestamp", "subSequenceNumber")
LAYOUTS = {"awslabs": AWSLABS_COLUMNS, "databricks": DATABRICKS_COLUMNS}
# Whether a layout's columns are declared nullable (no value is ever null): awslabs' are,
# Databricks' documented schema has none so we keep them non-nullable.
NULLABLE = {"awslabs": True, "databricks": False}


def spark_schema(layout: str = "awslabs") -> StructType:
    return StructType([StructField(name, _COLUMNS[name][0], NULLABLE[layout])
                       for name in LAYOUTS[layout]])


SCHEMA = spark_schema("awslabs")


@dataclass(frozen=True)
class ShardPartition(InputPartition):
    """A task's shards in one micro-batch; all a task knows (picklable, small). ``configs``
    is each range's stream's config where the query reads several streams (else
    ``config``'s stream, for all)."""

    config: ConsumerConfig
    ranges: tuple[ShardRange, ...]
    arrow: bool = True
    layout: str = "awslabs"
    configs: tuple[ConsumerConfig, ...] = ()

    def __repr__(self) -> str:
        shards = ", ".join(f"{c.stream_name}/{r.shard_id} after {r.start}" if self.configs
                           else f"{r.shard_id} after {r.start}" for c, r in self.reads())
        return f"ShardPartition(reading {self.ranges[0].batch_ms}: {shards})"

    def reads(self) -> list[tuple[ConsumerConfig, ShardRange]]:
        return list(zip(self.configs or [self.config] * len(self.ranges), self.ranges,
                        strict=True))


def arrow_schema(layout: str = "awslabs") -> Any:
    """The Arrow schema Spark expects from read(): the layout's, nullability included (pyspark
    >= 4.2 checks it). Spelled out, since PySpark's converter changed its keywords between
    4.0 and 4.2."""
    import pyarrow as pa

    types = {"data": pa.binary(), "subSequenceNumber": pa.int64(),
             "approximateArrivalTimestamp": pa.timestamp("us", tz="UTC")}
    return pa.schema([pa.field(name, types.get(name, pa.string()), nullable=NULLABLE[layout])
                      for name in LAYOUTS[layout]])


def to_arrow(records: Sequence[Record], stream_name: str, schema: Any) -> Any:
    """The records as an Arrow batch of ``schema`` (a layout's ``arrow_schema``)."""
    import pyarrow as pa

    arrays = {
        "data": lambda: pa.array([r.binary_data for r in records], pa.binary()),
        "partitionKey": lambda: pa.array([r.partition_key for r in records], pa.string()),
        "sequenceNumber": lambda: pa.array([r.sequence_number for r in records], pa.string()),
        "subSequenceNumber": lambda: pa.array([r.sub_sequence_number for r in records],
                                              pa.int64()),
        "shardId": lambda: pa.array([r.shard_id for r in records], pa.string()),
        "approximateArrivalTimestamp": lambda: pa.array(
            [r.approximate_arrival_timestamp * 1000 for r in records],
            pa.timestamp("us", tz="UTC")),
    }
    stream = lambda: pa.array([stream_name] * len(records), pa.string())  # noqa: E731
    columns = [arrays[name]() if name in arrays else stream() for name in schema.names]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def read_partition(partition: ShardPartition) -> Iterator[Any]:
    """The records of one partition, the same ones every time (see ``offsets``), converted in
    each shard's read thread before its range is recorded (the range keeps what the read and
    the conversion cost, for the driver's progress report). The read path is imported here:
    the driver's processes import this module for the schema and the partitions only."""
    from ..retrieval import read_each

    reads = partition.reads()
    convert = (_to_arrow_batches(arrow_schema(partition.layout)) if partition.arrow
               else _to_tuples(partition.layout))
    for (config, _), (rows, report) in zip(reads, read_each(reads, convert=convert), strict=True):
        r = report.batch_range
        log.info("%s reading %d: %d records after %s through %s%s, millisBehindLatest "
                 "%s; read %.0f ms, waited %.0f ms, converted in %.0f ms",
                 shard_name(config.stream_name, r.shard_id), r.batch_ms, r.records, r.start,
                 r.end or "-", " (shard end)" if r.shard_end else "", report.millis_behind_latest,
                 r.read_ms or 0.0, r.wait_ms or 0.0, r.convert_ms or 0.0)
        yield from rows


def _to_arrow_batches(schema: Any) -> Callable[[Sequence[Record], ConsumerConfig], list[Any]]:
    def convert(records: Sequence[Record], config: ConsumerConfig) -> list[Any]:
        return [to_arrow(records[i:i + ARROW_ROWS], config.stream_name, schema)
                for i in range(0, len(records), ARROW_ROWS)]
    return convert


def _to_tuples(layout: str) -> Callable[[Sequence[Record], ConsumerConfig], list[tuple]]:
    columns = [_COLUMNS[name][1] for name in LAYOUTS[layout]]

    def convert(records: Sequence[Record], config: ConsumerConfig) -> list[tuple]:
        stream = config.stream_name
        return [tuple(column(x, stream) for column in columns) for x in records]
    return convert
