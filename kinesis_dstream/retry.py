"""The one retry vocabulary: what is worth retrying, how long to wait, and how to say so.

As botocore's ``retries``: a policy is a checker (``classify``: throttling, transient or
permanent, read from error classes that ``aws/clients.py`` makes of AWS codes) plus a jittered
backoff. ``RetryPolicy`` bounds one call; ``Backoff`` paces loops that outlive a policy;
``FaultLog`` and ``RetryCounts`` say what happened without flooding the log. Random source,
clock and sleep are parameters everywhere, so tests control time.

Every wait is "equal jitter", between half and all of its ceiling: the configured wait still
bounds it from below (full jitter could retry a throttled shard at once), and workers that
failed together spread apart.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, TypeVar

from .errors import (
    PERMANENT,
    THROTTLING,
    TRANSIENT,
    ConfigurationError,
    KinesisDStreamError,
    RetriesExhaustedError,
)

if TYPE_CHECKING:
    from .config import ConsumerConfig

log = logging.getLogger(__name__)
T = TypeVar("T")
Kind = Literal["throttling", "transient", "permanent"]

__all__ = ["THROTTLING", "TRANSIENT", "PERMANENT", "Kind", "MAX_WAIT_MS", "classify",
           "is_transient", "is_throttling", "THROTTLE_WAIT_MS", "throttle_wait_s", "RetryCounts",
           "RETRIES", "Deadline", "RetryPolicy", "Backoff", "poll_until", "wait_out", "FaultLog"]

# The cap of a wait between tries, unless a caller names its own (kinesis-asl has none; a
# throttled shard clears within seconds, and a longer wait only delays the recovery).
MAX_WAIT_MS = 10_000


# -- the checker ------------------------------------------------------------------------------
def classify(exc: BaseException) -> Kind:
    """``"throttling"``, ``"transient"`` or ``"permanent"``; a give-up by the error it gave up on.

    Only our errors have a kind: anything else (a bug, a botocore error not translated) is
    permanent, so nothing unknown is retried.
    """
    if isinstance(exc, RetriesExhaustedError) and exc.last_error is not None:
        exc = exc.last_error
    return exc.kind if isinstance(exc, KinesisDStreamError) else PERMANENT  # type: ignore[return-value]


def is_transient(exc: BaseException) -> bool:
    """Worth waiting out (throttling or transient), even after a policy gave up on it."""
    return classify(exc) != PERMANENT


def is_throttling(exc: BaseException) -> bool:
    return classify(exc) == THROTTLING


def _worth_retrying(exc: BaseException) -> bool:
    """A policy retries what is transient, but not a call that already gave up."""
    return not isinstance(exc, RetriesExhaustedError) and is_transient(exc)


class RetryCounts:
    """Retries made by ``RetryPolicy.call``, by kind, and the calls that gave up.

    ``throttled`` counts waits after a throttle, including throttles that cleared inside the
    retries (nothing else sees those); read ``snapshot()`` to publish them as a metric.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.throttled = 0
        self.transient = 0
        self.exhausted = 0

    def retried(self, kind: Kind) -> None:
        with self._lock:
            if kind == THROTTLING:
                self.throttled += 1
            else:
                self.transient += 1

    def gave_up(self) -> None:
        with self._lock:
            self.exhausted += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"throttled": self.throttled, "transient": self.transient,
                    "exhausted": self.exhausted}


RETRIES = RetryCounts()  # every RetryPolicy.call in this process counts here unless told otherwise


# -- the backoff ------------------------------------------------------------------------------
def _ceiling_ms(base_ms: float, attempt: int, cap_ms: float) -> float:
    """``base_ms`` doubled for each attempt after the first, capped."""
    return min(base_ms * (2 ** min(attempt - 1, 30)), cap_ms)


def _equal_jitter(ceiling: float, rand: Callable[[], float]) -> float:
    return ceiling / 2 + rand() * ceiling / 2


# A Kinesis shard refuses reads while its 2 MiB/s budget is in debt (about 4 s after a 10 MiB
# page) or past 5 calls a second, for all its readers together; AWS advises waiting 1 s.
THROTTLE_WAIT_MS = 1000


def throttle_wait_s(rand: Callable[[], float] = random.random) -> float:
    """The wait after a read refused for throughput: between half a second and one.

    Not exponential: a refusal lasts as long as the shard's debt, which trying again does
    not lengthen, and a refilling budget is lost only once it is full (about a second's
    worth), so waits of at most 1 s forgo no throughput, while two tries a second leave
    most of a shard's 5 calls/s to the other applications reading it.
    """
    return _equal_jitter(THROTTLE_WAIT_MS, rand) / 1000.0


