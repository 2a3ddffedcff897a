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

log = logging.getLogger(__name__)


class InputInfoReporter:
    def __init__(self, name: str) -> None:
        self.name = name
        self.input_stream_id: int | None = None
        self._scala_ssc: Any = None

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
            jvm = sc._jvm
            lines = [f"{shard}: after {r.batch_range.start} through {r.batch_range.end or '-'}, "
                     f"{r.batch_range.records} records, millisBehindLatest "
                     f"{r.millis_behind_latest}" for shard, r in sorted(reports.items())]
            metadata = jvm.java.util.HashMap()
            metadata.put("Description", description or "\n".join(lines) or "no shards planned")
            metadata = jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(metadata)
            info = jvm.org.apache.spark.streaming.scheduler.StreamInputInfo(
                self.input_stream_id, count, metadata)
            # JobScheduler makes its tracker when the context starts: look it up each time.
            tracker = self._scala_ssc.scheduler().inputInfoTracker()
            tracker.reportInfo(jvm.org.apache.spark.streaming.Time(batch_ms), info)
        except Exception as exc:  # noqa: BLE001 - visibility only, never the data path
            log.warning("%s: could not report batch %d input to Spark's UI: %s", self.name,
                        batch_ms, exc)
