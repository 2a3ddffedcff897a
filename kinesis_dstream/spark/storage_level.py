"""Runs in the driver: the ``storageLevel`` NONE gate.

With ``storageLevel`` NONE nothing would keep what a read-ahead read, so there is none: the
batch's first output operation decides its ranges, every partition recording its range
(even an empty one) before a record leaves the task, and every later computation reads
exactly that. Where a batch ended is then known only when it completes, so the next batch
is planned once it has (waited for, bounded), and the reads still follow each other.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .read_ahead import drop_oldest

log = logging.getLogger(__name__)

# The next batch waits for the previous one's completion for at most its read time budget
# plus this many batch intervals; then its unsettled shards sit it out.
COMPLETION_WAIT_INTERVALS = 2


def unreplicated(level: Any) -> Any:
    """``storageLevel`` with one replica, or None when it stores nothing.

    A receiver's blocks are the only copy of its records, hence PySpark's default
    MEMORY_AND_DISK_2. Ours are not: a lost block is read again from Kinesis, exactly, from
    its recorded range. A second replica would only cost each batch a copy to another
    executor.
    """
    if level is None or not (level.useMemory or level.useDisk or level.useOffHeap):
        return None
    if level.replication <= 1:
        return level
    from pyspark import StorageLevel

    return StorageLevel(level.useDisk, level.useMemory, level.useOffHeap, level.deserialized, 1)


class UnreadBatches:
    """The batches planned with shards and not completed (storageLevel NONE), and the
    newest of them whose completion a wait gave up on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._unread: set[int] = set()
        self.waited_out = 0
        self._stopping = False
        self._completions = threading.Condition()

    def __contains__(self, batch_ms: int) -> bool:
        return batch_ms in self._unread

    def add(self, batch_ms: int) -> None:
        with self._completions:
            self._unread.add(batch_ms)
            drop_oldest(self._unread)

    def completed(self, batch_ms: int) -> None:
        """The coordinator knows where the batch's shards ended: the next batch may plan."""
        with self._completions:
            self._unread.discard(batch_ms)
            self._completions.notify_all()

    def stop(self, stopping: bool) -> None:
        """A stop releases a batch waiting for its predecessor's completion."""
        with self._completions:
            self._stopping = stopping
            self._completions.notify_all()

    def wait(self, batch_ms: int, timeout_s: float) -> bool:
        """Wait until the batches before ``batch_ms`` have completed: only then is it known
        where each of their shards' reads ended, and a batch planned earlier makes those
        shards sit out.

        Runs on Spark's JobGenerator thread; completions come on the listener bus's thread,
        which this does not block. Not while stopping, and not again for batches a wait
        already gave up on. True when nothing is outstanding.
        """
        deadline = time.monotonic() + timeout_s
        with self._completions:
            while True:
                pending = [t for t in self._unread if self.waited_out < t < batch_ms]
                left = deadline - time.monotonic()
                if not pending or self._stopping or left <= 0:
                    break
                log.debug("%s: batch %d waits for batch %s to complete", self.name, batch_ms,
                          max(pending))
                self._completions.wait(left)
            if pending and not self._stopping:
                self.waited_out = max(pending)
                log.info("%s: batch %d is planned before batch %d completed (waited %.1f s); "
                         "that batch's shards sit it out", self.name, batch_ms, max(pending),
                         timeout_s)
            return not pending
