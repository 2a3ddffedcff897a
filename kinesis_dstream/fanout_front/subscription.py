"""One SubscribeToShard stream, fed from the emulator's GetShardIterator and GetRecords.

The stream polls its shard at once when the front sees records put on it (``wake``), and
every ``poll_interval_s`` while records come (at once again while a page leaves it behind the
tip); on a shard without new records the interval doubles up to ``idle_poll_interval_s``, so
many idle subscriptions cost the emulator little and records put on the emulator directly
still arrive. With ``wake_only`` (every put goes through the front) a shard is polled only
when woken: an idle one costs the emulator nothing, and once a read has reached the tip the
put's records come from the front's ``PutLog``, not from GetRecords. An idle shard gets an empty event (a
heartbeat) every ``heartbeat_s``, inside boto3's 60 s read timeout. Every event carries the
ContinuationSequenceNumber to resubscribe AFTER: the last record's, else the one before. At
the shard's end the last event has no continuation and names the ChildShards.
"""
from __future__ import annotations

import base64
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from . import frames
from .put_log import PutLog
from .rules import ReadPacer
from .upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)

# How far back (seconds) a heartbeat's continuation looks for the record before a LATEST or
# AT_TIMESTAMP start, before it reads the shard from its start.
_LOOK_BACK_S = (1.0, 30.0, 900.0, 86400.0)
_PAGE = 10000  # records a GetRecords asks for


@dataclass(frozen=True)
class FrontSettings:
    lifetime_s: float = 300.0
    heartbeat_s: float = 5.0
    poll_interval_s: float = 0.1
    idle_poll_interval_s: float = 1.0
    max_event_bytes: int = 1024 * 1024
    # Records reach the emulator only through the front, and the stream is not resharded:
    # a shard is read only when a put wakes it (a benchmark's wide stream of idle shards)
    wake_only: bool = False


@dataclass(frozen=True)
class SubscribeRequest:
    consumer_arn: str
    shard_id: str
    stream_name: str
    starting_position: dict[str, Any]


def record_size(record: dict[str, Any]) -> int:
    """What a record counts against the read limit: its data and partition key."""
    return len(base64.b64decode(record.get("Data", ""))) + len(record.get("PartitionKey", ""))


