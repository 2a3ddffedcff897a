"""Waiting on a condition, the one way the tests do it: poll it, and fail naming what never
came (never a fixed sleep)."""
from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(predicate: Callable[[], Any], timeout: float, what: str = "condition",
             on_timeout: Callable[[], str] | None = None, *, interval: float = 0.1) -> float:
    """Poll ``predicate`` every ``interval`` s until it holds; the seconds that took. After
    ``timeout`` s an AssertionError names ``what``, with ``on_timeout()`` (logs) below it."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            detail = f"\n{on_timeout()}" if on_timeout is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(interval)
    return time.monotonic() - start
