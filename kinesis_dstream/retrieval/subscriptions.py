"""The executor side of fan-out for batches: subscriptions held between tasks.

A Spark task reads one shard for one batch and ends; a subscription must outlive it, since
a new SubscribeToShard is refused for 5 s after the last one, and its set-up is not to be
paid every batch. So each Python worker process keeps a ``SubscriptionRegistry``: a task
``checkout``s the shard's source at the start its range reads after, and ``checkin``s it
with the position it handed out through. The position rule:

- the held source's position is the start: the task goes on with it (the records it had
  taken past the last task's end first, then the subscription's next events);
- otherwise (the process's first task of the shard, a recomputation, a lease that moved
  and came back): the source reopens AT the start, so a task reads after its start and
  nothing else, whichever source it is given.

A source not checked in again within ``idle_close_s`` is closed (its shard's lease went
elsewhere, or the stream stopped); memory stays bounded meanwhile, as the publisher's queue
blocks its reader. Two tasks of one shard at once (a speculative copy) each get their own
source; the one checked in last is held.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from ..records import ExtendedSequenceNumber, GetRecordsResult
from .data_loss import TrimmedRange
from .executor_process import ProcessOnce
from .fanout import FanOutRecordsPublisher

log = logging.getLogger(__name__)

# At a shard's tip, how long a task waits for the next event behind those it took (the
# buffer holds what was pushed since the last task; events still in flight are a few ms
# away); an idle shard's event may be seconds away.
IN_FLIGHT_WAIT_S = 0.03
# A held source unused for this long is closed: longer than a batch interval, so a shard
# read batch after batch keeps its subscription, short beside the 5 minutes it lasts.
IDLE_CLOSE_S = 60.0

SubscriptionKey = tuple[str, str]  # (consumer ARN, shard id)


class HeldSource:
    """A ``RecordSource`` over one shard's publisher that keeps what a task left unread.

    A task may stop inside an event (a record cap): the rest of that event's records are
    kept, and handed out first to the next task that goes on from the same position.
    """

    pushes = True
    shard_iterator_calls = 0
    iterator = None
    data_lost: TrimmedRange | None = None

    def __init__(self, key: SubscriptionKey, publisher: FanOutRecordsPublisher) -> None:
        self.key = key
        self.shard_id = key[1]
        self.publisher = publisher
        self.position: ExtendedSequenceNumber | None = None  # the last record handed out
        self._pending: GetRecordsResult | None = None
        self._last: GetRecordsResult | None = None
        self.shard_end = False  # handed out through the shard's end
        self._looked = False  # the current task has read the publisher

    @property
    def millis_behind_latest(self) -> int | None:
        return self.publisher.millis_behind_latest

    def initialize(self, checkpoint: ExtendedSequenceNumber) -> None:
        """Reopen after ``checkpoint`` (the subscription opens on the next read)."""
        self.publisher.initialize(checkpoint)
        self.position, self._pending, self._last = checkpoint, None, None
        self.shard_end = False

    def resume(self, start: ExtendedSequenceNumber, iterator: str) -> None:
        self.initialize(start)

    def get_records(self) -> GetRecordsResult:
        """The next records. A task's first look at a subscription at its shard's tip does
        not wait when nothing was pushed since the last task (an idle shard among a task's
        many would otherwise hold it for the source's wait every batch). Its later looks
        wait ``IN_FLIGHT_WAIT_S`` for the events in flight behind those it took (Kinesis may
        still say 0 ms behind while they are on their way), and so does a first look that
        finds an event's bytes arrived but not yet queued (on a loaded machine the reader
        thread may take them a batch late otherwise); a new subscription's first event, and
        the next event of a shard behind its tip, are waited for as usual."""
        result, self._pending = self._pending, None
        if result is None:
            publisher, first = self.publisher, not self._looked
            self._looked = True
            wait: float | None = None
            if publisher.flowing and not publisher.millis_behind_latest:
                wait = 0.0 if first else IN_FLIGHT_WAIT_S
            result = publisher.get_records(wait)
            if wait == 0.0 and not result.records and not result.shard_end \
                    and publisher.arriving:
                result = publisher.get_records(IN_FLIGHT_WAIT_S)
        self._last = result
        return result

    @property
    def queued(self) -> bool:
        """Records or events wait here already: taking them costs no wait."""
        return self._pending is not None or self.publisher.queued

    def hand_out_through(self, position: ExtendedSequenceNumber) -> None:
        """The task handed out the records through ``position``: keep the last result's
        records after it for the next task."""
        self.position = position
        self._looked = False  # the next task's first look
        last, self._last = self._last, None
        if last is None:
            return
        rest = [r for r in last.records if r.extended_sequence_number > position]
        if rest:
            self._pending = replace(last, records=rest, kinesis_records=len(rest))
        self.shard_end = last.shard_end and not rest

    def close(self) -> None:
        self.publisher.close()


@dataclass
class _Held:
    source: HeldSource
    last_used: float


class SubscriptionRegistry:
    """The held sources of one process, by (consumer ARN, shard id)."""

    def __init__(self, idle_close_s: float = IDLE_CLOSE_S,
                 clock: Callable[[], float] = time.monotonic, sweep: bool = True) -> None:
        self.idle_close_s = idle_close_s
        self._clock = clock
        self._held: dict[SubscriptionKey, _Held] = {}
        self._lock = threading.Lock()
        self._sweep = sweep
        self._sweeper: threading.Thread | None = None
        self.opened = 0  # publishers made
        self.reopened = 0  # checkouts that reopened at a start other than the held position
        self.continued = 0  # checkouts that went on with the held subscription

    def checkout(self, key: SubscriptionKey, start: ExtendedSequenceNumber,
                 open_publisher: Callable[[], FanOutRecordsPublisher]) -> HeldSource:
        """A source for ``key`` that reads after ``start``: the held one when it stands
        there, else one reopened at ``start``. The caller owns it until ``checkin``."""
        self.close_idle()
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None and held.source.position == start:
            self.continued += 1
            return held.source
        if held is None:
            source = HeldSource(key, open_publisher())
            self.opened += 1
        else:
            source = held.source
            self.reopened += 1
            log.info("%s: a task starts after %s, not where its subscription stands "
                     "(%s); subscribing again", source.publisher.name, start, source.position)
        source.initialize(start)
        return source

    def checkin(self, source: HeldSource, position: ExtendedSequenceNumber) -> None:
        """Hold ``source`` for the next task, which goes on after ``position`` (the last
        record handed out, or the start when none was); a read shard is closed instead."""
        source.hand_out_through(position)
        if source.shard_end:
            source.close()
            return
        with self._lock:
            earlier = self._held.pop(source.key, None)
            self._held[source.key] = _Held(source, self._clock())
            self._start_sweeper()
        if earlier is not None and earlier.source is not source:
            earlier.source.close()

    def discard(self, source: HeldSource) -> None:
        """A task failed with ``source``: close it (the retry reopens at its start)."""
        source.close()

    def close_idle(self) -> int:
        """Close the sources unused for ``idle_close_s``; how many were closed."""
        now = self._clock()
        with self._lock:
            idle = [k for k, h in self._held.items() if now - h.last_used >= self.idle_close_s]
            closing = [self._held.pop(k) for k in idle]
        for held in closing:
            log.info("%s: no task read its subscription for %.0f s; closing it",
                     held.source.publisher.name, now - held.last_used)
            held.source.close()
        return len(closing)

    def close_all(self) -> None:
        with self._lock:
            closing, self._held = list(self._held.values()), {}
        for held in closing:
            held.source.close()

    def held(self) -> dict[SubscriptionKey, ExtendedSequenceNumber | None]:
        """The held keys and their positions."""
        with self._lock:
            return {k: h.source.position for k, h in self._held.items()}

    def _start_sweeper(self) -> None:
        """A daemon thread closes idle sources even when no task comes (called locked); it
        ends when nothing is held, and the next checkin starts another."""
        if not self._sweep or self._sweeper is not None:
            return
        self._sweeper = threading.Thread(target=self._sweep_loop, daemon=True,
                                         name="subscription-sweeper")
        self._sweeper.start()

    def _sweep_loop(self) -> None:
        while True:
            time.sleep(max(0.5, self.idle_close_s / 4))
            try:
                self.close_idle()
            except Exception:  # noqa: BLE001 - the sweeper must not die on one close
                log.warning("closing idle subscriptions", exc_info=True)
            with self._lock:
                if not self._held:
                    self._sweeper = None
                    return


# This process's registry.
subscriptions = ProcessOnce(SubscriptionRegistry)
