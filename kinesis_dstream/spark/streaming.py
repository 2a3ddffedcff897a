"""Where the receiver meets Spark Streaming: the batch function, the listener, the context hooks.

Choices, and why:
- Input: ``ssc.textFileStream(<empty dir>).transform(batch_fn)``. A queue stream cannot be
  checkpointed (``getOrCreate`` fails); a file stream on an empty directory can, and the
  batch function ignores its (empty) RDD and drains the receiver's buffer instead.
- ``batch_fn`` is a plain function (``DStream.transform`` reads ``__code__``) whose closure
  holds a ``StreamSpec`` and the decoder: it is pickled into Spark's checkpoint and, in a
  recovered driver, builds a fresh receiver with fresh workers.
- Start: ``ssc.start`` is wrapped on the instance, so workers start with the context. A
  recovered context was not built by ``createStream``: there the first batch starts the
  workers and attaches the hooks to ``StreamingContext._activeContext``; until the listener
  is attached batches take no records (completion would go unseen, so never checkpointed).
- Completion: a ``StreamingListener`` (py4j callback) reports each batch's time, success
  (an output operation with a ``failureReason`` fails the batch) and delays.
- Stop: ``ssc.stop`` is wrapped on the instance. It stops the workers *before* the real stop
  so that, when graceful, batches keep running while each worker waits for its shards'
  records to complete, checkpoints them and releases its leases; then Spark stops.
"""
from __future__ import annotations

import logging
import os
import threading
from datetime import datetime
from typing import Any, Callable

from pyspark.streaming import StreamingContext
from pyspark.streaming.listener import StreamingListener

from .receiver import KinesisReceiver, StreamSpec, receiver_for
from .records import KinesisRecord

log = logging.getLogger(__name__)

_HOOKS_ATTR = "_kinesis_dstream_receivers"


class BatchListener(StreamingListener):
    """Tells one receiver when its batches complete, and whether they failed."""

    def __init__(self, receiver: KinesisReceiver):
        super().__init__()
        self.receiver = receiver

    def onBatchCompleted(self, batchCompleted: Any) -> None:
        try:
            info = batchCompleted.batchInfo()
            time_ms = int(info.batchTime().milliseconds())
            failures = [op.failureReason() for op in info.outputOperationInfos().values()
                        if op.failureReason() is not None]
            self.receiver.batch_completed(
                time_ms, succeeded=not failures,
                processing_delay_ms=_delay(info.processingDelay()),
                scheduling_delay_ms=_delay(info.schedulingDelay()),
                failure=failures[0] if failures else None)
        except Exception:
            # Raising would only reach the JVM's listener bus; without this batch's completion
            # its positions are never checkpointed (safe), so say so loudly and go on.
            log.exception("%s: could not handle a batch completion", self.receiver.name)


def _delay(value: Any) -> int | None:
    value = int(value) if value is not None else -1
    return value if value >= 0 else None


def attach(ssc: StreamingContext, receiver: KinesisReceiver) -> None:
    """Wrap the context's start/stop (once) and register the receiver's listener."""
    receivers: list[KinesisReceiver] | None = ssc.__dict__.get(_HOOKS_ATTR)
    if receivers is None:
        receivers = []
        setattr(ssc, _HOOKS_ATTR, receivers)
        _wrap_start_stop(ssc, receivers)
    if receiver in receivers:
        return
    receivers.append(receiver)
    ssc.addStreamingListener(BatchListener(receiver))
    receiver.listening = True


def _wrap_start_stop(ssc: StreamingContext, receivers: list[KinesisReceiver]) -> None:
    original_start = ssc.start
    original_stop = ssc.stop

    def start() -> None:
        original_start()
        for receiver in list(receivers):
            receiver.start()

    def stop(stopSparkContext: bool = True, stopGraceFully: bool = False) -> None:
        stoppers = [threading.Thread(target=r.stop_workers, args=(stopGraceFully,), daemon=True)
                    for r in list(receivers)]
        try:
            for t in stoppers:
                t.start()
            for t in stoppers:
                t.join()
        finally:
            try:
                original_stop(stopSparkContext, stopGraceFully)
            finally:
                for receiver in list(receivers):
                    receiver.close()

    start.__doc__ = original_start.__doc__
    stop.__doc__ = original_stop.__doc__
    ssc.start = start  # type: ignore[method-assign]
    ssc.stop = stop  # type: ignore[method-assign]


def batch_time_ms(time: datetime) -> int:
    """PySpark hands the batch time as ``datetime.fromtimestamp(ms / 1000)``: undo it."""
    return int(round(time.timestamp() * 1000))


def make_batch_function(spec: StreamSpec, empty_dir: str, decoder: Callable | None,
                        message_handler: Callable | None) -> Callable:
    """The transform function of the Kinesis DStream (see the module docstring)."""

    def kinesis_batch(time, rdd):
        receiver = receiver_for(spec)
        if receiver.closed:
            return rdd.context.emptyRDD()
        if not receiver.listening:  # a recovered context: attach to it now
            os.makedirs(empty_dir, exist_ok=True)
            ssc = StreamingContext._activeContext
            if ssc is not None:
                attach(ssc, receiver)
            receiver.start()
        runs = receiver.next_batch(batch_time_ms(time))
        sc = rdd.context
        if not runs:
            return sc.emptyRDD()
        if message_handler is not None:
            items = [(*r, shard_id) for shard_id, records in runs for r in records]
            handler = message_handler
            return sc.parallelize(items, sc.defaultParallelism).map(
                lambda t: handler(KinesisRecord(*t)))
        if decoder is None:
            return sc.parallelize([r[0] for _, records in runs for r in records],
                                  sc.defaultParallelism)
        labelled = [(r[0], shard_id, r[2], r[3]) for shard_id, records in runs for r in records]
        return sc.parallelize(labelled, sc.defaultParallelism).map(naming_decoder(decoder))

    return kinesis_batch


def naming_decoder(decoder: Callable) -> Callable:
    """Wrap the decoder so an undecodable record fails its batch naming shard and position.

    The batch then fails, so nothing in it is checkpointed and the record is read again after
    a fix and restart; without the wrapper Spark would report a bare UnicodeDecodeError.
    Only builtins are referenced, so executors need nothing but pyspark to unpickle it.
    """
    name = getattr(decoder, "__name__", repr(decoder))

    def decode(item):
        data, shard_id, sequence_number, sub_sequence_number = item
        try:
            return decoder(data)
        except Exception as exc:
            raise ValueError(
                f"{name} cannot decode the record at {sequence_number}/{sub_sequence_number} of "
                f"shard {shard_id} ({data[:32]!r}...): {type(exc).__name__}: {exc}; the batch "
                f"failed, so this shard is not checkpointed past it") from exc

    return decode