class Deadline:
    """A moment on an injectable clock; loops that must end in time carry one."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._at = clock() + timeout_s

    def remaining_s(self) -> float:
        return max(0.0, self._at - self._clock())

    @property
    def expired(self) -> bool:
        return self._clock() >= self._at


@dataclass(frozen=True)
class RetryPolicy:
    """Try a call up to ``max_attempts`` times, within ``deadline_ms`` if one is set."""

    wait_time_ms: int = 100
    max_attempts: int = 3
    max_wait_ms: int = MAX_WAIT_MS
    deadline_ms: int | None = None
    # False: a throttle is raised at once, for a caller that paces its own tries
    # (``throttle_wait_s``) and counts them.
    retry_throttling: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.wait_time_ms < 1:  # 0 would make every retry a hot loop against the service
            raise ConfigurationError(f"wait_time_ms must be at least 1, got {self.wait_time_ms}")
        if self.deadline_ms is not None and self.deadline_ms <= 0:
            raise ConfigurationError(f"deadline_ms must be positive, got {self.deadline_ms}")

    @classmethod
    def from_config(cls, config: "ConsumerConfig") -> "RetryPolicy":
        return cls(wait_time_ms=config.retry_wait_time_ms, max_attempts=config.retry_max_attempts)

    def backoff_ms(self, attempt: int) -> float:
        """The un-jittered ceiling of the wait after try ``attempt`` (from 1)."""
        return _ceiling_ms(self.wait_time_ms, attempt, self.max_wait_ms)

    def jittered_backoff_ms(self, attempt: int,
                            rand: Callable[[], float] = random.random) -> float:
        """Between half and all of ``backoff_ms``."""
        return _equal_jitter(self.backoff_ms(attempt), rand)

    def call(self, fn: Callable[[], T], what: str, *,
             sleep: Callable[[float], None] = time.sleep,
             rand: Callable[[], float] = random.random,
             clock: Callable[[], float] = time.monotonic,
             counts: RetryCounts = RETRIES) -> T:
        """Run ``fn``; on a throttling or transient error back off and try again.

        Raises ``RetriesExhaustedError("Gave up after N attempts while <what>: <error>")``
        with the last error attached, after ``max_attempts`` tries or when the next wait would
        pass the deadline; a permanent error (or a nested give-up) propagates at once. Each
        retry is counted in ``counts`` by kind.
        """
        deadline = None if self.deadline_ms is None else Deadline(self.deadline_ms / 1000, clock)
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - classified just below
                if not _worth_retrying(exc) or (not self.retry_throttling
                                                 and is_throttling(exc)):
                    raise
                wait_ms = (None if attempt >= self.max_attempts
                           else self.jittered_backoff_ms(attempt, rand))
                if wait_ms is None or (deadline is not None
                                       and wait_ms / 1000 > deadline.remaining_s()):
                    counts.gave_up()
                    within = ("" if wait_ms is None or self.deadline_ms is None
                              else f" within {self.deadline_ms / 1000:g} s")
                    raise RetriesExhaustedError(
                        f"Gave up after {attempt} attempts{within} while {what}: {exc}", exc
                    ) from exc
                counts.retried(classify(exc))
                log.debug("retrying %s in %.0f ms after %s (attempt %d/%d)",
                          what, wait_ms, exc, attempt, self.max_attempts)
                sleep(wait_ms / 1000.0)


class Backoff:
    """Capped exponential waits with equal jitter, for loops that never give up.

    The wait grows from ``base_ms`` up to ``cap_ms`` while the fault lasts (``next_wait_s``)
    and starts again from ``base_ms`` after ``reset`` (a success).
    """

    def __init__(self, base_ms: float, cap_ms: float = MAX_WAIT_MS,
                 rand: Callable[[], float] = random.random):
        self._base_ms = base_ms
        self._cap_ms = cap_ms
        self._rand = rand
        self.failures = 0

    @classmethod
    def after_retries(cls, config: "ConsumerConfig",
                      rand: Callable[[], float] = random.random) -> "Backoff":
        """The wait of a shard after its retry policy gave up: 2 x waitTime doubling, to 10 s."""
        return cls(base_ms=config.retry_wait_time_ms * 2, cap_ms=MAX_WAIT_MS, rand=rand)

    def next_wait_s(self) -> float:
        """Count one more failure and return how long to wait before trying again."""
        self.failures += 1
        return _equal_jitter(_ceiling_ms(self._base_ms, self.failures, self._cap_ms),
                             self._rand) / 1000.0

    def reset(self) -> None:
        self.failures = 0


def poll_until(check: Callable[[], T], what: str, *, timeout_s: float,
               interval_s: float = 0.1, max_interval_s: float = 1.0,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep,
               rand: Callable[[], float] = random.random) -> T:
    """Call ``check`` until it returns something true, and return that.

    The waits start at ``interval_s`` and double up to ``max_interval_s`` (a DynamoDB table
    that takes 20 s to become ACTIVE costs about 25 DescribeTable calls, not 200), never past
    the deadline, where ``check`` runs a last time. Then ``TimeoutError("<what> after N s")``:
    ``what`` names the condition not met, e.g. ``"lease table t not ACTIVE"``.
    """
    deadline = Deadline(timeout_s, clock)
    backoff = Backoff(base_ms=interval_s * 1000, cap_ms=max_interval_s * 1000, rand=rand)
    while True:
        result = check()
        if result:
            return result
        remaining = deadline.remaining_s()
        if remaining <= 0:
            raise TimeoutError(f"{what} after {timeout_s:g} s")
        sleep(min(backoff.next_wait_s(), remaining))


def wait_out(fn: Callable[[], T], *, patience_s: float, fault: "FaultLog", backoff: Backoff,
             sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> T:
    """``fn()``, with throttling and outages (also ones a retry policy already gave up on)
    waited out for up to ``patience_s``, then the last one raised.

    For a call that must happen before the caller can go on, and may happen late: a batch's
    range is written before any of its records leaves the task, however long DynamoDB is
    away (within patience). Permanent errors propagate at once; the fault is logged at most
    once a minute while it lasts, and its recovery once.
    """
    deadline = Deadline(patience_s, clock)
    while True:
        try:
            result = fn()
        except KinesisDStreamError as exc:
            if not is_transient(exc) or deadline.expired:
                raise
            wait = min(backoff.next_wait_s(), deadline.remaining_s())
            fault.failed(exc, wait)
            sleep(wait)
            continue
        fault.succeeded()
        return result


def _failures(n: int) -> str:
    return f"{n} failure" if n == 1 else f"{n} failures"


class FaultLog:
    """Logs a lasting fault at most once per ``interval_s`` while it lasts, counting every failure.

    A fault opens at a failure and closes when its recovery has been logged. The first
    failure is logged at once; later lines say how many failures came since the last line
    and in all. Successes do not reset the rate limit: a fault that flaps within the minute
    stays at one "failing" line and one "works again" line per interval, and a recovery
    held back by the limit is logged by a later ``succeeded`` (``failing`` stays true until
    then, so callers that only report while failing keep reporting).
    """

    def __init__(self, logger: logging.Logger, what: str, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self._log = logger
        self._what = what
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._opened_at: float | None = None    # the open fault's first failure
        self._recovered_at: float | None = None  # its first success since the last failure
        self._total = 0                          # failures since it opened
        self._unlogged = 0                       # failures since the last "failing" line
        self._failing_line_at: float | None = None
        self._works_line_at: float | None = None

    @property
    def failing(self) -> bool:
        """True from a failure until its recovery has been logged."""
        return self._opened_at is not None

    def _due(self, last: float | None, now: float) -> bool:
        return last is None or now - last >= self._interval_s

    def failed(self, error: BaseException, next_wait_s: float | None = None) -> None:
        """Count one failure; ``next_wait_s`` is said only when a next try is planned (> 0)."""
        with self._lock:
            now = self._clock()
            if self._opened_at is None:
                self._opened_at = now
            self._recovered_at = None
            self._total += 1
            self._unlogged += 1
            if not self._due(self._failing_line_at, now):
                return
            retry = f"; trying again in {next_wait_s:.3g} s" if next_wait_s else ""
            if self._total == 1:
                self._log.warning("%s failing: %s%s", self._what, error, retry)
            else:
                self._log.warning("%s still failing after %.0f s: %s since the last line, %d in "
                                  "all; last error: %s%s", self._what, now - self._opened_at,
                                  _failures(self._unlogged), self._total, error, retry)
            self._failing_line_at = now
            self._unlogged = 0

    def succeeded(self) -> None:
        with self._lock:
            if self._opened_at is None:
                return
            now = self._clock()
            if self._recovered_at is None:
                self._recovered_at = now
            if not self._due(self._works_line_at, now):
                return
            unlogged = f" ({self._unlogged} since the last line)" if self._unlogged else ""
            since = (f"; working for {now - self._recovered_at:.0f} s"
                     if now - self._recovered_at >= 1 else "")
            self._log.warning("%s works again after %s in %.0f s%s%s", self._what,
                              _failures(self._total), self._recovered_at - self._opened_at,
                              unlogged, since)
            self._works_line_at = now
            self._opened_at = self._recovered_at = None
            self._total = self._unlogged = 0
