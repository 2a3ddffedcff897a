"""How fast one reading of one shard may call GetRecords: a byte rate and a least period.

A shard serves 2 MiB/s and 5 GetRecords a second to every application reading it together;
a reader asked to leave room for the others (Databricks' ``maxFetchRate`` and
``minFetchPeriod``) spaces its calls: the next call waits until the bytes read so far fit
the rate since the reading began, and until the least period since the last call has passed.
Pure timing, no I/O: the read loop asks and sleeps.

``ShardBudget`` is the other side: what the shard itself allows. A page larger than a
second's worth of the shard's 2 MiB/s is lent ahead, and Kinesis refuses the shard's reads
until it is paid back (a 10 MiB page: about 4 s). A reading that knows when that is (the
previous reading's ``ready_at``, handed on by the driver) calls then, instead of calling,
being refused and pausing a second, or giving its batch up.
"""
from __future__ import annotations

from dataclasses import dataclass

# What Kinesis serves each shard, to all its readers together (the API reference's limit).
SHARD_READ_BYTES_PER_S = 2 * 1024 * 1024


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

    def next_call_at(self, last_served: float, last_bytes: int) -> float:
        """The earliest next call after a page of ``last_bytes`` served at ``last_served``
        (a page read ahead, outside any reading: its period and its own bytes' time)."""
        due = last_served + self.min_period_s
        if self.max_bytes_per_s > 0:
            due = max(due, last_served + last_bytes / self.max_bytes_per_s)
        return due


class ShardBudget:
    """A shard's read budget as one reading spends it: a bucket of one second's bytes that
    refills at ``SHARD_READ_BYTES_PER_S``. It is empty at ``empty_at`` when the previous
    reading left the shard in debt until then (its ``ready_at``: a reading that calls at that
    moment finds nothing saved), else full when the reading begins. Other readers of the shard
    are not seen; if they spent it, Kinesis refuses and the read loop pauses as before. Times
    are epoch seconds, so that another process (the next batch's task) can wait for
    ``ready_at``."""

    def __init__(self, bytes_per_s: float = SHARD_READ_BYTES_PER_S,
                 empty_at: float = 0.0) -> None:
        self.bytes_per_s = bytes_per_s
        self._budget = 0.0 if empty_at else bytes_per_s
        self._when: float | None = empty_at or None

    def served(self, at: float, data_bytes: int) -> None:
        """A GetRecords call answered at ``at`` with ``data_bytes`` of record data."""
        if self._when is not None:
            self._budget = min(self.bytes_per_s,
                               self._budget + max(0.0, at - self._when) * self.bytes_per_s)
        self._budget -= data_bytes
        self._when = at

    @property
    def ready_at(self) -> float:
        """When the shard is expected to serve the next call (0.0: at once)."""
        if self._when is None or self._budget > 0:
            return 0.0
        return self._when - self._budget / self.bytes_per_s
