"""Spark SQL: ``format("aws-kinesis")`` on PySpark's Python Data Source API (pyspark >= 4.0).

Importing this package on an older PySpark fails here, naming the version needed; the
DStream side (``kinesis_dstream.spark``) never imports it.
"""
from __future__ import annotations

try:
    import pyspark.sql.datasource  # noqa: F401 - the check itself
except ImportError as exc:  # pragma: no cover - exercised on pyspark < 4.0 only
    try:
        from pyspark import __version__ as _found
    except ImportError:
        _found = "not installed"
    raise ImportError(
        "kinesis_dstream.sql (format 'aws-kinesis') needs pyspark >= 4.0 for the Python Data "
        f"Source API (pyspark.sql.datasource); found pyspark {_found}. The DStream API "
        "(kinesis_dstream.KinesisUtils) works without it.") from exc
