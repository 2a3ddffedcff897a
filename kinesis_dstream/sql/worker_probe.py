"""The SQL formats' executor check, run as a Python data source read.

``register`` asks Spark's Python workers whether they import the package and pyarrow
(``preflight.check_executors``). Asked by a read of a throwaway Python data source rather than
an RDD task, the probe runs in the very workers the query's reads will run in (Spark SQL
starts its own, apart from the RDD ones) and leaves them started, with the modules imported:
a query started soon after ``register`` does not pay for them in its first batch.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ..preflight import ProbeJob, python_exec, rdd_probe_job

PROBE_FORMAT = "kinesis-dstream-preflight"


def data_source_probe_job(spark: Any, python: str, tasks: int) -> ProbeJob:
    """The probe as ``tasks`` partitions of a batch read in ``python``'s workers; each
    yields its reports as JSON."""

    def run(probe: Callable[[Any], Iterator[dict[str, Any]]]) -> list[dict[str, Any]]:
        # Local classes: cloudpickle ships them by value, so a worker that lacks the package
        # still runs the probe and reports what it misses.
        class ProbeReader(DataSourceReader):
            def partitions(self) -> list[InputPartition]:
                return [InputPartition(i) for i in range(tasks)]

            def read(self, partition: InputPartition) -> Iterator[tuple[str]]:
                for report in probe(partition):
                    yield (json.dumps(report),)

        class ProbeSource(DataSource):
            @classmethod
            def name(cls) -> str:
                return PROBE_FORMAT

            def schema(self) -> str:
                return "report string"

            def reader(self, schema: Any) -> DataSourceReader:
                return ProbeReader()

        sc = spark.sparkContext
        with python_exec(sc, sys.executable):  # its planning in the driver's Python, as ours
            spark.dataSource.register(ProbeSource)
        try:
            rows = spark.read.format(PROBE_FORMAT).load().collect()
        except Exception:
            # A worker without pyarrow (or pyspark) fails before the probe can say so: the
            # RDD probe, which needs neither, names what is missing; else this error stands.
            reports = rdd_probe_job(sc, python)(probe)
            if any(report["missing"] for report in reports):
                return reports
            raise
        return [json.loads(row[0]) for row in rows]

    return run
