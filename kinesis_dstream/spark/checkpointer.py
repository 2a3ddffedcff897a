"""Runs in the driver: the checkpoint policy, in one place (pure logic, no I/O).

Spark's receiver checkpoints what was *stored* in Spark; we checkpoint only what a batch has
*completed*. A shard's position advances over its batches in batch order and stops for good
at the first batch that failed, so a later successful batch never covers records that were
not processed (they come again after a restart). At most one checkpoint per shard per
``checkpointInterval``; the final ones at a graceful stop are forced. SHARD_END is due only
once the batch that read the shard's last records has completed, with every batch before it.

Positions are ``ExtendedSequenceNumber``s, so the sub-sequence inside a KPL aggregate is
checkpointed too and ordering is the KCL's. Each shard's progress (``ShardTrack``) is part of
its ``ShardState``; the coordinator does the writing and records each write that succeeded
there (until then the position stays due).
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
    """One shard's progress through this driver's batches in one lease period (the shard's
    ``ShardState`` holds it while it holds the lease)."""

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

    @property
    def has_failed(self) -> bool:
        return self.failed_batch_ms is not None

    @property
    def all_written(self) -> bool:
        """Every batch completed and what they reached is in the lease table (an idle
        shard's empty batches, say): their ranges serve nothing any more."""
        if self.failed_batch_ms is not None or self.has_running_batches:
            return False
        return self.completed is None or (self.written is not None
                                          and self.completed <= self.written)

    def batch_generated(self, time_ms: int) -> None:
        self.batches.append(_Batch(time_ms))

    def batch_completed(self, time_ms: int, succeeded: bool, end: ExtendedSequenceNumber | None,
                        shard_end: bool) -> bool:
        """Batch ``time_ms`` completed, having read through ``end`` (None: nothing) and
        ``shard_end``. A batch that planned the shard but never read it (an output operation
        that looked at only some partitions) made no progress: its records come in a later
        batch. True when the shard's progress may have changed."""
        for batch in self.batches:
            if batch.time_ms == time_ms and batch.succeeded is None:
                batch.end, batch.shard_end, batch.succeeded = end, shard_end, succeeded
                self.advance()
                return True
        return False

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
    """Says which of the shards' completed positions are due to be written."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.interval_s = max(0.0, float(interval_s))
        self.clock = clock

    @staticmethod
    def batch_generated(time_ms: int, tracks: Iterable[ShardTrack]) -> None:
        """Batch ``time_ms`` planned the shards of ``tracks``."""
        for track in tracks:
            track.batch_generated(time_ms)

    @staticmethod
    def batch_completed(time_ms: int, succeeded: bool,
                        reached: Iterable[tuple[ShardTrack, ExtendedSequenceNumber | None, bool]],
                        ) -> list[str]:
        """Batch ``time_ms`` completed; ``reached``: each shard it planned, with the last
        record the batch read of it (None: nothing) and whether that was the shard's end.
        Returns the shards whose progress may have changed."""
        return [track.shard_id for track, end, shard_end in reached
                if track.batch_completed(time_ms, succeeded, end, shard_end)]

    def due_checkpoints(self, tracks: Iterable[ShardTrack], force: bool = False,
                        ) -> list[tuple[str, ExtendedSequenceNumber]]:
        """Positions to write now: at most one per shard per interval (``force``: all)."""
        now = self.clock()
        due = []
        for track in tracks:
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
