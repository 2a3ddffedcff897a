"""The lease loop both workers run: the Scheduler's and the Spark driver's coordinator's.

Every pass runs what is due on the lease side (``LeaseManager.run_due``: shard sync, lease
taking, parent polls) and then the owner's own step (start consumers; or open lease periods
and write due checkpoints). What differs between the two is only that step, which errors
end the loop for good, and what wakes it early; the pacing, the backoff while a service is
failing and the rate-limited fault log are this one loop.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from ..config import ConsumerConfig
from ..errors import KinesisDStreamError
from ..retry import Backoff, FaultLog
from .lease_manager import LeaseManager

log = logging.getLogger(__name__)

TICK_S = 0.2


def lease_loop_backoff(config: ConsumerConfig) -> Backoff:
    """The loop's backoff while a service fails: from twice retry.waitTime (a tick at least),
    capped at the lease renewal interval, so that once an outage ends the next pass (renewals,
    due checkpoints) comes within one renewal interval instead of up to half a minute later."""
    base_ms = max(config.retry_wait_time_ms * 2, int(TICK_S * 1000))
    return Backoff(base_ms=base_ms, cap_ms=max(config.renew_interval_ms, base_ms))


def run_lease_loop(manager: LeaseManager, step: Callable[[], None], *, what: str,
                   stop: threading.Event, waiting_on_parents: Callable[[], bool],
                   backoff: Backoff, wake: threading.Event | None = None,
                   prepare: Callable[[], None] | None = None,
                   permanent: tuple[type[BaseException], ...] = (),
                   on_permanent: Callable[[BaseException], None] | None = None) -> None:
    """Pass after pass until ``stop`` is set (or a ``permanent`` error, handed to
    ``on_permanent``). A transient failure backs off, capped, and is logged at most once a
    minute while it lasts; an unexpected error is logged with its traceback and the loop
    goes on: a worker that stops taking and renewing leases would go on reading nothing.
    ``prepare`` runs first in every pass (a start-up that has not succeeded yet)."""
    fault = FaultLog(log, what)
    while not stop.is_set():
        wait = TICK_S
        try:
            if prepare is not None:
                prepare()
            manager.run_due(time.monotonic(), waiting_on_parents)
            step()
            backoff.reset()
            fault.succeeded()
        except permanent as exc:
            if on_permanent is not None:
                on_permanent(exc)
            return
        except KinesisDStreamError as exc:
            wait = backoff.next_wait_s()
            fault.failed(exc, wait)
            stop.wait(wait)
            continue
        except Exception:  # noqa: BLE001 - keep the leases going, loudly
            wait = backoff.next_wait_s()  # a bug that repeats: not five tracebacks a second
            log.exception("%s failed unexpectedly; next pass in %.3g s", what, wait)
            stop.wait(wait)
            continue
        if wake is None:
            stop.wait(wait)
        else:
            wake.wait(wait)
            wake.clear()
