"""Benchmark: what our query listener (the fan-out consumer's deregistration) costs the driver
per query progress, told through PySpark's ``addListener`` or through ``QueryEvents``.

``register()`` adds one listener to the session; Spark tells it every progress of every query
(not only ours), one event at a time on its listener bus. PySpark's ``addListener`` turns each
event into Python objects field by field over py4j before the listener sees it;
``consumer_listener.QueryEvents`` reads a progress as its JSON, in one call. The same
``ConsumerDeregistration`` is behind both.

One SparkContext; a query over two ``rate`` sources (no emulator: the progress is what is
measured) on a 1 s trigger runs ``--duration`` s with one of the two ways attached, then stops;
the ways alternate over ``--rounds``. Per way: the time each progress took in the callback
(median, p90, max), how long after its batch ended the listener was told of it (the events
queued before it on Spark's listener bus), and how long after ``stop()`` returned it was told
the query ended. ``--burners N`` adds N busy processes for the whole run,
the same for both ways (CI's load: the 2 cores busy). Prints one JSON document.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import common
import spark_common as sc_common

from kinesis_dstream.sql import consumer_listener


class Timed:
    """Wraps a listener's Java-side object: times each progress callback, and notes when the
    query's end was told."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.progress_s: list[float] = []
        self.told_at: dict[int, float] = {}  # batch id -> epoch s the callback began
        self.terminated_at: float | None = None

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - Spark's name
        self.inner.onQueryStarted(jevent)

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802 - Spark's name
        told_at, started = time.time(), time.perf_counter()
        self.inner.onQueryProgress(jevent)
        self.progress_s.append(time.perf_counter() - started)
        self.told_at[int(jevent.progress().batchId())] = told_at

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802 - Spark's name
        self.inner.onQueryIdle(jevent)

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802 - Spark's name
        self.terminated_at = time.monotonic()
        self.inner.onQueryTerminated(jevent)

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def java_side(way: str, listener: Any) -> Any:
    """The object Spark calls: PySpark's converting one, or ours."""
    if way == "pyspark":
        from pyspark.sql.streaming.listener import JStreamingQueryListener
        return JStreamingQueryListener(listener)
    return consumer_listener.QueryEvents(listener)


def one_round(spark: Any, way: str, duration_s: float) -> dict[str, Any]:
    timed = Timed(java_side(way, consumer_listener.ConsumerDeregistration(spark)))
    wrapper = consumer_listener.add_java_listener(spark, timed)
    try:
        rates = [spark.readStream.format("rate").option("rowsPerSecond", 100).load()
                 for _ in range(2)]
        query = (rates[0].union(rates[1]).writeStream.format("noop")
                 .trigger(processingTime="1 second").start())
        time.sleep(duration_s)
        query.stop()
        stopped = time.monotonic()
        common.wait_for(lambda: timed.terminated_at is not None, 600, 0.01)
    finally:
        spark._jsparkSession.streams().removeListener(wrapper)
    told_s = None if timed.terminated_at is None else timed.terminated_at - stopped
    return {"progress_s": timed.progress_s, "told_after_stop_s": told_s,
            "batches": len(timed.progress_s), "late_s": late(query, timed.told_at)}


def late(query: Any, told_at: dict[int, float]) -> list[float]:
    """Per progress: how long after its batch ended the listener was told of it (the events
    queued before it on the listener bus)."""
    import datetime as dt

    out = []
    for progress in query.recentProgress:
        if progress["batchId"] in told_at:
            began = dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
            ended = began.timestamp() + progress["durationMs"]["triggerExecution"] / 1000
            out.append(told_at[progress["batchId"]] - ended)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--burners", type=int, default=0)
    args = parser.parse_args()
    load_before = os.getloadavg()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.burners)]
    try:
        from pyspark.sql import SparkSession
        sc = sc_common.spark_context(sc_common.LOCAL)
        spark = SparkSession(sc)
        results: dict[str, list[dict[str, Any]]] = {"pyspark": [], "query_events": []}
        for round_no in range(args.rounds):
            for way in results:
                common.progress(f"round {round_no + 1}: {way}")
                results[way].append(one_round(spark, way, args.duration))
        sc.stop()
    finally:
        for burner in burners:
            burner.kill()
    out: dict[str, Any] = {"benchmark": "query_listener", "duration_s": args.duration,
                           "burners": args.burners}
    for way, rounds in results.items():
        each = sorted(s for r in rounds for s in r["progress_s"])
        told = [r["told_after_stop_s"] for r in rounds if r["told_after_stop_s"] is not None]
        lates = sorted(s for r in rounds for s in r["late_s"])
        out[way] = {
            "progress_ms": {"median": round(1000 * statistics.median(each), 1),
                            "p90": round(1000 * each[int(0.9 * (len(each) - 1))], 1),
                            "max": round(1000 * each[-1], 1), "events": len(each)},
            "told_late_s": {"median": round(statistics.median(lates), 3) if lates else None,
                            "max": round(lates[-1], 3) if lates else None},
            "told_after_stop_s": common.summary(told),
            "batches": [r["batches"] for r in rounds]}
    ours, theirs = out["query_events"]["progress_ms"], out["pyspark"]["progress_ms"]
    out["progress_median_ratio"] = round(ours["median"] / theirs["median"], 4)
    out["machine"] = common.machine(load_before)
    common.emit(out)


if __name__ == "__main__":
    main()
