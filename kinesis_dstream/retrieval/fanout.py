"""FanOutRecordsPublisher: the push record source (enhanced fan-out, SubscribeToShard).

One subscription per shard at a time. The subscribe call runs on the caller's thread, so a
refusal (the 5 s rule, a throttle) is raised to the caller as polling's errors are, and its
pacer waits it out; a reader thread then moves the pushed events into a buffer bounded by
bytes, and blocks when it is full, so a slow caller stops the reading (TCP holds the rest)
and memory stays bounded. Each subscription has its own buffer: a closed one's late events
cannot reach the next.

Positions, as the KCL's publisher: the first subscription starts AT_SEQUENCE_NUMBER the
checkpoint (dropping the user records at or before it, sub-sequence numbers of KPL
aggregates included) or at the TRIM_HORIZON/LATEST/AT_TIMESTAMP position; when a
subscription ends (after 5 minutes, cut, failed) the next starts AFTER_SEQUENCE_NUMBER the
ContinuationSequenceNumber of the last event taken. Events are taken in order and a
subscription's end is queued after its events, so none is skipped or read twice.

A null continuation is the shard's end, with its ChildShards (without them the event is
invalid, as the KCL judges it, and read again); ResourceNotFound on a subscribe is the end
too, without children, as the KCL reads it (the shard or the stream gone), unless our
consumer is what is gone: then the source raises, and the caller waits, rather than end an
open shard.

A subscription that simply ends (its 5 minutes are up) is renewed at once by its reader
thread, AFTER the last event it queued, into the same queue, if a caller read it meanwhile:
the records pushed meanwhile wait for no caller (a Spark task comes once a batch), as with
the KCL's publisher, and a source left unread (its shard read elsewhere now) lets go. A
renewal that fails, and a subscription that fails, go to the caller, which subscribes again
on its own thread as at the start.
"""
from __future__ import annotations

import logging
import queue
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..aws.kinesis import KinesisClient, subscription_error
from ..aws.kpl import deaggregate
from ..aws.stream_consumer import consumer_status
from ..config import ConsumerConfig
from ..errors import (
    ConsumerRegistrationError,
    StreamNotFoundError,
    TransientServiceError,
)
from ..records import (
    ExtendedSequenceNumber,
    GetRecordsResult,
)
from .data_loss import TrimmedRange
from .model import StartingPosition, records_after, shard_name

log = logging.getLogger(__name__)

# What is held per shard between the reader thread and the caller: the reader blocks once
# the held events' records reach BUFFER_BYTES (two seconds of a shard's 2 MiB/s push) or
# their count BUFFER_EVENTS. The KCL holds 10 events for a consumer that reads all the time;
# a Spark task comes once a batch and takes what was pushed since the last, so the buffer
# holds a batch's events (a busy shard pushes many small ones a second), bounded by bytes.
BUFFER_BYTES = 4 * 1024 * 1024
BUFFER_EVENTS = 1000
# Kinesis refuses a SubscribeToShard within 1 s of the last call and within 5 s of the last
# successful one (same consumer and shard); a renewal waits them out before it calls.
CALL_INTERVAL_S = 1.0
TAKEOVER_AFTER_S = 5.0
# The longest ``get_records`` waits for an event before it answers with nothing, so a
# caller's loop still looks at its shutdown flags.
WAIT_S = 0.5
_EVENT, _END, _ERROR = "event", "end", "error"


class EventBuffer:
    """A FIFO of (kind, item) bounded by its events' record bytes and count: ``put`` blocks
    while it is full, ``get`` waits for an item. The item that crosses the bound is let in
    (an event is never split), and the end or an error always is."""

    def __init__(self, max_bytes: int = BUFFER_BYTES, max_events: int = BUFFER_EVENTS) -> None:
        self.max_bytes, self.max_events = max_bytes, max_events
        self._items: deque[tuple[tuple[str, Any], int]] = deque()
        self._bytes = 0
        self._changed = threading.Condition()

    def put(self, item: tuple[str, Any], closed: threading.Event) -> bool:
        """Add ``item`` once there is room (at once for the end or an error); False if
        ``closed`` is set first."""
        size = event_bytes(item[1]) if item[0] == _EVENT else 0
        with self._changed:
            while item[0] == _EVENT and self.full:
                if closed.is_set():
                    return False
                self._changed.wait(WAIT_S)
            if closed.is_set():
                return False
            self._items.append((item, size))
            self._bytes += size
            self._changed.notify_all()
            return True

    def get(self, timeout: float) -> tuple[str, Any]:
        """The oldest item, waiting up to ``timeout`` (0: only what is held); queue.Empty
        if none came."""
        with self._changed:
            if not self._items and (timeout <= 0 or not self._changed.wait_for(
                    lambda: bool(self._items), timeout)):
                raise queue.Empty
            item, size = self._items.popleft()
            self._bytes -= size
            self._changed.notify_all()
            return item

    def event_next(self) -> bool:
        """The oldest item held is an event (a caller may take it at once)."""
        with self._changed:
            return bool(self._items) and self._items[0][0][0] == _EVENT

    @property
    def full(self) -> bool:
        """An event put now would wait."""
        return self._bytes >= self.max_bytes or len(self._items) >= self.max_events

    def wake(self) -> None:
        """Wake a blocked ``put`` (its subscription was closed)."""
        with self._changed:
            self._changed.notify_all()

    def __len__(self) -> int:
        with self._changed:
            return len(self._items)


