"""The ``aws-kinesis`` data source: one class that Spark finds by name.

Streaming reads (``source.py``: the driver plans, executors read), batch and streaming
writes (``sink.py``). ``schema()`` is the source's (the awslabs connector's, plus
``subSequenceNumber`` and ``shardId`` so KPL user records and their shards can be told apart).
A batch read (``spark.read``) is not offered: it fails in one place, ``_no_batch_read``.

Registration needs no call: the top-level modules ``pyspark_kinesis_dstream`` (``aws-kinesis``)
and ``pyspark_kinesis`` (``kinesis``) expose subclasses as ``DefaultSource``, which PySpark
imports at its first data source lookup. ``spark.dataSource.register(KinesisDataSource)``
does the same by hand.
"""
from __future__ import annotations

from typing import NoReturn

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .options import parse_options, parse_source_options
from .sink import KinesisBatchWriter, KinesisStreamWriter
from .source import SCHEMA, KinesisStreamReader


def _no_batch_read(format_name: str) -> NoReturn:
    raise NotImplementedError(
        f"format {format_name!r} reads as a stream only: use spark.readStream (with "
        "Trigger.AvailableNow to read what the stream holds and stop)")


class KinesisDataSource(DataSource):
    """``format("aws-kinesis")``: options as the awslabs spark-sql-kinesis-connector names them."""

    @classmethod
    def name(cls) -> str:
        return "aws-kinesis"

    def schema(self) -> StructType:
        # Spark asks for the schema of a read only: a bad source option fails load(), named.
        parse_source_options(self.options)
        return SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return KinesisBatchWriter(parse_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return KinesisStreamWriter(parse_options(self.options), schema)

    def reader(self, schema: StructType) -> NoReturn:
        _no_batch_read(self.name())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return KinesisStreamReader(parse_source_options(self.options))
