"""Runs in the driver: the checkpoint policy, in one place (pure logic, no I/O).

Spark's receiver checkpoints what was *stored* in Spark; we checkpoint only what a batch has
*completed*. A shard's position advances over its batches in batch order and stops for good
at the first batch that failed, so a later successful batch never covers records that were
not processed (they come again after a restart). At most one checkpoint per shard per
``checkpointInterval``; the final ones at a graceful stop are forced. SHARD_END is due only
once the batch that read the shard's last records has completed, with every batch before it.

Positions are ``ExtendedSequenceNumber``s, so the sub-sequence inside a KPL aggregate is
checkpointed too and ordering is the KCL's. Each shard's progress over its batches
(``lease_period.ShardTrack``, advanced by the shard's own plan and completion events) is
part of its ``ShardState``; this module says which completed positions are due, the
coordinator does the writing and records each write that succeeded there (until then the
position stays due).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterable

from ..records import SHARD_END, ExtendedSequenceNumber

if TYPE_CHECKING:  # each shard's progress is part of its state (lease_period)
    from .lease_period import ShardTrack


class KinesisCheckpointer:
    """Says which of the shards' completed positions are due to be written."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.interval_s = max(0.0, float(interval_s))
        self.clock = clock

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
