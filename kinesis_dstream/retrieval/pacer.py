"""The pacer: how a read loop waits after Kinesis refused or failed a call.

One rule for every loop that reads a shard (the executors' reader, the worker's shard
consumer): a read refused for throughput waits ``throttle_wait_s`` (about a second, as AWS
advises; trying sooner only spends the shard's 5 calls a second, shared by every
application), any other fault backs off exponentially, and a loop with a deadline never
waits past it. The loop keeps its own "give up or go on" choice; the pacer counts what it
was told and says how long to wait, or that the loop should stop here.
"""
from __future__ import annotations

from ..retry import Backoff, Deadline, FaultLog, is_throttling, throttle_wait_s


class Pacer:
    """Waits between a read loop's tries, counting throttles and other faults.

    ``deadline``: no wait runs past it, and a fault met after it stops the loop.
    ``throttle_patience_s``: the most a loop waits on throttles in all before it stops (a
    new executor range that would rather hand out nothing than hold its core). ``fault``
    logs a lasting fault once a minute; ``backoff`` paces the faults that are not throttles.
    """

    def __init__(self, backoff: Backoff, fault: FaultLog, *, deadline: Deadline | None = None,
                 throttle_patience_s: float | None = None) -> None:
        self._backoff = backoff
        self._fault = fault
        self.deadline = deadline
        self._throttle_patience_s = throttle_patience_s
        self._throttle_waited_s = 0.0
        self.throttled = 0  # calls refused for throughput
        self.faults = 0  # other failures

    def succeeded(self) -> None:
        """A call worked: the backoff starts again, and a fault that was logged is closed."""
        self._backoff.reset()
        if self._fault.failing:
            self._fault.succeeded()

    def pause(self, exc: BaseException, *, stop: bool = False) -> float | None:
        """Count ``exc``; the seconds to wait before the next try, or None to stop now.

        None when the caller asks to ``stop`` (it has what it came for), when the deadline
        has passed, or when waiting on one more throttle would spend more than the throttle
        patience. The fault is logged either way, with the wait when there is one.
        """
        throttled = is_throttling(exc)
        if throttled:
            self.throttled += 1
        else:
            self.faults += 1
        if stop or (self.deadline is not None and self.deadline.expired):
            self._fault.failed(exc)
            return None
        wait = throttle_wait_s() if throttled else self._backoff.next_wait_s()
        if throttled and self._throttle_patience_s is not None:
            if self._throttle_waited_s + wait > self._throttle_patience_s:
                self._fault.failed(exc)
                return None
            self._throttle_waited_s += wait
        if self.deadline is not None:
            wait = min(wait, self.deadline.remaining_s())
        self._fault.failed(exc, wait)
        return wait
