"""Shards that lag while their position stands still: warned about once, and counted.

MillisBehindLatest alone cannot tell a consumer catching up from one that stopped: both lag.
One that lags by more than ``stalled_shard_lag_ms`` while its position has not moved for
``stalled_shard_time_ms`` has stopped (a processor that hangs, a batch that never completes,
a reader looping without records). It is logged once as a warning naming the shard, and
warned about again only after its position moved and it stalled again. No I/O, and the clock
is a parameter: the worker's and the driver's loops feed it what they already hold.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping

from ..config import ConsumerConfig

log = logging.getLogger(__name__)


@dataclass
class _Shard:
    position: Hashable
    since: float  # clock time the position was first seen
    lag_ms: int | None = None
    warned: bool = False


@dataclass
class StallWatch:
    """The stall rule over the shards one worker or driver reads."""

    lag_threshold_ms: int
    stall_time_ms: int
    name: str = ""
    clock: Callable[[], float] = time.monotonic
    stalls: int = 0  # warnings given, over the watch's life
    _shards: dict[str, _Shard] = field(default_factory=dict)

    @classmethod
    def of(cls, config: ConsumerConfig, name: str = "",
           clock: Callable[[], float] = time.monotonic) -> "StallWatch":
        return cls(config.stalled_shard_lag_ms, config.stalled_shard_time_ms, name, clock)

    def observe(self, shard_id: str, lag_ms: int | None, position: Hashable) -> bool:
        """The shard's latest lag and position; True when this call found it stalled (and
        warned)."""
        now = self.clock()
        shard = self._shards.get(shard_id)
        if shard is None or shard.position != position:
            self._shards[shard_id] = _Shard(position, now, lag_ms)
            return False
        shard.lag_ms = lag_ms
        if shard.warned or not self._lagging(shard) or \
                (now - shard.since) * 1000 < self.stall_time_ms:
            return False
        shard.warned = True
        self.stalls += 1
        log.warning("%sshard %s is stalled: %d ms behind the tip (MillisBehindLatest) and its "
                    "position (%s) has not moved for %.0f s", f"{self.name}: " if self.name
                    else "", shard_id, lag_ms, position, now - shard.since)
        return True

    def _lagging(self, shard: _Shard) -> bool:
        return shard.lag_ms is not None and shard.lag_ms > self.lag_threshold_ms

    def retain(self, shard_ids: Iterable[str]) -> None:
        """Forget shards no longer read here (ended, or their lease went elsewhere)."""
        keep = set(shard_ids)
        for shard_id in [s for s in self._shards if s not in keep]:
            del self._shards[shard_id]

    @property
    def stalled(self) -> list[str]:
        """The shards warned about that still lag and have not moved since."""
        return sorted(s for s, shard in self._shards.items()
                      if shard.warned and self._lagging(shard))


def largest_lag(lags: Iterable[int | None]) -> int | None:
    """The application's MillisBehindLatest: the largest over its shards (None: none known)."""
    known = [lag for lag in lags if lag is not None]
    return max(known) if known else None


class ShardsView(dict[str, Any]):
    """``metrics()``: shard id -> that shard's figures, as ever; and the application's own
    figures as attributes: ``millis_behind_latest`` (the largest over the shards, what one
    alarm watches across reshards), ``stalled_shards`` (stalled now) and ``stalls``
    (stalled-shard warnings so far)."""

    def __init__(self, shards: Mapping[str, Any], millis_behind_latest: int | None = None,
                 stalled_shards: Iterable[str] = (), stalls: int = 0) -> None:
        super().__init__(shards)
        self.millis_behind_latest = millis_behind_latest
        self.stalled_shards = sorted(stalled_shards)
        self.stalls = stalls
