"""The executors' side of the SQL source: one task's shards, read and turned into rows.

A ``ShardPartition`` is all a task knows (picklable, small): ``read_partition`` reads its
ranges with the executors' reader, which records each range before handing out a record, so
a retried task returns the same rows (see ``offsets``). Rows go to Spark as Arrow record
batches, or as tuples where ``kinesis.arrowBatches`` is false.
"""
from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

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
from ..retrieval import ShardRange, read_shards

log = logging.getLogger(__name__)

# Rows per Arrow batch handed to Spark: bounded memory per batch, few batches per partition.
ARROW_ROWS = 10_000

SCHEMA = StructType([
    StructField("data", BinaryType(), False),
    StructField("streamName", StringType(), False),
    StructField("partitionKey", StringType(), False),
    StructField("sequenceNumber", StringType(), False),
    StructField("subSequenceNumber", LongType(), False),
    StructField("shardId", StringType(), False),
    StructField("approximateArrivalTimestamp", TimestampType(), False),
])


@dataclass(frozen=True)
class ShardPartition(InputPartition):
    """A task's shards in one micro-batch; all a task knows (picklable, small)."""

    config: ConsumerConfig
    ranges: tuple[ShardRange, ...]
    arrow: bool = True

    def __repr__(self) -> str:
        shards = ", ".join(f"{r.shard_id} after {r.start}" for r in self.ranges)
        return f"ShardPartition(reading {self.ranges[0].batch_ms}: {shards})"


def arrow_schema() -> Any:
    """The Arrow schema Spark expects from read(): ``SCHEMA``'s, nullability included (pyspark
    >= 4.2 checks it). Spelled out, since PySpark's converter changed its keywords between
    4.0 and 4.2."""
    import pyarrow as pa

    return pa.schema([
        pa.field("data", pa.binary(), nullable=False),
        pa.field("streamName", pa.string(), nullable=False),
        pa.field("partitionKey", pa.string(), nullable=False),
        pa.field("sequenceNumber", pa.string(), nullable=False),
        pa.field("subSequenceNumber", pa.int64(), nullable=False),
        pa.field("shardId", pa.string(), nullable=False),
        pa.field("approximateArrivalTimestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    ])


def to_arrow(records: Sequence[Record], stream_name: str, schema: Any) -> Any:
    import pyarrow as pa

    n = len(records)
    columns = [
        pa.array([r.binary_data for r in records], pa.binary()),
        pa.array([stream_name] * n, pa.string()),
        pa.array([r.partition_key for r in records], pa.string()),
        pa.array([r.sequence_number for r in records], pa.string()),
        pa.array([r.sub_sequence_number for r in records], pa.int64()),
        pa.array([r.shard_id for r in records], pa.string()),
        pa.array([r.approximate_arrival_timestamp * 1000 for r in records],
                 pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def read_partition(partition: ShardPartition) -> Iterator[Any]:
    """The records of one partition, the same ones every time (see ``offsets``)."""
    stream = partition.config.stream_name
    schema = arrow_schema() if partition.arrow else None
    for records, report in read_shards(partition.config, partition.ranges):
        r = report.batch_range
        log.info("shard %s reading %d: %d records after %s through %s%s, millisBehindLatest %s",
                 r.shard_id, r.batch_ms, r.records, r.start, r.end or "-",
                 " (shard end)" if r.shard_end else "", report.millis_behind_latest)
        if schema is None:
            utc = datetime.timezone.utc
            for x in records:
                yield (x.binary_data, stream, x.partition_key, x.sequence_number,
                       x.sub_sequence_number, x.shard_id,
                       datetime.datetime.fromtimestamp(x.approximate_arrival_timestamp / 1000.0,
                                                       utc))
            continue
        for i in range(0, len(records), ARROW_ROWS):
            yield to_arrow(records[i:i + ARROW_ROWS], stream, schema)
