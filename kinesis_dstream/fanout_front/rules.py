"""SubscribeToShard's limits per (consumer, shard), as Kinesis documents them, without I/O.

- at most one call per ``call_interval_s`` (1 s): more is ``LimitExceededException``;
- a call within ``takeover_after_s`` (5 s) of a successful one is ``ResourceInUseException``;
  a later one succeeds and takes over: the subscription it replaces ends with
  ``ResourceInUseException``;
- a consumer reads at most ``bytes_per_s`` (2 MiB/s) a shard: events are paced to it.

The clock is a parameter so that tests drive these rules without waiting.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

MiB = 1024 * 1024
Key = tuple[str, str]  # (consumer ARN, shard id)
S = TypeVar("S")


class Refused(Exception):
    """A call the rules refuse: ``code`` is the Kinesis error's ``__type``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Slot(Generic[S]):
    last_call: float | None = None
    last_success: float | None = None
    current: S | None = None


class SubscribeRules(Generic[S]):
    """Admits or refuses calls, and remembers each (consumer, shard)'s current subscription."""

    def __init__(self, *, call_interval_s: float = 1.0, takeover_after_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.call_interval_s = call_interval_s
        self.takeover_after_s = takeover_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: dict[Key, _Slot[S]] = {}

    def admit(self, consumer_arn: str, shard_id: str) -> None:
        """Raise ``Refused`` if a call now breaks a rule; a refused call does not count."""
        now = self._clock()
        with self._lock:
            slot = self._slots.setdefault((consumer_arn, shard_id), _Slot())
            if slot.last_call is not None and now - slot.last_call < self.call_interval_s:
                raise Refused("LimitExceededException",
                              f"Rate exceeded for consumer {consumer_arn} and shard {shard_id}.")
            slot.last_call = now
            if slot.last_success is not None and now - slot.last_success < self.takeover_after_s:
                raise Refused("ResourceInUseException",
                              f"Another active subscription exists for consumer {consumer_arn} "
                              f"and shard {shard_id}.")

    def succeeded(self, consumer_arn: str, shard_id: str, subscription: S) -> S | None:
        """Record a successful call; returns the subscription it takes over from, if any."""
        with self._lock:
            slot = self._slots.setdefault((consumer_arn, shard_id), _Slot())
            slot.last_success = self._clock()
            previous, slot.current = slot.current, subscription
            return previous

    def ended(self, consumer_arn: str, shard_id: str, subscription: S) -> None:
        with self._lock:
            slot = self._slots.get((consumer_arn, shard_id))
            if slot is not None and slot.current is subscription:
                slot.current = None

    def current(self) -> list[S]:
        with self._lock:
            return [s.current for s in self._slots.values() if s.current is not None]


class ReadPacer:
    """A byte budget per (consumer, shard) refilling at ``bytes_per_s`` up to one second's
    worth: an event may go while the budget is positive and is then charged its size, so a
    consumer drains at the limit on average, as Kinesis paces pushed events."""

    def __init__(self, bytes_per_s: float = 2 * MiB,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bytes_per_s = bytes_per_s
        self._clock = clock
        self._lock = threading.Lock()
        self._budget: dict[Key, tuple[float, float]] = {}  # key -> (bytes, as of when)

    def wait_s(self, key: Key) -> float:
        """Seconds until an event may go (0: now)."""
        now = self._clock()
        with self._lock:
            budget, when = self._budget.get(key, (self.bytes_per_s, now))
            budget = min(self.bytes_per_s, budget + (now - when) * self.bytes_per_s)
            self._budget[key] = (budget, now)
            return 0.0 if budget > 0 else -budget / self.bytes_per_s + 1e-3

    def charge(self, key: Key, size: int) -> None:
        now = self._clock()
        with self._lock:
            budget, when = self._budget.get(key, (self.bytes_per_s, now))
            budget = min(self.bytes_per_s, budget + (now - when) * self.bytes_per_s)
            self._budget[key] = (budget - size, now)
