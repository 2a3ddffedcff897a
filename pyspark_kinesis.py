"""Registers ``format("kinesis")`` (the name qubole's and Databricks' connectors use) with PySpark
(>= 4.0) without any call; same options as ``aws-kinesis``: the awslabs names, and the
Databricks and qubole names as aliases."""
from kinesis_dstream.sql.datasource import KinesisShortNameDataSource


class DefaultSource(KinesisShortNameDataSource):
    """``kinesis``: the same source under the shorter name."""
