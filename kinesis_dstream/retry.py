"""The one retry policy, for Kinesis and DynamoDB calls alike.

Spark's kinesis-asl semantics: wait ``retry_wait_time_ms``, doubling, for at most
``retry_max_attempts`` tries, and retry only what is worth retrying (``error.retryable``).
The sleep function is a parameter so tests control time.
"""
from __future__ import annotations

import logging
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
        """Wait before try ``attempt + 1`` (attempt counts from 1)."""
        return min(self.wait_time_ms * (2 ** (attempt - 1)), self.max_wait_ms)

    def call(self, fn: Callable[[], T], what: str,
             sleep: Callable[[float], None] = time.sleep) -> T:
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
                wait = self.backoff_ms(attempt)
                log.debug("retrying %s in %d ms after %s (attempt %d/%d)",
                          what, wait, exc, attempt, self.max_attempts)
                sleep(wait / 1000.0)
