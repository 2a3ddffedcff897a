"""What the SQL source shows in the query progress: lag, and what the last reading cost.

PySpark's Python data source API gives a streaming reader no way to report custom metrics
(``SourceProgress.metrics`` stays empty); the nearest place a user sees is the source's
``latestOffset`` in each ``StreamingQueryProgress``, which is what ``reportLatestOffset``
returns (pyspark >= 4.2). There the reader puts each shard's millisBehindLatest, Databricks'
``avgMsBehindLatest``, ``maxMsBehindLatest`` and ``minMsBehindLatest``, and the read, wait
and convert times of the last completed reading, which its tasks recorded with each shard's
range. Pure functions, no I/O: the reader gathers, these shape.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..aws.range_table import BatchRange
from ..worker.stall import largest_lag


def lag_metrics(lag: Mapping[str, int | None]) -> dict[str, Any]:
    """Databricks' names over the shards whose lag is known (none known: none reported)."""
    known = [v for v in lag.values() if v is not None]
    if not known:
        return {}
    return {"avgMsBehindLatest": round(sum(known) / len(known), 1),
            "maxMsBehindLatest": max(known), "minMsBehindLatest": min(known)}


def reading_metrics(reading: int, ranges: Mapping[str, BatchRange | None]) -> dict[str, Any]:
    """What reading ``reading`` cost, from the ranges its tasks recorded: its records and
    shards, and the largest read, wait and convert times of one shard (ms; a task reads its
    shards in parallel, so the largest is what the reading waited for). A range recorded by
    a version that kept no costs counts for nothing."""
    recorded = [r for r in ranges.values() if r is not None]

    def largest(name: str) -> float | None:
        values = [getattr(r, name) for r in recorded if getattr(r, name) is not None]
        return round(max(values), 1) if values else None

    return {"reading": reading, "shards": len(recorded),
            "records": sum(r.records for r in recorded), "readMs": largest("read_ms"),
            "waitMs": largest("wait_ms"), "convertMs": largest("convert_ms")}


def progress_report(lag: Mapping[str, int | None], stalled: list[str], stalls: int,
                    last_reading: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The source's ``latestOffset`` in the query progress (None: nothing known yet)."""
    if not lag and not last_reading:
        return None
    report: dict[str, Any] = {"millisBehindLatest": {k: lag[k] for k in sorted(lag)},
                              "maxMillisBehindLatest": largest_lag(lag.values()),
                              **lag_metrics(lag), "stalledShards": stalled, "stalls": stalls}
    if last_reading:
        report["lastReading"] = dict(last_reading)
    return report


def reading_line(metrics: Mapping[str, Any] | None) -> str:
    """The last reading's costs for the driver's log line of each planned reading."""
    if not metrics:
        return ""
    return (f"; reading {metrics['reading']} read {metrics['records']} records of "
            f"{metrics['shards']} shards, slowest read {metrics['readMs']} ms, wait "
            f"{metrics['waitMs']} ms, convert {metrics['convertMs']} ms")
