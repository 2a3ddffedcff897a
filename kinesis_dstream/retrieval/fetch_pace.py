"""How fast one reading of one shard may call GetRecords: a byte rate and a least period.

A shard serves 2 MiB/s and 5 GetRecords a second to every application reading it together;
a reader asked to leave room for the others (Databricks' ``maxFetchRate`` and
``minFetchPeriod``) spaces its calls: the next call waits until the bytes read so far fit
the rate since the reading began, and until the least period since the last call has passed.
Pure timing, no I/O: the read loop asks and sleeps.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FetchPace:
    """``max_bytes_per_s``: the most bytes a second a reading brings (0: no limit);
    ``min_period_s``: the least time between the starts of two of its GetRecords calls."""

    max_bytes_per_s: float = 0.0
    min_period_s: float = 0.0

    @property
    def paces(self) -> bool:
        return self.max_bytes_per_s > 0 or self.min_period_s > 0

    def wait_s(self, *, began: float, bytes_read: int, last_call: float, now: float) -> float:
        """Seconds to wait before the next call of a reading that began at ``began``, has
        read ``bytes_read`` bytes, and started its last call at ``last_call`` (one clock)."""
        due = last_call + self.min_period_s
        if self.max_bytes_per_s > 0:
            due = max(due, began + bytes_read / self.max_bytes_per_s)
        return max(0.0, due - now)
