"""KinesisCheckpointer: which shard positions may be written to the lease table, and when.

Spark's receiver checkpoints what was *stored* in Spark; we checkpoint only what a batch
has *completed*. A shard's position advances over its batches in order and stops for good
at the first batch that failed, so a later successful batch never covers records that
were not processed (they come again after a restart). At most one checkpoint per shard per
interval; the final ones at shard end and shutdown are the forwarder's, outside this rate.

A shard's progress is kept for the driver's life, across lease moves between its workers:
the buffer drops what a new owner re-reads (see buffer.py), so each shard's batches hold
one unbroken, increasing run of records whoever read them, and a position completed under
the old owner is the new owner's to write. Checkpoints are handed out only while the shard
has an owner, never at or below what the owner started from or confirmed written, and a
refused one is handed out again. Pure logic: the receiver does the sending.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

Position = tuple[str, int]  # (sequence number, sub-sequence number)


def position_key(position: Position) -> tuple[int, int]:
    return int(position[0]), int(position[1] or 0)


def _newer(position: Position | None, than: Position | None) -> bool:
    if position is None:
        return False
    return than is None or position_key(position) > position_key(than)


@dataclass
class _Batch:
    time_ms: int
    position: Position
    succeeded: bool | None = None  # None while the batch runs


@dataclass
class ShardTrack:
    """One shard's progress through batches in this driver's life."""

    shard_id: str
    batches: deque = field(default_factory=deque)
    completed: Position | None = None  # highest position whose batches all succeeded
    failed_batch_ms: int | None = None
    owned: bool = False  # a worker of ours holds the lease: there is someone to write
    written: Position | None = None  # in the lease table: the owner's start, or confirmed
    sent: Position | None = None  # last position handed out for checkpointing
    sent_at: float = -math.inf
    confirmed: Position | None = None  # last position a worker reported written

    @property
    def has_running_batches(self) -> bool:
        return any(b.succeeded is None for b in self.batches)

    def advance(self) -> None:
        if self.failed_batch_ms is not None:
            return
        while self.batches and self.batches[0].succeeded is not None:
            batch = self.batches.popleft()
            if not batch.succeeded:
                self.failed_batch_ms = batch.time_ms
                return
            self.completed = batch.position


class KinesisCheckpointer:
    """Tracks batch positions per shard; hands out due checkpoints."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.interval_s = max(0.0, float(interval_s))
        self._clock = clock
        self._tracks: dict[str, ShardTrack] = {}
        self._batches: dict[int, list[ShardTrack]] = {}

    def _track(self, shard_id: str) -> ShardTrack:
        track = self._tracks.get(shard_id)
        if track is None:
            track = self._tracks[shard_id] = ShardTrack(shard_id)
        return track

    def shard_started(self, shard_id: str, start: Position | None = None) -> ShardTrack:
        """A worker of ours took the lease, at checkpoint ``start`` (None: a sentinel).

        Progress made under an earlier owner stays; the new owner gets the latest completed
        position at once (not an interval later), unless the lease table is already there.
        """
        track = self._track(shard_id)
        track.owned = True
        track.written = start
        track.sent, track.sent_at = start, -math.inf
        return track

    def shard_closed(self, shard_id: str) -> None:
        """Lease lost, shard drained or owner gone: nothing is written until a new owner."""
        track = self._tracks.get(shard_id)
        if track is not None:
            track.owned = False

    def track(self, shard_id: str) -> ShardTrack | None:
        return self._tracks.get(shard_id)

    def batch_generated(self, time_ms: int, positions: dict[str, Position]) -> None:
        """Batch ``time_ms`` holds each shard's records up to ``positions[shard]``."""
        for shard_id, position in positions.items():
            track = self._track(shard_id)
            track.batches.append(_Batch(time_ms, position))
            self._batches.setdefault(time_ms, []).append(track)

    def batch_completed(self, time_ms: int, succeeded: bool) -> list[str]:
        """Returns the shards this batch touched (their drain state may have changed)."""
        touched = []
        for track in self._batches.pop(time_ms, []):
            for batch in track.batches:
                if batch.time_ms == time_ms and batch.succeeded is None:
                    batch.succeeded = succeeded
            track.advance()
            touched.append(track.shard_id)
        return touched

    def has_running_batches(self, shard_id: str) -> bool:
        track = self._tracks.get(shard_id)
        return bool(track and track.has_running_batches)

    def completed_position(self, shard_id: str) -> Position | None:
        track = self._tracks.get(shard_id)
        return track.completed if track else None

    def has_failed(self, shard_id: str) -> bool:
        track = self._tracks.get(shard_id)
        return bool(track and track.failed_batch_ms is not None)

    def due_checkpoints(self, shard_ids: Iterable[str] | None = None) -> list[tuple[str, Position]]:
        """Positions to write now; each is marked sent (at most one per shard per interval)."""
        now = self._clock()
        due = []
        ids = self._tracks.keys() if shard_ids is None else shard_ids
        for shard_id in list(ids):
            track = self._tracks.get(shard_id)
            if track is None or not track.owned or not _newer(track.completed, track.sent):
                continue
            if now - track.sent_at < self.interval_s:
                continue
            track.sent, track.sent_at = track.completed, now
            due.append((shard_id, track.completed))
        return due

    def checkpoint_confirmed(self, shard_id: str, position: Position) -> None:
        track = self._tracks.get(shard_id)
        if track is not None:
            track.confirmed = position
            if _newer(position, track.written):
                track.written = position

    def checkpoint_refused(self, shard_id: str, position: Position) -> None:
        """The worker could not write ``position`` (e.g. it lost the lease meanwhile): hand
        it out again on a later interval, to whoever owns the shard then."""
        track = self._tracks.get(shard_id)
        if track is not None and track.sent is not None \
                and position_key(track.sent) == position_key(position):
            track.sent = track.written
