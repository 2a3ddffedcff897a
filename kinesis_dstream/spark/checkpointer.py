"""Runs in the driver: the checkpoint policy, in one place (pure logic, no I/O).

Spark's receiver checkpoints what was *stored* in Spark; we checkpoint only what a batch has
*completed*. A shard's position advances over its batches in batch order and stops for good
at the first batch that failed, so a later successful batch never covers records that were
not processed (they come again after a restart). At most one checkpoint per shard per
``checkpointInterval``; the final ones at a graceful stop are forced. SHARD_END is due only
once the batch that read the shard's last records has completed, with every batch before it.

Positions are ``ExtendedSequenceNumber``s, so the sub-sequence inside a KPL aggregate is
checkpointed too and ordering is the KCL's. The coordinator does the writing and reports
each write that succeeded with ``checkpoint_written`` (until then the position stays due).
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..records import SHARD_END, ExtendedSequenceNumber


@dataclass
class _Batch:
    time_ms: int
    end: ExtendedSequenceNumber | None = None  # last record the batch read, if any
    shard_end: bool = False
    succeeded: bool | None = None  # None while the batch runs


@dataclass
class ShardTrack:
    """One shard's progress through this driver's batches while it holds the lease."""

    shard_id: str
    batches: deque = field(default_factory=deque)
    completed: ExtendedSequenceNumber | None = None  # highest position of completed batches
    ended: bool = False  # the batch holding the shard's last records completed
    failed_batch_ms: int | None = None
    written: ExtendedSequenceNumber | None = None  # in the lease table
    written_at: float = -math.inf

    @property
    def has_running_batches(self) -> bool:
        return any(b.succeeded is None for b in self.batches)

    def advance(self) -> None:
        while self.failed_batch_ms is None and self.batches and self.batches[0].succeeded is not None:
            batch = self.batches.popleft()
            if not batch.succeeded:
                self.failed_batch_ms = batch.time_ms
                return
            if batch.end is not None and (self.completed is None or batch.end > self.completed):
                self.completed = batch.end
            self.ended = self.ended or batch.shard_end


class KinesisCheckpointer:
    """Tracks batches per shard; says which positions are due to be written."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.interval_s = max(0.0, float(interval_s))
        self._clock = clock
        self._tracks: dict[str, ShardTrack] = {}

    def shard_started(self, shard_id: str, checkpoint: ExtendedSequenceNumber) -> None:
        """We took the lease, whose checkpoint is ``checkpoint``: a fresh track."""
        self._tracks[shard_id] = ShardTrack(shard_id, written=checkpoint)

    def shard_closed(self, shard_id: str) -> None:
        """Lease lost or released: nothing more is written for it by us."""
        self._tracks.pop(shard_id, None)

    def track(self, shard_id: str) -> ShardTrack | None:
        return self._tracks.get(shard_id)

    def batch_generated(self, time_ms: int, shard_ids: Iterable[str]) -> None:
        for shard_id in shard_ids:
            track = self._tracks.get(shard_id)
            if track is not None:
                track.batches.append(_Batch(time_ms))

    def batch_completed(self, time_ms: int, succeeded: bool,
                        reached: dict[str, tuple[ExtendedSequenceNumber | None, bool]],
                        shard_ids: Iterable[str]) -> list[str]:
        """Batch ``time_ms`` completed; ``reached[shard] = (last record read, shard end)``.

        ``shard_ids`` are the shards the batch planned (of one input stream). A shard the
        batch planned but never read (an output operation that looked at only some
        partitions) made no progress: its records come in a later batch.
        Returns the shards whose progress may have changed.
        """
        touched = []
        for shard_id in shard_ids:
            track = self._tracks.get(shard_id)
            if track is None:
                continue
            for batch in track.batches:
                if batch.time_ms == time_ms and batch.succeeded is None:
                    batch.end, batch.shard_end = reached.get(track.shard_id, (None, False))
                    batch.succeeded = succeeded
                    track.advance()
                    touched.append(track.shard_id)
                    break
        return touched

    def has_running_batches(self, shard_id: str) -> bool:
        track = self._tracks.get(shard_id)
        return bool(track and track.has_running_batches)

    def completed_position(self, shard_id: str) -> ExtendedSequenceNumber | None:
        track = self._tracks.get(shard_id)
        return track.completed if track else None

    def all_written(self, shard_id: str) -> bool:
        """Every batch of the shard completed and what they reached is in the lease table
        (an idle shard's empty batches, say): their ranges serve nothing any more."""
        track = self._tracks.get(shard_id)
        if track is None or track.failed_batch_ms is not None or track.has_running_batches:
            return False
        return track.completed is None or (track.written is not None
                                           and track.completed <= track.written)

    def has_failed(self, shard_id: str) -> bool:
        track = self._tracks.get(shard_id)
        return bool(track and track.failed_batch_ms is not None)

    def due_checkpoints(self, force: bool = False) -> list[tuple[str, ExtendedSequenceNumber]]:
        """Positions to write now: at most one per shard per interval (``force``: all)."""
        now = self._clock()
        due = []
        for track in self._tracks.values():
            if track.ended and track.failed_batch_ms is None and track.written != SHARD_END:
                due.append((track.shard_id, SHARD_END))
                continue
            if track.completed is None:
                continue
            if track.written is not None and track.completed <= track.written:
                continue
            if not force and now - track.written_at < self.interval_s:
                continue
            due.append((track.shard_id, track.completed))
        return due

    def checkpoint_written(self, shard_id: str, position: ExtendedSequenceNumber) -> None:
        track = self._tracks.get(shard_id)
        if track is not None:
            track.written, track.written_at = position, self._clock()
