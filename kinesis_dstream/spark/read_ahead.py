"""Runs in the driver: the read-ahead of a Kinesis input stream's batches.

A batch's RDD is read right away by a small Spark job (the read-ahead) whose tasks cache
what they read (at ``storageLevel``), so that the batch's record count and per-shard ranges
are known when Spark builds the batch, and the read of batch N+1 overlaps the processing of
batch N. The read-ahead is the first computation of each partition, and its tasks know it
(``task.READ_AHEAD``): only they may decide a new range. Any later computation of the same
partition (a lost block, a task retry) reads the recorded range, or nothing where the
read-ahead read nothing. When the read-ahead fails outright, the batch gets a fresh RDD
whose unread partitions record even an empty read, since no computation of theirs has
been seen.

While there is a backlog a batch is read early, before Spark asks for it (``read_early``):
the planner's same build, only earlier, on one thread for the planner's life; the planner
builds each batch once, whichever of Spark's call and the early reads comes first.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from .records import RecordValues
from .task import READ_AHEAD

log = logging.getLogger(__name__)

# Built batch RDDs kept for another output operation's call (a batch's stay until it completes).
MAX_BUILT_BATCHES = 64

Build = Callable[[Any, int, RecordValues], None]


def drop_oldest(batches: dict[int, Any] | set[int]) -> None:
    """Keep what is held per batch time for the newest MAX_BUILT_BATCHES batches only: a
    batch normally lets go of it when it completes, and one that never completes (a stop
    between its build and its jobs) must not hold it for the driver's life."""
    while len(batches) > MAX_BUILT_BATCHES:
        oldest = min(batches)
        if isinstance(batches, dict):
            del batches[oldest]
        else:
            batches.discard(oldest)


def read_ahead(sc: Any, rdd: Any, batch_ms: int, stopping: bool, name: str,
               reread: Callable[[], Any]) -> Any:
    """Run batch ``batch_ms``'s read-ahead job on ``rdd``; the RDD the batch's output
    operations get (``reread()``'s, fresh, when the job failed)."""
    sc.setLocalProperty(READ_AHEAD, str(batch_ms))
    try:
        # The JVM counts the cached pickled batches: the tasks read and cache the records,
        # and no second Python pass unpickles them only to count (the reports carry the
        # record counts).
        rdd._jrdd.count()
    except Exception as exc:  # noqa: BLE001 - the batch's own jobs read it again
        report = log.info if stopping else log.warning
        report("%s: reading batch %d ahead failed (%s); its output operations read it "
               "themselves", name, batch_ms, str(exc).splitlines()[0][:300])
        rdd.unpersist(blocking=False)
        rdd = reread()
    finally:
        sc.setLocalProperty(READ_AHEAD, None)
    return rdd


class ReadAhead:
    """The early reads' thread: while there is a backlog it has the planner build a batch
    (``build_early``) before Spark asks for it."""

    def __init__(self, name: str, build_early: Build, enabled: bool) -> None:
        self.name = name
        self._build_early = build_early
        self.enabled = enabled  # False with storageLevel NONE: nothing is read early
        self.stopping = False
        self._wake = threading.Condition()
        self._next: tuple[Any, int, RecordValues] | None = None
        self._busy = False
        self._early_ms = 0  # the newest batch an early read was started for
        self.thread: threading.Thread | None = None

    def stop(self, stopping: bool) -> None:
        with self._wake:  # the early reads' thread ends
            self.stopping = stopping
            self._wake.notify_all()

    def read_early(self, sc: Any, batch_ms: int, values: RecordValues | None) -> None:
        """Build batch ``batch_ms`` now, in the background, before Spark asks for it.

        Spark asks for a batch at its time, and its read-ahead reads then; while there is a
        backlog that leaves Kinesis unread between one batch's read and the next batch's
        time. So the first batch is read as soon as the context has started (its first
        lease is taken by then), and the batch after one whose reads stopped before a
        shard's tip as soon as Spark has that one: reads follow each other without a gap,
        never more than one batch ahead of Spark's clock (the planner asks only then).
        Spark's call finds the batch built (or waits for it), with the same ranges, so every
        guarantee holds; a build that failed fails Spark's call the same way. Nothing is
        read early with ``storageLevel`` NONE (no read-ahead) or while stopping.
        """
        if values is None or self.stopping or not self.enabled:
            return
        with self._wake:
            if batch_ms <= self._early_ms:
                return  # asked for already
            self._early_ms = batch_ms
            self._next = (sc, batch_ms, values)
            if self.thread is None:
                # One thread for the planner's life: PySpark pins a JVM thread to each Python
                # thread that calls Spark, and never ends it (a thread per batch would leak).
                self.thread = threading.Thread(target=self._early_reads, daemon=True,
                                               name=f"{self.name}-early-reads")
                self.thread.start()
            self._wake.notify_all()

    def _early_reads(self) -> None:
        while True:
            with self._wake:
                while self._next is None and not self.stopping:
                    self._wake.wait()
                if self.stopping:
                    return
                assert self._next is not None
                sc, batch_ms, values = self._next
                self._next, self._busy = None, True
            try:
                self._build_early(sc, batch_ms, values)
            finally:
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()

    def idle(self, timeout_s: float) -> bool:
        """No early read asked for or running (tests wait on it)."""
        with self._wake:
            return self._wake.wait_for(lambda: self._next is None and not self._busy, timeout_s)
