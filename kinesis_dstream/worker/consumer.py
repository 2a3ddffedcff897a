"""One shard lease's life on its own thread (the KCL's ShardConsumer and its states).

WAITING_ON_PARENTS -> INITIALIZING -> PROCESSING -> SHUTTING_DOWN -> SHUT_DOWN.
Fetch errors never drop a record: the record source keeps its position and the consumer
waits (paced by the retrieval ``Pacer``, as every read loop is) and asks again. A processor
that raises (or a multilang child that died) is replaced and fetching restarts from the
last checkpoint, so what it had not checkpointed comes again; once the lease is lost there
is no replacement: the processor that was running gets lease_lost (the KCL's lifecycle),
whatever it raised. A permanent read error (AccessDenied, a stream or shard not found, a
refused argument: ``retry.classify``) is never waited out while the lease is held: the
consumer stops (``failure`` names the cause, the stream and the shard), its processor gets
lease_lost, and the scheduler releases the lease for another worker to take.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..aws.stream_identifier import StreamIdentifier
from ..config import ConsumerConfig
from ..errors import (
    ConsumerRegistrationError,
    ExpiredIteratorError,
    KinesisDStreamError,
    LeaseLostError,
    RetriesExhaustedError,
)
from ..records import ExtendedSequenceNumber
from ..retrieval.pacer import Pacer
from ..retrieval.source import RecordSource
from ..retry import Backoff, FaultLog, is_throttling, is_transient
from .checkpoint import ShardCheckpointer
from .metrics import MetricsPublisher, ShardMetricsRecorder
from .processor import (
    InitializeInput,
    LeaseLostInput,
    ProcessorFactory,
    ProcessRecordsInput,
    ShardEndedInput,
    ShardRecordProcessor,
    ShutdownRequestedInput,
)

log = logging.getLogger(__name__)


class ConsumerState(enum.Enum):
    WAITING_ON_PARENTS = "waiting on parents"
    INITIALIZING = "initializing"
    PROCESSING = "processing"
    SHUTTING_DOWN = "shutting down"
    SHUT_DOWN = "shut down"


class ShutdownReason(enum.Enum):
    LEASE_LOST = "lease lost"
    SHARD_END = "shard end"
    REQUESTED = "requested"
    FAILED = "failed"  # a permanent read error: the lease is released, not waited on


# Permanent by kind, but waited out all the same: a retry policy gives up only on what is
# transient, an iterator that keeps expiring gets a new one on the next call, and a fan-out
# consumer deregistered behind the worker stalls its shards until the worker is restarted
# (never ends them: test_worker_fanout).
_WAITED_OUT = (RetriesExhaustedError, ExpiredIteratorError, ConsumerRegistrationError)


def is_permanent_read_error(exc: KinesisDStreamError) -> bool:
    """A read error that another try cannot cure (AccessDenied, ResourceNotFound, ...)."""
    return not is_transient(exc) and not isinstance(exc, _WAITED_OUT)


@dataclass
class ShardMetrics:
    shard_id: str
    state: str
    records: int
    millis_behind_latest: int | None
    owner: str | None
    last_checkpoint: str
    last_delivered: str | None
    subscriptions: int = 0  # fan-out: SubscribeToShard calls that opened a subscription
    resubscriptions: int = 0  # of those, the ones after a subscription ended


class ShardConsumer:
    def __init__(self, config: ConsumerConfig, shard_id: str, processor_factory: ProcessorFactory,
                 make_fetcher: Callable[[str], RecordSource],
                 read_checkpoint: Callable[[str], ExtendedSequenceNumber],
                 write_checkpoint: Callable[[str, ExtendedSequenceNumber], object],
                 parents_done: Callable[[str], bool],
                 on_shard_end: Callable[[str, list[str]], None],
                 metrics: MetricsPublisher | None = None,
                 stream_identifier: StreamIdentifier | None = None):
        self.config = config
        # The lease key: the shard id, or in multi-stream mode account:stream:epoch:shardId.
        self.shard_id = shard_id
        self.stream_identifier = stream_identifier
        self._processor_factory = processor_factory
        self._make_fetcher = make_fetcher
        self._read_checkpoint = read_checkpoint
        self._write_checkpoint = write_checkpoint
        self._parents_done = parents_done
        self._on_shard_end = on_shard_end
        self._metrics = ShardMetricsRecorder(metrics, shard_id)
        self.state = ConsumerState.WAITING_ON_PARENTS
        self.records_delivered = 0
        self.millis_behind_latest: int | None = None
        self.checkpointer: ShardCheckpointer | None = None
        self._reason: ShutdownReason | None = None
        self.failure: KinesisDStreamError | None = None  # why it stopped, when FAILED
        self._wake = threading.Event()
        # Restarts of a processor that keeps failing wait longer each time, up to 10 s.
        self._restart_backoff = Backoff(base_ms=config.retry_wait_time_ms)
        # Subscriptions of the sources closed so far, and the one being read.
        self._subscriptions = self._resubscriptions = 0
        self._source: RecordSource | None = None
        self._thread = threading.Thread(target=self._run, name=f"shard-{shard_id}", daemon=True)

    # -- control, from the scheduler ------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def lease_lost(self) -> None:
        self._reason = ShutdownReason.LEASE_LOST
        if self.checkpointer is not None:
            self.checkpointer.close("lease lost")
        self._wake.set()

    def request_shutdown(self) -> None:
        if self._reason is None:
            self._reason = ShutdownReason.REQUESTED
        self._wake.set()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def done(self) -> bool:
        return self.state is ConsumerState.SHUT_DOWN

    @property
    def shutdown_reason(self) -> ShutdownReason | None:
        return self._reason

    # -- the thread -------------------------------------------------------------------------------
    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)

    def _run(self) -> None:
        try:
            while self._reason is None and not self._parents_done(self.shard_id):
                self._sleep(self.config.parent_shard_poll_interval_ms / 1000.0)
            while self._reason is None:
                if self._run_processor():
                    break
        except LeaseLostError as exc:  # reading the checkpoint found the lease gone
            log.info("shard consumer %s stops: %s", self.shard_id, exc)
            if self._reason is None:
                self._reason = ShutdownReason.LEASE_LOST
        except Exception:  # noqa: BLE001 - the thread must not die silently
            log.exception("shard consumer %s failed; its lease will be released", self.shard_id)
            if self._reason is None:
                self._reason = ShutdownReason.REQUESTED
        finally:
            self.state = ConsumerState.SHUT_DOWN

    def _run_processor(self) -> bool:
        """Run one processor instance; True when the shard is finished with, False to restart it."""
        self.state = ConsumerState.INITIALIZING
        checkpoint = self._read_checkpoint(self.shard_id)
        self.checkpointer = ShardCheckpointer(self.shard_id, self._write_checkpoint, checkpoint)
        if self._reason is ShutdownReason.LEASE_LOST:
            self.checkpointer.close("lease lost")
        fetcher = self._source = self._make_fetcher(self.shard_id)
        try:
            # No processor is made for a shard we are told to leave before it could start: a
            # processor that exists always gets initialize and, unless it fails, a final call.
            if not self._initialize_fetcher(fetcher, checkpoint):
                return True
            processor = self._processor_factory(self.shard_id)
            try:
                stream = self.stream_identifier
                self._call(processor.initialize, InitializeInput(
                    shard_id=self.shard_id if stream is None
                    else self.shard_id[len(stream.serialize()) + 1:],
                    sequence_number=checkpoint.sequence_number,
                    sub_sequence_number=checkpoint.sub_sequence_number,
                    stream_identifier=stream))
                self.state = ConsumerState.PROCESSING
                return self._process_loop(fetcher, processor)
            except _ProcessorFailed as failure:
                return self._processor_failed(processor, failure)
        finally:
            # A subscription ends with its reader: on a lost lease the next owner's
            # subscription takes over, and this one must not take it back.
            fetcher.close()
            self._subscriptions += getattr(fetcher, "subscriptions", 0)
            self._resubscriptions += getattr(fetcher, "resubscriptions", 0)
            self._source = None

    def _processor_failed(self, processor: ShardRecordProcessor, failure: "_ProcessorFailed") -> bool:
        """After a callback raised: restart from the checkpoint, unless the lease is gone.

        A lease lost before or during the back-off ends the shard here with lease_lost to
        this processor (often what it raised was the checkpoint's ShutdownException). A
        requested shutdown only closes it: shutdown_requested would let a processor that
        failed mid-batch checkpoint records it never finished.
        """
        if self._reason is None:
            checkpointer = self.checkpointer
            assert checkpointer is not None  # made before the processor that failed
            wait = self._restart_backoff.next_wait_s()
            log.error("record processor for %s failed (%s); restarting it from checkpoint %s "
                      "in %.3g s", self.shard_id, failure.__cause__,
                      checkpointer.last_checkpoint, wait)
            self._sleep(wait)
        else:
            log.warning("record processor for %s failed (%s) while its lease was ending (%s)",
                        self.shard_id, failure.__cause__, self._reason.value)
        if self._reason is ShutdownReason.LEASE_LOST:
            self._shut_down(processor)
        self._close_quietly(processor)
        return self._reason is not None

    def _initialize_fetcher(self, fetcher: RecordSource, checkpoint: ExtendedSequenceNumber) -> bool:
        """Get the first iterator, waiting out throttling and outages; False if told to stop."""
        pacer = self._pacer(f"getting an iterator at {checkpoint}")
        while self._reason is None:
            try:
                fetcher.initialize(checkpoint)
                pacer.succeeded()
                return True
            except KinesisDStreamError as exc:
                if is_permanent_read_error(exc):
                    self._fail(exc)
                    return False
                self._pause(pacer, exc)
        return False

    def _fail(self, exc: KinesisDStreamError) -> None:
        """Stop on a permanent read error; the scheduler releases the lease (``FAILED``)."""
        stream = self.stream_identifier or self.config.stream_name
        log.error("shard consumer for shard %s of stream %s stops, releasing its lease: a "
                  "permanent error, which retrying cannot cure: %s (fix the cause: "
                  "permissions, stream, key or setting; another worker may take the lease)",
                  self.shard_id, stream, exc)
        self.failure = exc
        if self._reason is None:
            self._reason = ShutdownReason.FAILED
        if self.checkpointer is not None:
            self.checkpointer.close(f"read failed: {exc}")

    def _pacer(self, what: str) -> Pacer:
        """A shard consumer never gives up on a read: no deadline, no throttle patience."""
        return Pacer(Backoff.after_retries(self.config),
                     FaultLog(log, f"shard {self.shard_id}: {what}"))

    def _pause(self, pacer: Pacer, exc: KinesisDStreamError) -> None:
        """Wait as the pacer says after ``exc``; a refusal for throughput is a metric too."""
        if is_throttling(exc):
            self._metrics.throttled(1)
        wait = pacer.pause(exc)
        assert wait is not None  # no deadline: the pacer always says how long
        self._sleep(wait)

    def _process_loop(self, fetcher: RecordSource, processor: ShardRecordProcessor) -> bool:
        checkpointer = self.checkpointer
        assert checkpointer is not None
        pacer = self._pacer("SubscribeToShard" if fetcher.pushes else "GetRecords")
        while True:
            if self._reason is not None:
                return self._shut_down(processor)
            started = time.monotonic()
            try:
                result = fetcher.get_records()
                if not fetcher.pushes:  # the KCL's GetRecords metrics are polling's only
                    self._metrics.get_records(True, (time.monotonic() - started) * 1000)
                pacer.succeeded()
            except KinesisDStreamError as exc:
                if not is_throttling(exc) and not fetcher.pushes:  # a refusal: see _pause
                    self._metrics.get_records(False, (time.monotonic() - started) * 1000)
                if is_permanent_read_error(exc):
                    self._fail(exc)
                    return self._shut_down(processor)
                self._pause(pacer, exc)
                continue
            self.millis_behind_latest = result.millis_behind_latest
            processing_ms = None
            if result.records or self.config.call_process_records_even_for_empty_record_list:
                checkpointer.delivered(result.records)
                started = time.monotonic()
                self._call(processor.process_records, ProcessRecordsInput(
                    records=result.records, checkpointer=checkpointer,
                    millis_behind_latest=result.millis_behind_latest))
                processing_ms = (time.monotonic() - started) * 1000
                self._restart_backoff.reset()
                self.records_delivered += len(result.records)
            self._metrics.processed(len(result.records),
                                    sum(len(r.binary_data) for r in result.records),
                                    result.millis_behind_latest, processing_ms)
            if result.shard_end:
                return self._shard_end(processor, result.child_shard_ids)
            if fetcher.pushes:
                continue  # the next get_records waits for the next pushed event
            if result.at_tip(self.config.max_records):
                self._sleep(self.config.idle_time_between_reads_ms / 1000.0)
            elif not result.is_full_page(self.config.max_records):
                # behind: keep up, within Kinesis' 5 reads/s
                self._sleep(min(self.config.idle_time_between_reads_ms / 1000.0, 0.2))

    def _call(self, method: Callable[[Any], None], argument: Any) -> None:
        try:
            method(argument)
        except Exception as exc:  # noqa: BLE001 - re-raised as a restart request
            raise _ProcessorFailed() from exc

    def _shard_end(self, processor: ShardRecordProcessor, child_shard_ids: list[str]) -> bool:
        checkpointer = self.checkpointer
        assert checkpointer is not None
        self.state = ConsumerState.SHUTTING_DOWN
        checkpointer.reached_shard_end()
        backoff = Backoff.after_retries(self.config)
        attempt = 0
        while self._reason is None:
            self._call(processor.shard_ended, ShardEndedInput(checkpointer=checkpointer))
            if checkpointer.last_checkpoint.is_shard_end:
                self._reason = ShutdownReason.SHARD_END
                self._on_shard_end(self.shard_id, child_shard_ids)
                return True
            attempt += 1
            log.error("processor of %s did not checkpoint at shard end (attempt %d); its children "
                      "wait until it does", self.shard_id, attempt)
            self._sleep(backoff.next_wait_s())
        return self._shut_down(processor)

    def _shut_down(self, processor: ShardRecordProcessor) -> bool:
        self.state = ConsumerState.SHUTTING_DOWN
        checkpointer = self.checkpointer
        assert checkpointer is not None
        try:
            if self._reason in (ShutdownReason.LEASE_LOST, ShutdownReason.FAILED):
                # FAILED: the lease is given up unread, so no checkpoint may follow.
                checkpointer.close("lease lost")
                processor.lease_lost(LeaseLostInput())
            elif self._reason is ShutdownReason.REQUESTED:
                processor.shutdown_requested(ShutdownRequestedInput(checkpointer=checkpointer))
                checkpointer.close("shut down")
        except Exception:  # noqa: BLE001 - the shard is finishing anyway
            log.exception("record processor of %s failed while shutting down", self.shard_id)
        return True

    def _close_quietly(self, processor: ShardRecordProcessor) -> None:
        close = getattr(processor, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001
                log.exception("closing the failed processor of %s", self.shard_id)

    def metrics(self, owner: str | None) -> ShardMetrics:
        checkpointer = self.checkpointer
        source = self._source
        return ShardMetrics(
            shard_id=self.shard_id, state=self.state.value, records=self.records_delivered,
            millis_behind_latest=self.millis_behind_latest, owner=owner,
            last_checkpoint=str(checkpointer.last_checkpoint) if checkpointer else "",
            last_delivered=str(checkpointer.largest_permitted)
            if checkpointer and checkpointer.largest_permitted else None,
            subscriptions=self._subscriptions + getattr(source, "subscriptions", 0),
            resubscriptions=self._resubscriptions + getattr(source, "resubscriptions", 0))


class _ProcessorFailed(Exception):
    """A processor callback raised: restart the processor from the last checkpoint."""