def event_bytes(event: Any) -> int:
    """What a pushed event's records hold: their data."""
    return sum(len(r.get("Data") or b"") for r in event.get("Records") or ()) \
        if isinstance(event, dict) else 0


@dataclass
class _Subscription:
    """One SubscribeToShard call's stream, its reader thread and its own buffer."""

    number: int
    stream: Any
    events: EventBuffer = field(default_factory=EventBuffer)
    closed: threading.Event = field(default_factory=threading.Event)
    renewals: int = 0  # the subscriptions its reader renewed it with
    flowing: bool = False  # an event was taken from it

    def put(self, item: tuple[str, Any]) -> bool:
        """Buffer ``item``, blocking while the buffer is full; False once closed."""
        return self.events.put(item, self.closed)

    def close(self) -> None:
        """Stop the reader: the flag (and a wake) for a reader blocked on the buffer, the
        socket for one blocked on a read (closing a response from another thread does not
        wake it)."""
        self.closed.set()
        self.events.wake()
        sock = self._socket()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self.stream.close()
        except Exception:  # noqa: BLE001 - best effort; the reader ends on its next read
            log.debug("closing subscription %d", self.number, exc_info=True)

    def arriving(self) -> bool:
        """Bytes have reached the subscription's socket that its reader has not queued yet
        (an event on its way into the buffer: the reader takes it within milliseconds, or
        later on a loaded machine)."""
        sock = self._socket()
        if sock is None or self.closed.is_set():
            return False
        try:  # poll, not select: a process with hundreds of subscriptions passes fd 1024
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return any(events & select.POLLIN for _, events in poller.poll(0))
        except (OSError, ValueError):  # closed meanwhile
            return False

    def _socket(self) -> Any:
        """The socket under boto3's event stream (urllib3's response), if it has one."""
        raw = getattr(self.stream, "_raw_stream", None)
        connection = getattr(raw, "_connection", None) or getattr(raw, "connection", None)
        return getattr(connection, "sock", None)


