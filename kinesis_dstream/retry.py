"""The one retry policy, for Kinesis and DynamoDB calls alike.

Spark's kinesis-asl semantics: wait ``retry_wait_time_ms``, doubling, for at most
``retry_max_attempts`` tries, and retry only what is worth retrying (``error.retryable``).
Each wait is jittered between half and all of the doubled wait (capped), so workers that
failed together do not retry together; the random source and the sleep are parameters,
as in botocore's ``retries`` package, so tests control both.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypeVar

from .errors import RetriesExhaustedError

if TYPE_CHECKING:
    from .config import ConsumerConfig

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    wait_time_ms: int = 100
    max_attempts: int = 3
    max_wait_ms: int = 10_000

    @classmethod
    def from_config(cls, config: "ConsumerConfig") -> "RetryPolicy":
        return cls(wait_time_ms=config.retry_wait_time_ms, max_attempts=config.retry_max_attempts)

    def backoff_ms(self, attempt: int) -> int:
        """The un-jittered ceiling of the wait before try ``attempt + 1`` (from 1)."""
        return min(self.wait_time_ms * (2 ** min(attempt - 1, 30)), self.max_wait_ms)

    def jittered_backoff_ms(self, attempt: int,
                            rand: Callable[[], float] = random.random) -> float:
        """Between half and all of ``backoff_ms``: "equal jitter".

        Half is kept so Spark's waitTime still bounds the wait from below (full jitter
        could retry a throttled shard at once); the other half spreads workers apart.
        """
        ceiling = self.backoff_ms(attempt)
        return ceiling / 2 + rand() * ceiling / 2

    def call(self, fn: Callable[[], T], what: str,
             sleep: Callable[[float], None] = time.sleep,
             rand: Callable[[], float] = random.random) -> T:
        """Run ``fn``; on a retryable error back off and try again.

        Raises ``RetriesExhaustedError("Gave up after N retries while <what>")`` with the
        last error attached; a non-retryable error propagates at once.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - classified just below
                if not getattr(exc, "retryable", False):
                    raise
                if attempt >= self.max_attempts:
                    raise RetriesExhaustedError(
                        f"Gave up after {attempt} attempts while {what}: {exc}", exc
                    ) from exc
                wait = self.jittered_backoff_ms(attempt, rand)
                log.debug("retrying %s in %d ms after %s (attempt %d/%d)",
                          what, wait, exc, attempt, self.max_attempts)
                sleep(wait / 1000.0)


class Backoff:
    """Capped exponential backoff with equal jitter for waits that have no attempt limit.

    The shard consumer and the scheduler wait this way after a call gave up
    (``RetriesExhaustedError``): the wait grows from ``base_ms`` up to ``cap_ms`` while the
    fault lasts and starts again from ``base_ms`` once a call succeeds.
    """

    def __init__(self, base_ms: int, cap_ms: int = 10_000,
                 rand: Callable[[], float] = random.random):
        self._policy = RetryPolicy(wait_time_ms=base_ms, max_attempts=1, max_wait_ms=cap_ms)
        self._rand = rand
        self.failures = 0

    def next_wait_s(self) -> float:
        """Count one more failure and return how long to wait before trying again."""
        self.failures += 1
        return self._policy.jittered_backoff_ms(self.failures, self._rand) / 1000.0

    def reset(self) -> None:
        self.failures = 0


class FaultLog:
    """Logs a lasting transient fault at most once per ``interval_s``, with a count.

    A dead endpoint would otherwise log one warning per retry for as long as it is down;
    this logs the first failure, then a summary per interval, and one line when it clears.
    """

    def __init__(self, logger: logging.Logger, what: str, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self._log = logger
        self._what = what
        self._interval_s = interval_s
        self._clock = clock
        self._failures = 0
        self._unlogged = 0
        self._last_logged = 0.0
        self._since = 0.0

    @property
    def failing(self) -> bool:
        return self._failures > 0

    def failed(self, error: BaseException, next_wait_s: float) -> None:
        now = self._clock()
        if self._failures == 0:
            self._since = now
        self._failures += 1
        self._unlogged += 1
        if self._failures == 1 or now - self._last_logged >= self._interval_s:
            self._log.warning("%s failing (%d failure(s) in %.0f s; %d since the last line): %s; "
                              "trying again in %.1f s", self._what, self._failures,
                              now - self._since, self._unlogged, error, next_wait_s)
            self._last_logged = now
            self._unlogged = 0

    def succeeded(self) -> None:
        if self._failures:
            self._log.warning("%s works again after %d failure(s) in %.0f s", self._what,
                              self._failures, self._clock() - self._since)
        self._failures = 0
        self._unlogged = 0
