"""CloudWatch metrics with the KCL's names, buffered and published in the background.

Values are aggregated per (metric, unit, dimensions) into a StatisticSet and published every
``metrics_buffer_time_ms`` (the KCL's ``metricsBufferTimeMillis``, 10 s) in as few
``PutMetricData`` calls as the API allows, so the cost does not grow with the record rate.
The namespace is the application name, as the KCL's. Dimensions follow ``metrics_level``:

- ``SUMMARY``: ``Operation`` only (one series per operation for the whole application),
  and, as in the KCL, only the metrics it tags SUMMARY (not the GetRecords ones);
- ``DETAILED``: every metric, with ``Operation`` and also ``Operation`` + ``ShardId`` for
  values given a shard id;
- ``NONE``: nothing is recorded and no CloudWatch client is made.

``MillisBehindLatest`` also goes, as in the KCL 2.5+, to operation ``ApplicationTracker``
with no shard dimension: its Maximum is the application's lag, one series that outlives
every reshard.

Publishing must never stop a consumer: a failed call drops that period's values and is
logged once, then at most once a minute with a count while it keeps failing.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..config import ConsumerConfig
from ..retry import FaultLog

if TYPE_CHECKING:
    from ..aws.protocols import CloudWatchAPI

log = logging.getLogger(__name__)

# Operations and metric names as the KCL 2.x publishes them.
PROCESS_TASK = "ProcessTask"
RENEW_ALL_LEASES = "RenewAllLeases"
TAKE_LEASES = "TakeLeases"
# The KCL's operation for application-level figures (no ShardId dimension at any level).
APPLICATION_TRACKER = "ApplicationTracker"

RECORDS_PROCESSED = "RecordsProcessed"
DATA_BYTES_PROCESSED = "DataBytesProcessed"
MILLIS_BEHIND_LATEST = "MillisBehindLatest"
PROCESS_RECORDS_TIME = "RecordProcessor.processRecords.Time"
GET_RECORDS_SUCCESS = "KinesisDataFetcher.getRecords.Success"
GET_RECORDS_TIME = "KinesisDataFetcher.getRecords.Time"
# Reads Kinesis refused for throughput, per shard: the service's own stream metric's name
# (the KCL counts them only as getRecords.Success 0, which this records as well).
READ_THROUGHPUT_EXCEEDED = "ReadProvisionedThroughputExceeded"
CURRENT_LEASES = "CurrentLeases"
LOST_LEASES = "LostLeases"
TOTAL_LEASES = "TotalLeases"
TAKEN_LEASES = "TakenLeases"

COUNT = "Count"
MILLISECONDS = "Milliseconds"
BYTES = "Bytes"

# PutMetricData takes at most 1000 datums per call (20 before 2023; moto and CloudWatch
# accept 1000 today); the 1 MB request limit leaves room for 1000 small StatisticSets.
MAX_DATUMS_PER_CALL = 1000


@dataclass
class _Statistics:
    count: int = 0
    total: float = 0.0
    minimum: float = float("inf")
    maximum: float = float("-inf")

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)


_Key = tuple[str, str, tuple[tuple[str, str], ...]]


class MetricsPublisher:
    """A buffered CloudWatch publisher shared by the worker, the multilang daemon and Spark.

    ``record`` is cheap (a dict update under a lock) and safe from any thread; call it per
    batch, not per record. ``close`` publishes what is buffered and stops the thread.
    """

    def __init__(self, config: ConsumerConfig, client: CloudWatchAPI | None = None, *,
                 flush_interval_s: float | None = None,
                 clock: Callable[[], float] = time.time):
        self.namespace = config.application_name
        self.level = config.metrics_level
        self.enabled = self.level != "NONE"
        self._interval_s = (config.metrics_buffer_time_ms / 1000.0
                            if flush_interval_s is None else flush_interval_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._buffer: dict[_Key, _Statistics] = {}
        self._fault = FaultLog(log, f"publishing metrics to CloudWatch namespace {self.namespace}")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: CloudWatchAPI | None = None
        if not self.enabled:
            return
        if client is None:
            from ..aws.clients import make_client  # the AWS layer, only when publishing

            client = make_client(config, "cloudwatch")
        self._client = client
        self._thread = threading.Thread(target=self._run, name="metrics-publisher", daemon=True)
        self._thread.start()

    def record(self, name: str, value: float, *, operation: str, shard_id: str | None = None,
               unit: str = COUNT, level: str = "SUMMARY") -> None:
        """Add one value of metric ``name`` for ``operation`` (and ``shard_id`` if DETAILED).

        A value with a shard id also counts towards the operation-level series, so SUMMARY
        and DETAILED dashboards read the same totals. ``level`` is the metric's own level
        (the KCL's): a ``"DETAILED"`` metric is dropped when publishing at SUMMARY.
        """
        if not self.enabled or (level == "DETAILED" and self.level != "DETAILED"):
            return
        keys: list[_Key] = [(name, unit, (("Operation", operation),))]
        if shard_id is not None and self.level == "DETAILED":
            keys.append((name, unit, (("Operation", operation), ("ShardId", shard_id))))
        with self._lock:
            for key in keys:
                statistics = self._buffer.get(key)
                if statistics is None:
                    statistics = self._buffer[key] = _Statistics()
                statistics.add(float(value))

    def flush(self) -> None:
        """Publish what is buffered now; failures are logged (bounded) and swallowed."""
        if not self.enabled:
            return
        with self._lock:
            buffered, self._buffer = self._buffer, {}
        if not buffered:
            return
        timestamp = self._clock()
        datums = [{
            "MetricName": name,
            "Dimensions": [{"Name": dim, "Value": value} for dim, value in dimensions],
            "Timestamp": timestamp,
            "Unit": unit,
            "StatisticValues": {"SampleCount": float(s.count), "Sum": s.total,
                                "Minimum": s.minimum, "Maximum": s.maximum},
        } for (name, unit, dimensions), s in buffered.items()]
        client = self._client
        assert client is not None  # made in __init__ whenever metrics are enabled
        with self._publish_lock:
            for start in range(0, len(datums), MAX_DATUMS_PER_CALL):
                batch = datums[start:start + MAX_DATUMS_PER_CALL]
                try:
                    client.put_metric_data(Namespace=self.namespace, MetricData=batch)
                except Exception as exc:  # noqa: BLE001 - metrics never stop a consumer
                    from ..aws.clients import translate_error

                    self._fault.failed(translate_error(exc, "PutMetricData"), self._interval_s)
                    return
            self._fault.succeeded()

    def close(self, timeout_s: float = 5.0) -> None:
        """Publish what is left and stop, waiting at most ``timeout_s``.

        The last flush runs on the publisher's own (daemon) thread, so an unreachable
        CloudWatch endpoint delays a worker's shutdown by ``timeout_s`` at most.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            if self._thread.is_alive():
                log.warning("metrics for namespace %s not published within %.0f s of closing",
                            self.namespace, timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.flush()
        self.flush()


class ShardMetricsRecorder:
    """What a shard consumer reports, with the KCL's names: one call per batch."""

    def __init__(self, publisher: MetricsPublisher | None, shard_id: str):
        self._publisher = publisher
        self._shard_id = shard_id

    def get_records(self, success: bool, elapsed_ms: float) -> None:
        if self._publisher is None:
            return
        self._publisher.record(GET_RECORDS_SUCCESS, 1 if success else 0, operation=PROCESS_TASK,
                               shard_id=self._shard_id, level="DETAILED")
        self._publisher.record(GET_RECORDS_TIME, elapsed_ms, operation=PROCESS_TASK,
                               shard_id=self._shard_id, unit=MILLISECONDS, level="DETAILED")

    def throttled(self, refused: int) -> None:
        """``refused`` reads Kinesis refused for throughput and the reader waited out."""
        if self._publisher is None or refused <= 0:
            return
        for _ in range(refused):
            self._publisher.record(GET_RECORDS_SUCCESS, 0, operation=PROCESS_TASK,
                                   shard_id=self._shard_id, level="DETAILED")
        self._publisher.record(READ_THROUGHPUT_EXCEEDED, refused, operation=PROCESS_TASK,
                               shard_id=self._shard_id)

    def processed(self, records: int, data_bytes: int, millis_behind_latest: int | None,
                  elapsed_ms: float | None) -> None:
        publisher = self._publisher
        if publisher is None:
            return
        publisher.record(RECORDS_PROCESSED, records, operation=PROCESS_TASK,
                         shard_id=self._shard_id)
        publisher.record(DATA_BYTES_PROCESSED, data_bytes, operation=PROCESS_TASK,
                         shard_id=self._shard_id, unit=BYTES)
        if millis_behind_latest is not None:
            publisher.record(MILLIS_BEHIND_LATEST, millis_behind_latest, operation=PROCESS_TASK,
                             shard_id=self._shard_id, unit=MILLISECONDS)
            publisher.record(MILLIS_BEHIND_LATEST, millis_behind_latest,
                             operation=APPLICATION_TRACKER, unit=MILLISECONDS)
        if elapsed_ms is not None:
            publisher.record(PROCESS_RECORDS_TIME, elapsed_ms, operation=PROCESS_TASK,
                             shard_id=self._shard_id, unit=MILLISECONDS)
