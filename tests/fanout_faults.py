"""The fan-out front with the faults and counts tests need (``make_fanout_front``).

``FaultyFanOutFront`` is a ``FanOutFront`` that also:
- counts every call clients make, by (operation, shard id) in ``calls``: GetRecords is
  attributed to the shard its iterator reads (from the GetShardIterator / GetRecords answer
  that handed the iterator out), so a test asserts "no GetRecords on this shard";
- ``cut_after(events)``: the next subscription to push ``events`` events is cut there, the
  connection closed without the body's last chunk, as a network failure does (``cuts``);
- ``refuse_next(code, count=1)``: the next ``count`` SubscribeToShard calls are answered with
  ``code`` (ResourceInUseException, LimitExceededException, ...) as Kinesis answers them;
- counts the front's own calls to the emulator by operation in ``upstream_calls`` (what a
  subscription costs the emulator), notes when each began (``upstream_began``: monotonic
  time and operation) and counts those answered (``upstream_answered``), so a test waits
  for a poll to be behind it and measures the gaps between polls;
- notes when it began sending each SubscribeToShardEvent (``events_sent_at``: monotonic
  time, shard id and whether it carried records), so a test measures heartbeats where the
  front decides them, not where a loaded client happens to read them;
- notes when it pushed records (``pushed``: the time and the shard of each event that
  carried any; ``first_pushed``: when each record's data was first pushed), so a test knows
  when a subscriber could first have read a put, with a producer writing beside it too;
- notes each successful subscribe and whether it took an open subscription over
  (``succeeded``), so a test waits for whole lifetimes of one reader
  (``whole_lifetimes``), not for calls that refusals also make;
- ``refuse_shard(shard_id, code)``: every SubscribeToShard on that shard is answered with
  ``code`` (AccessDeniedException: a permanent refusal), until ``refuse_shard(shard_id, None)``;
- ``deregister_behind(consumer_arn)``: deregisters a consumer on the emulator directly, not
  through the front, as another client elsewhere would: a running subscription learns of it
  within a heartbeat and ends with ResourceNotFoundException.
"""
from __future__ import annotations

import base64
import json
import re
import struct
import threading
import time
from collections import Counter
from typing import Any

from kinesis_dstream.fanout_front import FanOutFront, Subscription
from kinesis_dstream.fanout_front.server import _FrontHandler

_SHARD_ID = re.compile(r"shardId-[0-9]{12}")


