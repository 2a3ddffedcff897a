"""kinesis-dstream: KCL-compatible Kinesis consumers for PySpark DStreams and kclpy processors.

The Spark names are imported lazily, so worker processes and the multilang daemon never
import pyspark.
"""
from __future__ import annotations

from typing import Any

from .config import ConsumerConfig
from .errors import (
    CheckpointError,
    ConfigurationError,
    CredentialsError,
    EndpointUnreachableError,
    ExecutorEnvironmentError,
    KinesisDStreamError,
    PutRecordsFailedError,
    StreamNotFoundError,
)

__version__ = "0.1.0"

_SPARK_EXPORTS = ("KinesisUtils", "InitialPositionInStream", "MetricsLevel", "utf8_decoder")

__all__ = ["ConsumerConfig", "CheckpointError", "ConfigurationError", "CredentialsError",
           "EndpointUnreachableError", "ExecutorEnvironmentError", "KinesisDStreamError",
           "PutRecordsFailedError", "StreamNotFoundError", "KinesisRecord", *_SPARK_EXPORTS]


def __getattr__(name: str) -> Any:
    if name == "KinesisRecord":  # what a messageHandler receives; needs no pyspark
        from .spark.records import KinesisRecord

        return KinesisRecord
    if name in _SPARK_EXPORTS:
        try:
            from .spark import kinesis_utils
        except ImportError as exc:
            if (exc.name or "").split(".")[0] != "pyspark":
                raise
            raise ImportError(
                f"kinesis_dstream.{name} needs pyspark, which is an extra: "
                "pip install 'kinesis-dstream[spark]' (the worker and the multilang daemon "
                "run without it)", name="pyspark") from exc

        return getattr(kinesis_utils, name)
    raise AttributeError(f"module 'kinesis_dstream' has no attribute {name!r}")
