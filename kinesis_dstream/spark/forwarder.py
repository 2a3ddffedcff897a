"""The record processor that runs in each worker process and forwards records to the driver.

``python -m kinesis_dstream worker ... --processor-factory
kinesis_dstream.spark.forwarder:make_factory --factory-args JSON`` runs it. Each shard's
``process_records`` sends its records over the channel and waits for the driver's ack,
so a full driver buffer stops that shard's fetching. Checkpoints come *from* the driver,
once the batch holding a position has completed; ``shard_ended`` and
``shutdown_requested`` wait until the driver says the shard's records are processed.
If the driver goes away the worker shuts itself down without checkpointing (the next
owner re-reads from the last checkpoint). No pyspark import here.

After a lease moved between two workers of one driver, the driver may ask the new owner
for a position its predecessor read and the new owner has not re-read yet (the engine
would refuse it: "beyond the last record delivered"). Such a checkpoint waits here and is
written as soon as this worker has delivered that far; a final checkpoint at shutdown is
cut back to what this worker delivered.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from queue import Empty, Queue
from typing import Any

from ..errors import CheckpointError
from ..worker.processor import (
    Checkpointer,
    InitializeInput,
    LeaseLostInput,
    ProcessorFactory,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from . import channel

log = logging.getLogger(__name__)

# After the driver is gone the worker shuts down gracefully; this bounds how long.
ORPHAN_EXIT_AFTER_S = 30.0


class DriverLink:
    """This worker process's connection to the driver, shared by its shard processors.

    ``defer_checkpoints``: the driver's checkpoint commands wait until the processor calls
    ``apply_deferred`` instead of being written at once by a background thread. Under the
    multilang protocol (the Java MultiLangDaemon) a checkpoint is only accepted while the
    child is inside a callback, on the thread that handles it.
    """

    def __init__(self, address: tuple[str, int], authkey_path: str, worker_id: str,
                 defer_checkpoints: bool = False):
        self.worker_id = worker_id
        self.defer_checkpoints = defer_checkpoints
        self._deferred: dict[str, tuple] = {}  # shard_id -> the latest CHECKPOINT command
        self._pending: dict[str, tuple] = {}  # shard_id -> a CHECKPOINT beyond what was delivered
        self._delivered: dict[str, tuple[int, int]] = {}  # shard_id -> last position delivered
        self._leased: set[str] = set()  # initialized here and not yet lost, ended or shut down
        self._conn = channel.connect(address, authkey_path)
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._replies: dict[str, Queue] = {}  # shard_id -> acks and drain replies
        self._checkpointers: dict[str, Checkpointer] = {}
        self._commands: Queue = Queue()
        self.driver_gone = threading.Event()
        self.send((channel.HELLO, worker_id, os.getpid()))
        threading.Thread(target=self._read_loop, name="driver-link-reader", daemon=True).start()
        if not defer_checkpoints:
            threading.Thread(target=self._checkpoint_loop, name="driver-link-checkpoints",
                             daemon=True).start()

    # --- sending -------------------------------------------------------------------------
    def send(self, message: tuple) -> bool:
        if self.driver_gone.is_set():
            return False
        with self._send_lock:
            try:
                self._conn.send(message)
                return True
            except (OSError, EOFError, ValueError) as exc:
                self._lost_driver(f"send failed: {exc}")
                return False

    def request(self, shard_id: str, message: tuple, timeout_s: float | None = None) -> tuple | None:
        """Send and wait for this shard's next reply; None if the driver is gone or time ran out."""
        replies = self._reply_queue(shard_id)
        if not self.send(message):
            return None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0:
                return None
            try:
                reply = replies.get(timeout=wait)
            except Empty:
                if self.driver_gone.is_set():
                    return None
                continue
            if reply is None:  # the driver went away
                return None
            return reply

    def _reply_queue(self, shard_id: str) -> Queue:
        with self._lock:
            return self._replies.setdefault(shard_id, Queue())

    # --- checkpointers -------------------------------------------------------------------
    def hold_checkpointer(self, shard_id: str, checkpointer: Checkpointer) -> None:
        with self._lock:
            self._checkpointers[shard_id] = checkpointer

    def forget(self, shard_id: str) -> None:
        """The lease is gone: no checkpoint of this shard from now on."""
        with self._lock:
            self._checkpointers.pop(shard_id, None)
            self._deferred.pop(shard_id, None)
            self._pending.pop(shard_id, None)
            self._delivered.pop(shard_id, None)
            self._leased.discard(shard_id)

    def lease_started(self, shard_id: str) -> None:
        """A new lease: nothing of an earlier lease of this shard applies."""
        self.forget(shard_id)
        with self._lock:
            self._leased.add(shard_id)

    def delivered(self, shard_id: str, sequence_number: str, sub_sequence_number: int | None) -> None:
        """The engine handed this worker records up to here; a waiting checkpoint that is
        now covered is written (on the caller's thread: inside process_records)."""
        position = _key(sequence_number, sub_sequence_number)
        with self._lock:
            self._delivered[shard_id] = position
            message = self._pending.get(shard_id)
            if message is None or _key(message[2], message[3]) > position:
                return
            del self._pending[shard_id]
        self._apply(message)

    def delivered_position(self, shard_id: str) -> tuple[int, int] | None:
        with self._lock:
            return self._delivered.get(shard_id)

    def checkpoint(self, shard_id: str, sequence_number: str | None,
                   sub_sequence_number: int | None) -> str | None:
        """Write a checkpoint; returns the KCL error name instead of raising."""
        with self._lock:
            checkpointer = self._checkpointers.get(shard_id)
        if checkpointer is None:
            log.info("%s: not checkpointing %s/%s: lease no longer held",
                     shard_id, sequence_number, sub_sequence_number)
            return "ShutdownException"
        try:
            checkpointer.checkpoint(sequence_number, sub_sequence_number)
        except CheckpointError as exc:
            log.warning("%s: checkpoint at %s/%s refused: %s",
                        shard_id, sequence_number, sub_sequence_number, exc)
            if exc.value == "ShutdownException":
                self.forget(shard_id)
            return exc.value
        position = "SHARD_END" if sequence_number is None else sequence_number
        self.send((channel.CHECKPOINTED, shard_id, position, sub_sequence_number, None))
        return None

    # --- background loops ----------------------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError) as exc:
                self._lost_driver(f"connection closed ({exc or 'EOF'})")
                return
            kind = message[0]
            if kind == channel.CHECKPOINT and self.defer_checkpoints:
                with self._lock:  # positions only grow: the latest command covers the earlier
                    self._deferred[message[1]] = message
            elif kind == channel.CHECKPOINT:
                self._commands.put(message)
            elif kind in (channel.ACK, channel.DRAINED):
                self._reply_queue(message[1]).put(message)
            else:
                log.warning("ignoring unknown message %r from the driver", kind)

    def _checkpoint_loop(self) -> None:
        while True:
            message = self._commands.get()
            if message is None:
                return
            self._apply(message)

    def apply_deferred(self, shard_id: str) -> None:
        """Write the shard's latest deferred checkpoint, if any (``defer_checkpoints``)."""
        with self._lock:
            message = self._deferred.pop(shard_id, None)
        if message is not None:
            self._apply(message)

    def _apply(self, message: tuple) -> None:
        _, shard_id, sequence_number, sub_sequence_number = message
        with self._lock:  # with delivered(): a command is either written or waits, never lost
            delivered = self._delivered.get(shard_id)
            if shard_id in self._leased and (
                    delivered is None or _key(sequence_number, sub_sequence_number) > delivered):
                log.debug("%s: checkpoint at %s/%s waits until this worker re-read that far",
                          shard_id, sequence_number, sub_sequence_number)
                self._pending[shard_id] = message  # positions only grow: the latest covers
                return
        error = self.checkpoint(shard_id, sequence_number, sub_sequence_number)
        if error is not None:
            self.send((channel.CHECKPOINTED, shard_id, sequence_number, sub_sequence_number, error))

    def _lost_driver(self, why: str) -> None:
        if self.driver_gone.is_set():
            return
        self.driver_gone.set()
        log.warning("worker %s: lost the Spark driver (%s); shutting down without checkpointing",
                    self.worker_id, why)
        with self._lock:
            self._checkpointers.clear()
            queues = list(self._replies.values())
        for q in queues:
            q.put(None)
        self._commands.put(None)
        # The worker's own SIGTERM handling shuts the scheduler down and releases the leases.
        os.kill(os.getpid(), signal.SIGTERM)
        timer = threading.Timer(ORPHAN_EXIT_AFTER_S, os._exit, args=(3,))
        timer.daemon = True
        timer.start()