class FaultyFanOutFront(FanOutFront):
    def __init__(self, upstream: str, **settings: Any) -> None:
        super().__init__(upstream, **settings)
        self.calls: Counter[tuple[str, str]] = Counter()
        self.cuts = 0
        self.refused: Counter[str] = Counter()
        self._cut_after: int | None = None
        self._refusals: list[str] = []
        self._refused_shards: dict[str, str] = {}
        self._iterators: dict[str, str] = {}  # iterator -> shard id
        self._fault_lock = threading.Lock()
        self.upstream_calls: Counter[str] = Counter()
        self.upstream_began: list[tuple[float, str]] = []  # (monotonic s, operation)
        self.upstream_answered: Counter[str] = Counter()
        # (monotonic s, shard id, whether it carried records) of each event sent
        self.events_sent_at: list[tuple[float, str, bool]] = []
        self.pushed: list[tuple[float, str]] = []  # (epoch s, shard id) of events with records
        self.first_pushed: dict[bytes, float] = {}  # a record's data -> epoch s of its 1st push
        self.subscribed: list[tuple[float, str]] = []  # (epoch s, shard id) of each subscribe
        # (epoch s, shard id, whether it took over an open one) of each successful subscribe
        self.succeeded: list[tuple[float, str, bool]] = []
        call, succeeded = self.upstream.call, self.rules.succeeded

        def counted(operation: str, payload: dict[str, Any], auth: dict[str, str]) -> Any:
            with self._fault_lock:
                self.upstream_calls[operation] += 1
                self.upstream_began.append((time.monotonic(), operation))
            answer = call(operation, payload, auth)
            with self._fault_lock:
                self.upstream_answered[operation] += 1
            return answer

        def noted(consumer_arn: str, shard_id: str, subscription: Any) -> Any:
            previous = succeeded(consumer_arn, shard_id, subscription)
            with self._fault_lock:
                self.succeeded.append((time.time(), shard_id, previous is not None))
            return previous

        self.upstream.call = counted  # type: ignore[method-assign]
        self.rules.succeeded = noted  # type: ignore[method-assign]

    # -- faults ------------------------------------------------------------------------------
    def cut_after(self, events: int) -> None:
        with self._fault_lock:
            self._cut_after = events

    def refuse_next(self, code: str, count: int = 1) -> None:
        with self._fault_lock:
            self._refusals += [code] * count

    def refuse_shard(self, shard_id: str, code: str | None) -> None:
        with self._fault_lock:
            if code is None:
                self._refused_shards.pop(shard_id, None)
            else:
                self._refused_shards[shard_id] = code

    def deregister_behind(self, consumer_arn: str) -> None:
        self.upstream.call("DeregisterStreamConsumer", {"ConsumerARN": consumer_arn},
                           {"Authorization": "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/"
                                             "20260101/us-east-1/kinesis/aws4_request, "
                                             "SignedHeaders=host, Signature=0",
                            "X-Amz-Date": "20260101T000000Z"})

    def count(self, operation: str, shard_id: str | None = None) -> int:
        """Calls of ``operation`` (on ``shard_id``, or on any shard)."""
        return sum(n for (op, shard), n in self.calls.items()
                   if op == operation and shard_id in (None, shard))

    # -- the front's seams ---------------------------------------------------------------------
    def subscribe(self, handler: _FrontHandler, body: bytes) -> None:
        shard = json.loads(body or b"{}").get("ShardId", "")
        with self._fault_lock:
            self.calls[("SubscribeToShard", shard)] += 1
            self.subscribed.append((time.time(), shard))
            code = self._refused_shards.get(shard) or (
                self._refusals.pop(0) if self._refusals else None)
            if code is not None:
                self.refused[code] += 1
        if code is not None:
            handler.send_error_body(code, f"{code} (fan-out fault).")
            return
        super().subscribe(handler, body)

    def send(self, subscription: Subscription, message: bytes) -> None:
        if b"SubscribeToShardEvent" in message[:200]:
            with self._fault_lock:
                if self._cut_after is not None and subscription.events_sent >= self._cut_after:
                    self._cut_after = None
                    self.cuts += 1
                    raise ConnectionResetError("cut by the fan-out fault")
                self.events_sent_at.append((time.monotonic(), subscription.request.shard_id,
                                            b'"Data"' in message))
        super().send(subscription, message)
        if b"SubscribeToShardEvent" in message[:200] and b'"Data"' in message:
            now = time.time()
            with self._fault_lock:
                self.pushed.append((now, subscription.request.shard_id))
                for data in _records_data(message):
                    self.first_pushed.setdefault(data, now)

    def began(self, operation: str) -> list[float]:
        """When each of the front's own calls of ``operation`` to the emulator began."""
        with self._fault_lock:
            return [at for at, op in self.upstream_began if op == operation]

    def whole_lifetimes(self, shard_id: str, since: float) -> int:
        """How many whole subscription lifetimes ``shard_id``'s subscription has lasted since
        ``since`` without another reader taking it over: the renewals after the last
        takeover (the subscription each renews lived its lifetime out). Calls refused
        meanwhile, and a stopped reader's subscription that takes the shard over once more
        as it ends, do not count."""
        with self._fault_lock:
            succeeded = [took for at, s, took in self.succeeded if s == shard_id and at > since]
        renewals = 0
        for took in reversed(succeeded):
            if took:
                break
            renewals += 1
        return min(renewals, len(succeeded) - 1)

    def pushed_since(self, since: float, shards: set[str]) -> float:
        """When every one of ``shards`` had its first event with records after ``since``
        pushed (what was put on them then, if it fitted one event each)."""
        with self._fault_lock:
            return max(min(at for at, s in self.pushed if at >= since and s == shard)
                       for shard in shards)

    def pushed_at(self, data: list[bytes]) -> float:
        """When the last of the records ``data`` was first pushed (KeyError: one never was)."""
        with self._fault_lock:
            return max(self.first_pushed[d] for d in data)

    def exchange(self, operation: str, method: str, path: str, body: bytes,
                 headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        request = json.loads(body or b"{}") if body else {}
        with self._fault_lock:
            if operation == "GetRecords":
                shard = self._iterators.get(request.get("ShardIterator", ""), "")
            else:
                found = set(_SHARD_ID.findall(body.decode("utf-8", "replace")))
                shard = found.pop() if len(found) == 1 else ""
            self.calls[(operation, shard)] += 1
        status, reply_headers, data = super().exchange(operation, method, path, body, headers)
        if status == 200 and operation in ("GetShardIterator", "GetRecords"):
            handed = json.loads(data).get("ShardIterator" if operation == "GetShardIterator"
                                          else "NextShardIterator")
            if handed:
                with self._fault_lock:
                    self._iterators[handed] = shard
        return status, reply_headers, data


def _records_data(message: bytes) -> list[bytes]:
    """The records' data in one SubscribeToShardEvent message (its JSON payload sits between
    the prelude with the headers and the CRC: ``fanout_front.frames``)."""
    total, headers = struct.unpack(">II", message[:8])
    payload = json.loads(message[12 + headers:total - 4])
    return [base64.b64decode(r["Data"]) for r in payload.get("Records", [])]
