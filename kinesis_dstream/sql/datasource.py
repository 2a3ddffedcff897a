"""The ``aws-kinesis`` data source: one class that Spark finds by name.

The sink is here; the source (``reader``/``streamReader``) is not built yet and fails in one
place, ``_no_source``, with a message saying what to use meanwhile. ``schema()`` is already
the source's schema (the awslabs connector's, plus ``subSequenceNumber`` and ``shardId`` so
KPL user records and their shards can be told apart).

Registration needs no call: the top-level modules ``pyspark_kinesis_dstream`` (``aws-kinesis``)
and ``pyspark_kinesis`` (``kinesis``) expose subclasses as ``DefaultSource``, which PySpark
imports at its first data source lookup. ``spark.dataSource.register(KinesisDataSource)``
does the same by hand.
"""
from __future__ import annotations

from typing import NoReturn

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from .options import SINK_OPTIONS, parse_options
from .sink import KinesisBatchWriter, KinesisStreamWriter

SOURCE_SCHEMA = ("data binary, streamName string, partitionKey string, sequenceNumber string, "
                 "subSequenceNumber long, shardId string, approximateArrivalTimestamp timestamp")


def _no_source(format_name: str) -> NoReturn:
    raise NotImplementedError(
        f"reading from format {format_name!r} is not available yet: only the sink is "
        "(df.write / df.writeStream). Read Kinesis with kinesis_dstream.KinesisUtils.createStream "
        "(DStreams) meanwhile.")


class KinesisDataSource(DataSource):
    """``format("aws-kinesis")``: options as the awslabs spark-sql-kinesis-connector names them."""

    @classmethod
    def name(cls) -> str:
        return "aws-kinesis"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return KinesisBatchWriter(parse_options(self.options, (SINK_OPTIONS,)), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return KinesisStreamWriter(parse_options(self.options, (SINK_OPTIONS,)), schema)

    def reader(self, schema: StructType) -> NoReturn:
        _no_source(self.name())

    def streamReader(self, schema: StructType) -> NoReturn:
        _no_source(self.name())

    def simpleStreamReader(self, schema: StructType) -> NoReturn:
        _no_source(self.name())
