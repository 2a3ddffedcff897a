"""Registers ``format("aws-kinesis")`` with PySpark (>= 4.0) without any call.

PySpark imports every top-level module named ``pyspark_*`` at its first data source lookup and
registers its ``DefaultSource`` under ``DefaultSource.name()``. On an older PySpark nothing
imports this module.
"""
from kinesis_dstream.sql.datasource import KinesisDataSource


class DefaultSource(KinesisDataSource):
    """``aws-kinesis``, the awslabs connector's name."""