class FanOutRecordsPublisher:
    """Reads one shard by enhanced fan-out for ``consumer_arn``; ``initialize`` once, then
    ``get_records`` until ``shard_end``; ``close`` when done."""

    pushes = True  # records come to it: a caller need not pause between reads
    shard_iterator_calls = 0

    def __init__(self, kinesis: KinesisClient, config: ConsumerConfig, shard_id: str,
                 consumer_arn: str, *, start_timestamp: float | None = None,
                 wait_s: float = WAIT_S) -> None:
        self._kinesis = kinesis
        self._consumer_arn = consumer_arn
        self._timestamp = (start_timestamp if start_timestamp is not None
                           else config.initial_position_timestamp)
        self._wait_s = wait_s
        self.shard_id = shard_id
        self.name = shard_name(config.stream_name, shard_id)  # as messages name it
        self.data_lost: TrimmedRange | None = None  # not detected under push
        self._start: ExtendedSequenceNumber | None = None
        self._continuation: str | None = None
        self._skip_through: ExtendedSequenceNumber | None = None
        self._subscription: _Subscription | None = None
        self._millis_behind_latest: int | None = None
        self._shard_end = False
        self._child_shard_ids: list[str] = []
        self.subscriptions = 0  # successful SubscribeToShard calls
        self.resubscriptions = 0  # of those, the ones after a subscription ended
        self._asked = 0  # get_records calls: a renewal needs one during the subscription
        self._called_at: float | None = None  # the last SubscribeToShard call (monotonic)
        self._succeeded_at: float | None = None  # the last successful one

    @property
    def iterator(self) -> str | None:
        """No polling iterator: a push source resumes by subscribing."""
        return None

    @property
    def millis_behind_latest(self) -> int | None:
        return self._millis_behind_latest

    def initialize(self, checkpoint: ExtendedSequenceNumber) -> None:
        """Start after ``checkpoint``; the subscription opens on the first ``get_records``."""
        self._close_subscription()
        self._start = checkpoint
        self._continuation = None
        self._shard_end = checkpoint.is_shard_end
        self._child_shard_ids = []
        self._skip_through = None if checkpoint.is_sentinel else checkpoint
        if not checkpoint.is_shard_end:
            StartingPosition.at(checkpoint, self._timestamp, self.name)  # a bad start fails here

    def resume(self, start: ExtendedSequenceNumber, iterator: str) -> None:
        """As ``initialize``: a polling iterator means nothing to a subscription."""
        self.initialize(start)

    def close(self) -> None:
        """Cancel the subscription; reading stops here."""
        self._close_subscription()

    def starting_position(self) -> StartingPosition:
        """Where the next subscription starts: after the last event's continuation, else at
        the start (AT a checkpoint, or the initial position)."""
        if self._continuation is not None:
            return StartingPosition.after(self._continuation)
        assert self._start is not None
        return StartingPosition.at(self._start, self._timestamp, self.name)

    @property
    def flowing(self) -> bool:
        """The current subscription has pushed its first event: what was pushed is queued,
        so a reader that wants only that need not wait for more."""
        subscription = self._subscription
        return subscription is not None and subscription.flowing

    @property
    def queued(self) -> bool:
        """An event is buffered: a caller's next look takes it at once."""
        subscription = self._subscription
        return subscription is not None and subscription.events.event_next()

    @property
    def arriving(self) -> bool:
        """An event is on its way from the socket into the buffer (``_Subscription.arriving``)."""
        subscription = self._subscription
        return subscription is not None and subscription.arriving()

    def get_records(self, wait_s: float | None = None) -> GetRecordsResult:
        """The records of the next pushed event (none if nothing came within ``wait_s``,
        by default the source's wait); ``shard_end`` with ``child_shard_ids`` once the shard
        is read."""
        if self._start is None:
            raise RuntimeError(f"source for {self.name} used before initialize()")
        if self._shard_end:
            return self._end_result()
        self._asked += 1
        subscription = self._subscription or self._subscribe()
        if subscription is None:
            return self._end_result()
        timeout = self._wait_s if wait_s is None else wait_s  # 0: what is queued
        for _ in range(BUFFER_EVENTS):
            try:
                kind, item = subscription.events.get(timeout=timeout)
            except queue.Empty:
                return GetRecordsResult(millis_behind_latest=self._millis_behind_latest)
            if kind != _EVENT:
                break
            subscription.flowing = True
            result = self._take(item)
            # An empty event (Kinesis pushes one at least every 5 s to an idle shard) with
            # another queued behind it says nothing that one does not: it is passed over.
            # A caller that comes once a batch (a Spark task) would otherwise take one
            # heartbeat a batch while more queue, and reach the records behind them later
            # and later, until the full buffer stops the subscription.
            if result.records or result.shard_end or not subscription.events.event_next():
                return result
            timeout = 0.0
        else:
            return result
        self._close_subscription()
        if kind == _ERROR:
            raise item
        log.debug("%s: subscription %d ended; resubscribing %s", self.name,
                  subscription.number, self.starting_position())
        return GetRecordsResult(millis_behind_latest=self._millis_behind_latest)

    # -- subscriptions ----------------------------------------------------------------------------
    def _call_subscribe(self, position: StartingPosition) -> Any:
        """One SubscribeToShard call, timed for the renewals' waits; counted if it succeeds."""
        self._called_at = time.monotonic()
        stream = self._kinesis.subscribe_to_shard(self._consumer_arn, self.shard_id,
                                                  position.as_request())
        self._succeeded_at = time.monotonic()
        if self.subscriptions:
            self.resubscriptions += 1
        self.subscriptions += 1
        return stream

    def _subscribe(self) -> _Subscription | None:
        position = self.starting_position()
        try:
            stream = self._call_subscribe(position)
        except StreamNotFoundError as exc:
            if consumer_status(self._kinesis, self._consumer_arn) in (None, "DELETING"):
                # Not the shard: our consumer. Ending the shard here (the KCL does) would
                # checkpoint an open shard at SHARD_END; waiting loses nothing.
                raise ConsumerRegistrationError(
                    f"{self.name}: fan-out consumer {self._consumer_arn} was "
                    "deregistered; reading waits (restart the worker to register it "
                    "again)") from exc
            log.warning("%s: %s; treating the shard as ended, as the KCL does",
                        self.name, exc)
            self._shard_end = True
            return None
        subscription = _Subscription(self.subscriptions, stream)
        self._subscription = subscription
        threading.Thread(target=self._read, args=(subscription,), daemon=True,
                         name=f"subscription-{self.shard_id}-{subscription.number}").start()
        log.debug("%s: subscription %d at %s", self.name, subscription.number,
                  position)
        return subscription

    def _read(self, subscription: _Subscription) -> None:
        """The reader thread: every event into the queue, renewing the subscription each
        time it ends; then the end (or the error)."""
        after: str | None = None  # the continuation of the last event queued
        while True:
            asked = self._asked
            what = f"reading subscription {subscription.number + subscription.renewals} " \
                   f"of {self.name}"
            ended = False  # the shard's end (or an invalid event, which the caller judges)
            try:
                for message in subscription.stream:
                    event = message.get("SubscribeToShardEvent")
                    if event is None:
                        continue
                    if not subscription.put((_EVENT, event)):
                        return
                    after = event.get("ContinuationSequenceNumber")
                    ended = after is None
            except Exception as exc:  # noqa: BLE001 - handed to the caller as our error
                if not subscription.closed.is_set():
                    subscription.put((_ERROR, subscription_error(exc, what)))
                return
            # Renewed only while read: a source nobody asked during a whole subscription
            # (its shard read elsewhere now) must not take the shard's subscription over.
            if ended or after is None or self._asked == asked \
                    or not self._renew(subscription, after):
                subscription.put((_END, None))
                return

    def _renew(self, subscription: _Subscription, after: str) -> bool:
        """On the reader thread: subscribe again AFTER ``after`` once Kinesis' call rules
        allow it, and read on into the same queue. False (the caller subscribes itself, and
        meets the refusal on its thread) if closed meanwhile or the call fails."""
        now = time.monotonic()
        wait = max(0.0, (self._called_at or 0.0) + CALL_INTERVAL_S - now,
                   (self._succeeded_at or 0.0) + TAKEOVER_AFTER_S - now)
        if subscription.closed.wait(wait):
            return False
        try:
            stream = self._call_subscribe(StartingPosition.after(after))
        except Exception as exc:  # noqa: BLE001 - the caller's own subscribe reports it
            log.debug("%s: renewing subscription %d failed (%s); the reader subscribes "
                      "again", self.name, subscription.number, exc)
            return False
        subscription.stream = stream
        subscription.renewals += 1
        if subscription.closed.is_set():  # closed while subscribing: close() missed it
            subscription.close()
            return False
        log.debug("%s: subscription %d renewed after %s", self.name, subscription.number,
                  after)
        return True

    def _close_subscription(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.close()

    # -- events ---------------------------------------------------------------------------------
    def _take(self, event: dict) -> GetRecordsResult:
        continuation = event.get("ContinuationSequenceNumber")
        if continuation is None and not event.get("ChildShards"):
            # The KCL's DataRetrievalUtil rejects this mix (a shard's end names its children):
            # read it again from the last continuation rather than end the shard on it.
            self._close_subscription()
            raise TransientServiceError(f"{self.name}: an event with neither a "
                                        "continuation nor child shards; resubscribing")
        kinesis_records = event.get("Records") or []
        records = deaggregate(kinesis_records, self.shard_id)
        if self._skip_through is not None and records:
            records = records_after(records, self._skip_through)
            if records:
                self._skip_through = None
        self._millis_behind_latest = event.get("MillisBehindLatest")
        if continuation is None:
            self._shard_end = True
            self._child_shard_ids = [c["ShardId"] for c in event.get("ChildShards") or ()]
            self._close_subscription()
            log.info("%s reached its end; children %s", self.name,
                     self._child_shard_ids or "not reported")
        else:
            self._continuation = continuation
        return GetRecordsResult(records=records, millis_behind_latest=self._millis_behind_latest,
                                shard_end=self._shard_end,
                                child_shard_ids=list(self._child_shard_ids),
                                kinesis_records=len(kinesis_records))

    def _end_result(self) -> GetRecordsResult:
        return GetRecordsResult(shard_end=True, child_shard_ids=list(self._child_shard_ids),
                                millis_behind_latest=self._millis_behind_latest)