class Subscription:
    """Pushes a shard's records to ``send`` until its lifetime ends, the shard ends, a newer
    subscription takes over, the consumer goes or the client leaves; ``run`` says which."""

    def __init__(self, request: SubscribeRequest, iterator: str, *, upstream: Upstream,
                 auth: dict[str, str], settings: FrontSettings, pacer: ReadPacer,
                 send: Callable[["Subscription", bytes], None],
                 write: Callable[[bytes], None], consumer_gone: Callable[[str], bool],
                 put_log: PutLog | None = None) -> None:
        self.request = request
        self._iterator: str | None = iterator
        self._iterator_behind = False  # records were pushed from the put log past it
        self._put_log = put_log
        self._read_to_tip = False  # a GetRecords found the tip: the put log holds what follows
        self._upstream, self._auth, self._settings = upstream, auth, settings
        self._pacer, self._send, self._consumer_gone = pacer, send, consumer_gone
        self.write = write  # where ``send`` puts this stream's chunks
        self._wake = threading.Event()  # new records, or the end: poll now
        self._wake.set()  # the first poll reads what is there already
        self._ended = threading.Event()
        self._ending: tuple[str, str] | None = None  # (exception type, message)
        self.continuation: str | None = self._known_start()
        self._child_shards_seen: list[dict[str, Any]] | None = None
        self._behind = 0  # the last page's MillisBehindLatest, for a heartbeat not polled
        self._caught_up = True
        self.events_sent = 0
        self.records_sent = 0

    @property
    def key(self) -> tuple[str, str]:
        return self.request.consumer_arn, self.request.shard_id

    def end_with(self, exception_type: str, message: str) -> None:
        """End the stream with an exception event (a takeover, a consumer gone, a stop)."""
        if self._ending is None:
            self._ending = (exception_type, message)
        self._ended.set()
        self._wake.set()

    def wake(self) -> None:
        """Records were just put on this shard: poll at once."""
        self._wake.set()

    def _known_start(self) -> str | None:
        position = self.request.starting_position
        if position.get("Type") == "AFTER_SEQUENCE_NUMBER":
            return str(position["SequenceNumber"])
        return None

    def _call(self, operation: str, **payload: Any) -> dict[str, Any]:
        return self._upstream.call(operation, payload, self._auth)

    def _event(self, body: dict[str, Any]) -> None:
        self._send(self, frames.event("SubscribeToShardEvent", body))
        self.events_sent += 1

    def run(self) -> str:
        """Stream until an end; returns why: lifetime, shard-end, superseded, consumer-gone,
        client-gone or upstream-error. Only client-gone leaves the body unterminated."""
        deadline = time.monotonic() + self._settings.lifetime_s
        last_event = time.monotonic()
        next_consumer_check = time.monotonic() + self._settings.heartbeat_s
        interval = self._settings.poll_interval_s
        try:
            while True:
                if self._ending is not None:
                    self._send(self, frames.exception(*self._ending))
                    return ("consumer-gone" if self._ending[0] == "ResourceNotFoundException"
                            else "superseded")
                now = time.monotonic()
                if now >= deadline:
                    return "lifetime"
                if now >= next_consumer_check:
                    next_consumer_check = now + self._settings.heartbeat_s
                    if self._consumer_gone(self.request.consumer_arn):
                        self.end_with("ResourceNotFoundException",
                                      f"Consumer {self.request.consumer_arn} not found.")
                        continue
                woken = self._wake.is_set()
                self._wake.clear()
                if woken:
                    interval = self._settings.poll_interval_s
                try:
                    beat = now - last_event >= self._settings.heartbeat_s
                    # wake_only: nothing put since a poll that reached the tip, nothing to read
                    fetch = (woken or not self._settings.wake_only or not self._caught_up
                             or self.continuation is None)
                    pushed = self._poll_once(heartbeat=beat, fetch=fetch)
                except UpstreamError as exc:
                    log.warning("fan-out front: %s on %s: %s", exc.code, self.key, exc.message)
                    self._send(self, frames.exception("InternalFailureException", exc.message))
                    return "upstream-error"
                if pushed:
                    last_event = time.monotonic()
                interval = (self._settings.poll_interval_s if pushed == "records" else
                            min(interval * 2, max(self._settings.idle_poll_interval_s,
                                                  self._settings.poll_interval_s)))
                if self._iterator is None:
                    self._event({"Records": [], "ContinuationSequenceNumber": None,
                                 "MillisBehindLatest": 0, "ChildShards": self._child_shards()})
                    return "shard-end"
                if pushed != "records" or self._caught_up:
                    due = min(deadline, last_event + self._settings.heartbeat_s)
                    wait = max(due - time.monotonic(), 0.0)
                    self._wake.wait(wait if self._settings.wake_only else min(interval, wait))
        except OSError:  # the client left (or a test cut the connection)
            return "client-gone"

    def _poll_once(self, heartbeat: bool, fetch: bool = True) -> str:
        """One GetRecords (unless ``fetch`` is false): its records as events ("records"), else
        a heartbeat if due."""
        assert self._iterator is not None
        before = None
        if heartbeat and self.continuation is None:
            before = self._position_before_start()  # probe first: see _position_before_start
        records: list[dict[str, Any]] = []
        logged = self._logged() if fetch else None
        if logged is not None:
            records = logged
            self._iterator_behind = self._iterator_behind or bool(records)
        elif fetch:
            page = self._get_records()
            records = page.get("Records") or []
            self._iterator = page.get("NextShardIterator")
            self._behind = int(page.get("MillisBehindLatest", 0))
            # behind the tip, or a full page: poll again at once, not after an interval
            self._caught_up = self._behind == 0 and len(records) < _PAGE
            self._read_to_tip = self._caught_up
            self._child_shards_seen = page.get("ChildShards") or self._child_shards_seen
        if records:
            self._push(records, self._behind)
            return "records"
        if heartbeat and self._iterator is not None:
            if self.continuation is None:
                self.continuation = before
            self._event({"Records": [], "ContinuationSequenceNumber": self.continuation,
                         "MillisBehindLatest": self._behind})
            return "heartbeat"
        return ""

    def _logged(self) -> list[dict[str, Any]] | None:
        """The records put since the last event, from the front's put log; None when the
        emulator must be read (no log, no read has reached the tip yet, the log moved on)."""
        if self._put_log is None or not self._read_to_tip or self.continuation is None:
            return None
        return self._put_log.after(self.request.stream_name, self.request.shard_id,
                                   self.continuation)

    def _get_records(self) -> dict[str, Any]:
        if self._iterator_behind and self.continuation is not None:
            self._iterator = self._iterator_after(self.continuation)
            self._iterator_behind = False
        try:
            return self._call("GetRecords", ShardIterator=self._iterator, Limit=_PAGE)
        except UpstreamError as exc:
            if exc.code != "ExpiredIteratorException" or self.continuation is None:
                raise
            self._iterator = self._iterator_after(self.continuation)
            return self._call("GetRecords", ShardIterator=self._iterator, Limit=_PAGE)

    def _iterator_after(self, sequence: str) -> str:
        """An iterator AFTER the last record pushed (the old one expired or was passed by
        records pushed from the put log)."""
        return str(self._call("GetShardIterator", StreamName=self.request.stream_name,
                              ShardId=self.request.shard_id,
                              ShardIteratorType="AFTER_SEQUENCE_NUMBER",
                              StartingSequenceNumber=sequence)["ShardIterator"])

    def _push(self, records: list[dict[str, Any]], behind: int) -> None:
        """Records in events of at most a fifth of a second's reads (and max_event_bytes),
        each paced to the read limit, so a backlog drains at the limit, not in bursts."""
        batch: list[dict[str, Any]] = []
        size = 0
        limit = min(self._settings.max_event_bytes, self._pacer.bytes_per_s / 5)
        for index, record in enumerate(records):
            batch.append(record)
            size += record_size(record)
            if size >= limit or index == len(records) - 1:
                while (wait := self._pacer.wait_s(self.key)) > 0 and self._ending is None:
                    self._ended.wait(wait)
                if self._ending is not None:
                    return  # the records stay unsent: the next subscription reads them
                self._pacer.charge(self.key, size)
                self.continuation = str(batch[-1]["SequenceNumber"])
                self._event({"Records": batch, "ContinuationSequenceNumber": self.continuation,
                             "MillisBehindLatest": behind})
                self.records_sent += len(batch)
                batch, size = [], 0

    def _child_shards(self) -> list[dict[str, Any]]:
        if self._child_shards_seen:
            return list(self._child_shards_seen)
        shards = self._shards()
        parent = self.request.shard_id
        return [{"ShardId": s["ShardId"],
                 "ParentShards": [p for p in (s.get("ParentShardId"),
                                              s.get("AdjacentParentShardId")) if p],
                 "HashKeyRange": s["HashKeyRange"]}
                for s in shards if parent in (s.get("ParentShardId"),
                                              s.get("AdjacentParentShardId"))]

    def _position_before_start(self) -> str:
        """The sequence number to resubscribe AFTER when no record has been pushed yet: the
        last record before the starting position, else the shard's first sequence number.

        For LATEST this is the shard's last record now; the GetRecords that follows this probe
        returns any record after the start, so a heartbeat sent with it skips nothing."""
        position = self.request.starting_position
        kind = position.get("Type")
        found: str | None = None
        if kind == "AT_SEQUENCE_NUMBER":
            first = int(position["SequenceNumber"])
            found = self._last_record(None, lambda r: int(r["SequenceNumber"]) >= first)
        elif kind in ("LATEST", "AT_TIMESTAMP") and not self._shard_is_empty():
            until = float(position["Timestamp"]) if kind == "AT_TIMESTAMP" else time.time()

            def after(record: dict[str, Any]) -> bool:
                return kind == "AT_TIMESTAMP" and float(record["ApproximateArrivalTimestamp"]) >= until

            for look_back in (*_LOOK_BACK_S, None):
                found = self._last_record(None if look_back is None else until - look_back, after)
                if found:
                    break
        return found or self._first_sequence()

    def _last_record(self, start_at: float | None,
                     stop: Callable[[dict[str, Any]], bool]) -> str | None:
        """The sequence number of the last record from ``start_at`` (None: the shard's start)
        on, up to the tip or to the first record ``stop`` accepts."""
        kwargs: dict[str, Any] = {"ShardIteratorType": "TRIM_HORIZON"}
        if start_at is not None:
            kwargs = {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": round(start_at, 3)}
        iterator = self._call("GetShardIterator", StreamName=self.request.stream_name,
                              ShardId=self.request.shard_id, **kwargs).get("ShardIterator")
        last = None
        while iterator:
            page = self._call("GetRecords", ShardIterator=iterator, Limit=_PAGE)
            for record in page.get("Records") or []:
                if stop(record):
                    return last
                last = str(record["SequenceNumber"])
            if not page.get("Records"):
                return last
            iterator = page.get("NextShardIterator")
        return last

    def _shard_is_empty(self) -> bool:
        iterator = self._call("GetShardIterator", StreamName=self.request.stream_name,
                              ShardId=self.request.shard_id,
                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        return not self._call("GetRecords", ShardIterator=iterator, Limit=1).get("Records")

    def _shards(self) -> list[dict[str, Any]]:
        """The stream's shards, every page."""
        shards: list[dict[str, Any]] = []
        page = self._call("ListShards", StreamName=self.request.stream_name)
        while True:
            shards += page["Shards"]
            if not page.get("NextToken"):
                return shards
            page = self._call("ListShards", NextToken=page["NextToken"])

    def _first_sequence(self) -> str:
        for shard in self._shards():
            if shard["ShardId"] == self.request.shard_id:
                return str(shard["SequenceNumberRange"]["StartingSequenceNumber"])
        raise UpstreamError(400, "ResourceNotFoundException",
                            f"Shard {self.request.shard_id} not found.")
