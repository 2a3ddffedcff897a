"""Runs in the driver: where a Kinesis input stream meets Spark Streaming.

Choices, and why:
- Input: ``ssc.textFileStream(<empty dir>).transform(batch_fn)``. A queue stream cannot be
  checkpointed (``getOrCreate`` fails); a file stream on an empty directory can. The batch
  function ignores its (empty) RDD and returns the batch planner's RDD, whose partitions
  executors read.
- ``batch_fn`` is a plain function (``DStream.transform`` reads ``__code__``) whose closure
  holds a ``StreamSpec`` and the decoder: it is pickled into Spark's checkpoint and, in a
  recovered driver, finds a fresh planner and coordinator (registries keyed by the spec).
- Start: ``ssc.start`` is wrapped on the instance, so the coordinator checks the stream and
  takes its first lease *before* Spark starts (a wrong stream fails ``ssc.start()``); once
  Spark has started, the first batch is read at once (``BatchPlanner.read_early``). A
  recovered context was not built by ``createStream``: there the first batch starts the
  coordinator and attaches the listener to ``StreamingContext._activeContext``; until the
  listener is attached batches plan nothing (completion would go unseen, never checkpointed).
- Completion: a ``StreamingListener`` (py4j callback) reports each batch's time, success (an
  output operation with a ``failureReason`` fails the batch) and delays.
- Stop: ``ssc.stop`` is wrapped too. Spark stops first (graceful: every generated batch
  completes), then each coordinator writes what completed and releases its leases.
"""
from __future__ import annotations

import logging
import os
from datetime import datetime
from typing import Any, Callable

from pyspark.streaming import StreamingContext
from pyspark.streaming.listener import StreamingListener

from .planner import BatchPlanner, StreamSpec
from .records import RecordValues
from .registry import planner_for

log = logging.getLogger(__name__)

_HOOKS_ATTR = "_kinesis_dstream_planners"

class BatchListener(StreamingListener):
    """Tells the planners of one StreamingContext when their batches complete."""

    def __init__(self, members: list[BatchPlanner]):
        super().__init__()
        self.members = members

    def onBatchCompleted(self, batchCompleted: Any) -> None:
        try:
            info = batchCompleted.batchInfo()
            time_ms = int(info.batchTime().milliseconds())
            failures = [op.failureReason() for op in info.outputOperationInfos().values()
                        if op.failureReason() is not None]
            processing, scheduling = _delay(info.processingDelay()), _delay(info.schedulingDelay())
        except Exception:  # noqa: BLE001 - raising only reaches the JVM's listener bus
            log.exception("kinesis-dstream: could not read a batch completion")
            return
        for planner in list(self.members):
            try:
                planner.batch_completed(time_ms, not failures, processing, scheduling,
                                        failures[0] if failures else None)
            except Exception:  # noqa: BLE001 - without it this batch is never checkpointed
                log.exception("%s: could not handle the completion of batch %d", planner.name,
                              time_ms)


def _delay(value: Any) -> int | None:
    value = int(value) if value is not None else -1
    return value if value >= 0 else None


def attach(ssc: StreamingContext, planner: BatchPlanner, values: RecordValues) -> None:
    """Wrap the context's start/stop (once), bind the planner to Spark's input tracking and
    let the context's listener report its batches."""
    planner.values = values
    members: list[BatchPlanner] | None = ssc.__dict__.get(_HOOKS_ATTR)
    if members is None:
        members = []
        setattr(ssc, _HOOKS_ATTR, members)
        _wrap_start_stop(ssc, members)
        ssc.addStreamingListener(BatchListener(members))
    if planner in members:
        return
    planner.bind(ssc._jssc)
    members.append(planner)
    planner.attached = True


def _wrap_start_stop(ssc: StreamingContext, members: list[BatchPlanner]) -> None:
    original_start = ssc.start
    original_stop = ssc.stop

    def start() -> None:
        for coordinator in {id(p.coordinator): p.coordinator for p in members}.values():
            coordinator.start()
        original_start()
        first_ms = _first_batch_ms(ssc)
        if first_ms is not None:
            for planner in members:
                planner.read_early(ssc.sparkContext, first_ms, planner.values)

    def stop(stopSparkContext: bool = True, stopGraceFully: bool = False) -> None:
        for planner in members:
            planner.stopping = True  # a read cut short by the stop is no fault to warn about
        try:
            original_stop(stopSparkContext, stopGraceFully)
        finally:
            for coordinator in {id(p.coordinator): p.coordinator for p in members}.values():
                coordinator.stop()

    start.__doc__ = original_start.__doc__
    stop.__doc__ = original_stop.__doc__
    ssc.start = start  # type: ignore[method-assign]
    ssc.stop = stop  # type: ignore[method-assign]


def _first_batch_ms(ssc: StreamingContext) -> int | None:
    """The time of the first batch of a context just started (its graph's zero time plus
    one interval), or None when that cannot be told (a context recovered from a checkpoint
    starts with the batches it missed)."""
    try:
        scala_ssc = ssc._jssc.ssc()
        if scala_ssc.isCheckpointPresent():
            return None
        graph = scala_ssc.graph()
        return int(graph.zeroTime().milliseconds()) + int(graph.batchDuration().milliseconds())
    except Exception as exc:  # noqa: BLE001 - Spark's internals: the first batch reads on time
        log.info("kinesis-dstream: the first batch's time is not known (%s); it is read at "
                 "its time", exc)
        return None


def batch_time_ms(time: datetime) -> int:
    """PySpark hands the batch time as ``datetime.fromtimestamp(ms / 1000)``: undo it."""
    return int(round(time.timestamp() * 1000))


def make_batch_function(spec: StreamSpec, empty_dir: str, values: RecordValues) -> Callable:
    """The transform function of the Kinesis DStream (see the module docstring)."""

    def kinesis_batch(time, rdd):
        planner = planner_for(spec)
        if not planner.attached:  # a recovered context: attach to it now
            os.makedirs(empty_dir, exist_ok=True)
            ssc = StreamingContext._activeContext
            if ssc is None:
                return rdd.context.emptyRDD()
            attach(ssc, planner, values)
            planner.coordinator.start()
        return planner.batch_rdd(rdd.context, batch_time_ms(time), values)

    return kinesis_batch