def _key(sequence_number: str, sub_sequence_number: int | None) -> tuple[int, int]:
    return int(sequence_number), int(sub_sequence_number or 0)


class ForwardingProcessor(RecordProcessor):
    """One per shard lease: forwards records, checkpoints only when the driver says so."""

    def __init__(self, link: DriverLink, shard_id: str, drain_timeout_s: float):
        self.link = link
        self.shard_id = shard_id
        self.drain_timeout_s = drain_timeout_s

    def initialize(self, initialize_input: InitializeInput) -> None:
        self.shard_id = initialize_input.shard_id or self.shard_id
        self.link.lease_started(self.shard_id)
        self.link.send((channel.INIT, self.shard_id, initialize_input.sequence_number,
                        initialize_input.sub_sequence_number))

    def _checkpointer(self, checkpointer: Checkpointer) -> Checkpointer:
        """The checkpointer to hold; a hook for the amazon-kclpy child (kclpy_child.py)."""
        return checkpointer

    @staticmethod
    def _wire(record: Any) -> tuple:
        """(data, partition key, seq, sub, arrival epoch ms); a hook for the kclpy child."""
        return (record.binary_data, record.partition_key, record.sequence_number,
                record.sub_sequence_number, record.approximate_arrival_timestamp)

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        self.link.hold_checkpointer(self.shard_id,
                                    self._checkpointer(process_records_input.checkpointer))
        records = process_records_input.records
        lag = process_records_input.millis_behind_latest
        if not records:
            self.link.send((channel.LAG, self.shard_id, lag))
            return
        wire = [self._wire(r) for r in records]
        # Blocks while the driver's buffer is full: backpressure on this shard's fetching.
        self.link.request(self.shard_id, (channel.RECORDS, self.shard_id, wire, lag))
        self.link.delivered(self.shard_id, wire[-1][2], wire[-1][3])

    def lease_lost(self, lease_lost_input: LeaseLostInput) -> None:
        self.link.forget(self.shard_id)
        self.link.send((channel.LOST, self.shard_id))

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        self.link.hold_checkpointer(self.shard_id,
                                    self._checkpointer(shard_ended_input.checkpointer))
        reply = self.link.request(self.shard_id, (channel.DRAIN, self.shard_id, "shard_end"))
        self._final_checkpoint(reply, at_shard_end=True)

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        self.link.hold_checkpointer(self.shard_id,
                                    self._checkpointer(shutdown_requested_input.checkpointer))
        reply = self.link.request(self.shard_id, (channel.DRAIN, self.shard_id, "shutdown"),
                                  timeout_s=self.drain_timeout_s)
        self._final_checkpoint(reply, at_shard_end=False)

    def _final_checkpoint(self, reply: tuple | None, at_shard_end: bool) -> None:
        if reply is None:
            log.warning("%s: driver gone or not answering; no final checkpoint", self.shard_id)
            self.link.forget(self.shard_id)
            return
        _, _, sequence_number, sub_sequence_number, complete = reply
        if at_shard_end and complete:
            self.link.checkpoint(self.shard_id, None, None)  # SHARD_END: children may start
        elif sequence_number is not None:
            delivered = self.link.delivered_position(self.shard_id)
            if delivered is not None and _key(sequence_number, sub_sequence_number) > delivered:
                # Processed by the driver, read by this shard's previous owner, not yet
                # re-read here: what this worker delivered is processed too; write that.
                sequence_number, sub_sequence_number = str(delivered[0]), delivered[1]
            if delivered is not None:
                self.link.checkpoint(self.shard_id, sequence_number, sub_sequence_number)
        self.link.forget(self.shard_id)


_link: DriverLink | None = None


def make_factory(address: Any, authkey_file: str, worker_id: str,
                 drain_timeout_s: float = 15.0) -> ProcessorFactory:
    """Entry point named by ``--processor-factory``; connects to the driver once per process."""
    global _link
    if _link is None:
        _link = DriverLink(tuple(address), authkey_file, worker_id)
    link = _link

    def factory(shard_id: str) -> RecordProcessor:
        return ForwardingProcessor(link, shard_id, drain_timeout_s)

    return factory
