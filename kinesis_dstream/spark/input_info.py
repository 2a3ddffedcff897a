"""Runs in the driver: Spark UI reporting of a Kinesis input stream's batches.

The records never reach the driver, so Spark does not count them itself: each batch's
record count and per-shard ranges are handed to Spark's ``InputInfoTracker`` (the Streaming
UI, its REST API and every StreamingListener read it) under an input stream id of our own.
Visibility only: a failure here is logged, never raised into the data path.
"""
from __future__ import annotations

import logging
from typing import Any

from ..retrieval import ReadReport
from .jvm import jvm

log = logging.getLogger(__name__)


class InputInfoReporter:
    def __init__(self, name: str) -> None:
        self.name = name
        self.input_stream_id: int | None = None
        self._scala_ssc: Any = None
        self._tracker: Any = None  # Spark's InputInfoTracker, once the context has started

    def bind(self, jssc: Any) -> None:
        """Get an input stream id of our own from Spark and its input-info tracker."""
        if self.input_stream_id is None:
            self._scala_ssc = jssc.ssc()
            self.input_stream_id = int(self._scala_ssc.getNewInputStreamId())

    def report(self, sc: Any, batch_ms: int, count: int, reports: dict[str, ReadReport],
               description: str | None = None) -> None:
        """Tell Spark's InputInfoTracker what batch ``batch_ms`` holds (``reports`` by shard)."""
        if self.input_stream_id is None:
            return
        try:
            lines = [f"{shard}: after {r.batch_range.start} through {r.batch_range.end or '-'}, "
                     f"{r.batch_range.records} records, millisBehindLatest "
                     f"{r.millis_behind_latest}" for shard, r in sorted(reports.items())]
            metadata = jvm(sc, "java.util.HashMap")()
            metadata.put("Description", description or "\n".join(lines) or "no shards planned")
            info = jvm(sc, "org.apache.spark.streaming.scheduler.StreamInputInfo")(
                self.input_stream_id, count,
                jvm(sc, "org.apache.spark.api.python.PythonUtils.toScalaMap")(metadata))
            if self._tracker is None:  # the JobScheduler makes it when the context starts
                self._tracker = self._scala_ssc.scheduler().inputInfoTracker()
            self._tracker.reportInfo(jvm(sc, "org.apache.spark.streaming.Time")(batch_ms), info)
        except Exception as exc:  # noqa: BLE001 - visibility only, never the data path
            log.warning("%s: could not report batch %d input to Spark's UI: %s", self.name,
                        batch_ms, exc)
