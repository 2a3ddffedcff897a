"""KinesisReceiver: the driver side of one Kinesis DStream.

Records arrive from the worker processes over the channel into a bounded buffer; each
batch takes what is there (within the rate limit) and remembers, per shard, the highest
position it holds; when Spark reports the batch completed, KinesisCheckpointer decides what
the workers write. Receivers live in a module registry keyed by the stream's id, so the
batch function (pickled into Spark's checkpoint with configuration only) finds its
receiver, or builds a fresh one after ``getOrCreate`` recovery. A lease moving between
this driver's workers costs no duplicate: the new owner's re-reads of records already
received are dropped (buffer.py) and the shard's checkpoints go on from where its batches
are (checkpointer.py). No pyspark import here:
the Spark hooks are in ``listener.py``.
"""
from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..config import ConsumerConfig
from . import channel
from .buffer import RecordBuffer, WireRecord
from .checkpointer import KinesisCheckpointer, Position
from .rate import RateController, RateSettings
from .worker_processes import WorkerProcesses

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamSpec:
    """What the batch function carries into Spark's checkpoint: configuration only."""

    key: str
    config: dict  # ConsumerConfig.to_dict()
    num_workers: int = 1
    max_buffered_records: int = 100_000
    batch_interval_ms: int = 1000
    rate: RateSettings = field(default_factory=RateSettings)
    stop_timeout_s: float = 30.0
    engine: str = "python"  # or "java-kcl": Java MultiLangDaemons instead of our workers

    @property
    def consumer_config(self) -> ConsumerConfig:
        return ConsumerConfig.from_dict(self.config)


@dataclass
class ShardStats:
    records: int = 0  # received and buffered, each once
    duplicates_dropped: int = 0  # re-read by a new owner after a lease move: already here
    millis_behind_latest: int | None = None
    owner: str | None = None
    last_checkpoint: str | None = None
    state: str = "processing"

    def as_dict(self) -> dict[str, Any]:
        return dict(records=self.records, duplicates_dropped=self.duplicates_dropped,
                    millis_behind_latest=self.millis_behind_latest,
                    owner=self.owner, last_checkpoint=self.last_checkpoint, state=self.state)


@dataclass
class BatchRecord:
    records: int
    shards: int
    max_lag_ms: int | None


class KinesisReceiver:
    def __init__(self, spec: StreamSpec):
        self.spec = spec
        self.config = spec.consumer_config
        self.name = f"kinesis-dstream[{self.config.stream_name}]"
        self.buffer = RecordBuffer(spec.max_buffered_records)
        self.checkpointer = KinesisCheckpointer(self.config.checkpoint_interval_ms / 1000.0)
        self.rate = RateController(spec.rate, spec.batch_interval_ms)
        self._lock = threading.RLock()
        self._shards: dict[str, ShardStats] = {}
        self._owners: dict[str, channel.Peer] = {}
        self._drains: dict[str, tuple[channel.Peer, str]] = {}
        self._dropping: dict[str, list] = {}  # shard -> [worker id, dropped]: one log line a move
        self._batches: dict[int, BatchRecord] = {}
        self._directory: str | None = None
        self._server: channel.ChannelServer | None = None
        self.workers: WorkerProcesses | None = None
        self.started = False
        self.closed = False
        self.listening = False  # a StreamingListener reports batch completion to us
        self._answer_drains_now = False
        self._stop_event = threading.Event()

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker processes (idempotent); called when the StreamingContext starts."""
        with self._lock:
            if self.started or self.closed:
                return
            self.started = True
            self._directory = tempfile.mkdtemp(prefix="kinesis-dstream-")  # mode 0700
            self._server = channel.ChannelServer(self._directory, self._on_message,
                                                 self._on_disconnect, name=self.name)
            factory_args = dict(address=list(self._server.address),
                                authkey_file=self._server.authkey_path,
                                drain_timeout_s=max(1.0, self.config.shutdown_grace_ms / 1000.0 - 2))
            processes = WorkerProcesses
            if self.spec.engine == "java-kcl":
                from .java_engine import JavaDaemonProcesses as processes
            self.workers = processes(self.config, self.spec.num_workers, self._directory,
                                     factory_args, self.name)
            self.workers.start()
        threading.Thread(target=self._checkpoint_loop, name=f"{self.name}-checkpoints",
                         daemon=True).start()
        atexit.register(self.close)

    def stop_workers(self, graceful: bool) -> None:
        """Stop the workers; graceful: each shard is drained and checkpointed first.

        Called before the StreamingContext itself stops, so batches keep running and
        complete the records still buffered while the workers wait for them.
        """
        if not self.started or self.workers is None:
            return
        if not graceful:
            self._answer_drains_now = True
            self._check_drains()
        log.info("%s: stopping %d worker(s) (%s)", self.name, self.spec.num_workers,
                 "graceful" if graceful else "immediate")
        timeout = self.spec.stop_timeout_s if graceful else min(self.spec.stop_timeout_s, 15.0)
        clean = self.workers.stop(timeout)
        log.info("%s: workers stopped%s", self.name, "" if clean else " (some killed)")

    def close(self) -> None:
        """Release everything; the receiver cannot start again (a new stream is needed)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._answer_drains_now = True
        self._check_drains()
        if self.workers is not None:
            self.workers.stop(10.0)
        self._stop_event.set()
        self.buffer.release_all()
        if self._server is not None:
            self._server.close()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001 - unregister never matters for correctness
            pass

    # --- batches -------------------------------------------------------------------------
    def next_batch(self, time_ms: int) -> list[tuple[str, Sequence[WireRecord]]]:
        """The records for batch ``time_ms``; nothing until batch completion is observable."""
        if not self.listening or self.closed:
            return []
        runs = self.buffer.take(self.rate.batch_limit())
        positions: dict[str, Position] = {}
        count = 0
        for shard_id, records in runs:
            last = records[-1]
            positions[shard_id] = (last[2], last[3])
            count += len(records)
        with self._lock:
            if positions:
                self.checkpointer.batch_generated(time_ms, positions)
            lags = [self._shards[s].millis_behind_latest for s in positions
                    if s in self._shards and self._shards[s].millis_behind_latest is not None]
            self._batches[time_ms] = BatchRecord(count, len(positions), max(lags) if lags else None)
        return runs

    def batch_completed(self, time_ms: int, succeeded: bool, processing_delay_ms: int | None,
                        scheduling_delay_ms: int | None, failure: str | None = None) -> None:
        with self._lock:
            batch = self._batches.pop(time_ms, None)
            if batch is None:
                return
            shards = self.checkpointer.batch_completed(time_ms, succeeded)
            lags = [s.millis_behind_latest for s in self._shards.values()
                    if s.millis_behind_latest is not None and s.state == "processing"]
        self.rate.batch_completed(time_ms, batch.records, processing_delay_ms or 0,
                                  scheduling_delay_ms or 0)
        log.info("%s batch %d: %d records from %d shards, max millisBehindLatest %s ms, "
                 "processing %s ms, buffered %d%s", self.name, time_ms, batch.records, batch.shards,
                 max(lags) if lags else "-", processing_delay_ms, len(self.buffer),
                 "" if succeeded else " FAILED: its shards are not checkpointed past it")
        if not succeeded and shards:
            log.error("%s: batch %d failed (%s); shards %s keep their checkpoint from before it, "
                      "so its records are read again after a restart", self.name, time_ms,
                      (failure or "").splitlines()[0] if failure else "output operation failed",
                      ", ".join(sorted(shards)))
        if shards:
            self._send_due_checkpoints(shards)
            self._check_drains()

    # --- checkpoints ---------------------------------------------------------------------
    def _checkpoint_loop(self) -> None:
        period = min(1.0, max(0.05, self.checkpointer.interval_s / 4))
        while not self._stop_event.wait(period):
            self._send_due_checkpoints(None)

    def _send_due_checkpoints(self, shard_ids) -> None:
        with self._lock:
            due = [(s, p, self._owners.get(s)) for s, p in self.checkpointer.due_checkpoints(shard_ids)]
        for shard_id, (seq, sub), peer in due:
            if peer is None or not peer.send((channel.CHECKPOINT, shard_id, seq, sub)):
                with self._lock:
                    self.checkpointer.checkpoint_refused(shard_id, (seq, sub))

    def _check_drains(self) -> None:
        """Answer each shard waiting at shard end / shutdown once its records are processed."""
        replies = []
        with self._lock:
            for shard_id, (peer, reason) in list(self._drains.items()):
                done = (self.buffer.count(shard_id) == 0
                        and not self.checkpointer.has_running_batches(shard_id))
                if not (done or self._answer_drains_now or peer.closed):
                    continue
                del self._drains[shard_id]
                position = self.checkpointer.completed_position(shard_id)
                complete = done and not self.checkpointer.has_failed(shard_id)
                if self._owners.get(shard_id) is peer:
                    self.checkpointer.shard_closed(shard_id)
                    del self._owners[shard_id]
                stats = self._shards.get(shard_id)
                if stats is not None:
                    stats.state = "ended" if reason == "shard_end" and complete else "released"
                replies.append((peer, (channel.DRAINED, shard_id, position[0] if position else None,
                                       position[1] if position else None, complete)))
        for peer, message in replies:
            peer.send(message)

    # --- channel -------------------------------------------------------------------------
    def _on_message(self, peer: channel.Peer, message: tuple) -> None:
        kind, shard_id = message[0], message[1]
        if kind == channel.RECORDS:
            _, _, records, lag = message
            with self._lock:
                if shard_id not in self._owners:  # INIT comes first; this is a fallback
                    self._owners[shard_id] = peer
                    self.checkpointer.shard_started(shard_id)
            # Outside the receiver's lock: a full buffer holds the ack, never this lock.
            put = self.buffer.put(shard_id, records, lambda: peer.send((channel.ACK, shard_id)))
            with self._lock:
                stats = self._shards.setdefault(shard_id, ShardStats())
                stats.records += put.accepted
                stats.duplicates_dropped += put.dropped
                if self._owners.get(shard_id) is peer:
                    stats.millis_behind_latest = lag
                    stats.owner = peer.worker_id
                self._note_dropped(shard_id, peer, put.dropped, caught_up=put.accepted > 0)
        elif kind == channel.LAG:
            with self._lock:
                stats = self._shards.setdefault(shard_id, ShardStats())
                if self._owners.get(shard_id, peer) is peer:
                    stats.millis_behind_latest = message[2]
                    stats.owner = peer.worker_id
        elif kind == channel.INIT:
            with self._lock:
                self._flush_dropped(shard_id)
                self._owners[shard_id] = peer
                self.checkpointer.shard_started(shard_id, _start_position(message[2], message[3]))
                stats = self._shards.setdefault(shard_id, ShardStats())
                stats.owner, stats.state = peer.worker_id, "processing"
                if message[2] is not None:
                    stats.last_checkpoint = _position_text(message[2], message[3])
            log.info("%s: %s leased shard %s (checkpoint %s)", self.name, peer.worker_id, shard_id,
                     _position_text(message[2], message[3]))
        elif kind == channel.DRAIN:
            with self._lock:
                self._drains[shard_id] = (peer, message[2])
            self._check_drains()
        elif kind == channel.LOST:
            with self._lock:
                if self._owners.get(shard_id) is peer:  # not when a new owner came first
                    del self._owners[shard_id]
                    self.checkpointer.shard_closed(shard_id)
                    if shard_id in self._shards:
                        self._shards[shard_id].state = "lost"
            log.warning("%s: %s lost the lease of shard %s", self.name, peer.worker_id, shard_id)
        elif kind == channel.CHECKPOINTED:
            _, _, seq, sub, error = message
            with self._lock:
                if error is None:
                    if shard_id in self._shards:
                        self._shards[shard_id].last_checkpoint = _position_text(seq, sub)
                    if seq != "SHARD_END":
                        self.checkpointer.checkpoint_confirmed(shard_id, (seq, sub))
                elif seq not in (None, "SHARD_END"):
                    self.checkpointer.checkpoint_refused(shard_id, (seq, sub))
        else:
            log.warning("%s: unknown message %r from %s", self.name, kind, peer)

    def _note_dropped(self, shard_id: str, peer: channel.Peer, dropped: int,
                      caught_up: bool) -> None:
        """Count a new owner's re-reads; log them once it has caught up (one line a move)."""
        if dropped:
            episode = self._dropping.get(shard_id)
            if episode is None or episode[0] != peer.worker_id:
                self._flush_dropped(shard_id)
                episode = self._dropping[shard_id] = [peer.worker_id, 0]
            episode[1] += dropped
        episode = self._dropping.get(shard_id)
        if caught_up and episode is not None and episode[0] == peer.worker_id:
            self._flush_dropped(shard_id)

    def _flush_dropped(self, shard_id: str) -> None:
        episode = self._dropping.pop(shard_id, None)
        if episode is not None:
            log.info("%s: %s re-read %d record(s) of shard %s already received from its "
                     "previous owner; dropped them (counted once)", self.name, episode[0],
                     episode[1], shard_id)

    def _on_disconnect(self, peer: channel.Peer) -> None:
        with self._lock:
            for shard_id, owner in list(self._owners.items()):
                if owner is peer:
                    del self._owners[shard_id]
                    self.checkpointer.shard_closed(shard_id)
                    if shard_id in self._shards and self._shards[shard_id].state == "processing":
                        self._shards[shard_id].state = "released"
        self._check_drains()

    # --- visibility ----------------------------------------------------------------------
    def metrics(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            view = {}
            for shard_id, stats in sorted(self._shards.items()):
                entry = stats.as_dict()
                entry["buffered"] = self.buffer.count(shard_id)
                position = self.checkpointer.completed_position(shard_id)
                entry["processed"] = _position_text(*position) if position else None
                view[shard_id] = entry
            return view


def _start_position(seq: str | None, sub: int | None) -> Position | None:
    """An owner's starting checkpoint as a position; None for the sentinels."""
    if seq is None or not seq.isdigit():
        return None
    return seq, int(sub or 0)


def _position_text(seq: str | None, sub: int | None) -> str | None:
    if seq is None:
        return None
    return seq if sub is None or seq in ("SHARD_END", "TRIM_HORIZON", "LATEST", "AT_TIMESTAMP") \
        else f"{seq}/{sub}"


_registry: dict[str, KinesisReceiver] = {}
_registry_lock = threading.Lock()


def receiver_for(spec: StreamSpec) -> KinesisReceiver:
    """The live receiver of this stream, made fresh in a new (recovered) driver process."""
    with _registry_lock:
        receiver = _registry.get(spec.key)
        if receiver is None:
            receiver = _registry[spec.key] = KinesisReceiver(spec)
        return receiver


def receivers() -> list[KinesisReceiver]:
    with _registry_lock:
        return list(_registry.values())
