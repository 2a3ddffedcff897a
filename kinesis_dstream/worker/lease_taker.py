"""Lease taking: which leases a worker takes (LeaseTaker), and how fast (TakingPace).

Expiry is judged the KCL's way, on our own clock: a lease whose ``leaseCounter`` has not
moved for ``failover_time_ms`` since we first saw that value is expired, whatever the
owner's clock says. Taking aims at an even spread: each worker wants
``ceil(leases / workers)``; free and expired leases are taken first, and only when none are
left does a worker steal, ``max_leases_to_steal_at_one_time`` per pass, from the most
loaded worker. One steal per pass keeps joins and leaves from turning into stealing storms.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ..aws.lease_table import Lease


@dataclass
class _Seen:
    counter: int
    since: float  # our monotonic clock when this counter value was first seen


@dataclass
class LeaseTaker:
    """Pure decision logic: no I/O, the clock is passed in, so it is tested on its own."""

    worker_id: str
    failover_time_ms: int
    max_leases_for_worker: int = 2**31 - 1
    max_leases_to_steal_at_one_time: int = 1
    # Workers known to be dead (a recovered driver's predecessor): their leases are expired
    # at once instead of after failover_time_ms.
    dead_owners: set[str] = field(default_factory=set)
    _seen: dict[str, _Seen] = field(default_factory=dict)
    # Leases this worker gave up on a permanent error, and until when it leaves them to
    # others (``hold_off``); one entry per such lease, dropped when its time is up.
    _held_off: dict[str, float] = field(default_factory=dict)

    def hold_off(self, lease_key: str, until: float) -> None:
        """Take ``lease_key`` in no pass before ``until``: a worker that cannot read a shard
        (AccessDenied) leaves it to one that may, instead of taking it straight back."""
        self._held_off[lease_key] = until

    def _is_held_off(self, lease_key: str, now: float) -> bool:
        until = self._held_off.get(lease_key)
        if until is not None and now >= until:
            del self._held_off[lease_key]
            return False
        return until is not None

    def observe(self, leases: list[Lease], now: float) -> None:
        """Track counter changes; a lease seen for the first time counts as fresh."""
        current = {lease.lease_key for lease in leases}
        for key in list(self._seen):
            if key not in current:
                del self._seen[key]
        for lease in leases:
            seen = self._seen.get(lease.lease_key)
            if seen is None or seen.counter != lease.lease_counter:
                self._seen[lease.lease_key] = _Seen(lease.lease_counter, now)

    def is_expired(self, lease: Lease, now: float) -> bool:
        if lease.lease_owner is None or lease.lease_owner in self.dead_owners:
            return True
        seen = self._seen.get(lease.lease_key)
        return seen is not None and (now - seen.since) * 1000 > self.failover_time_ms

    def choose(self, leases: list[Lease], now: float) -> list[Lease]:
        """The leases to take in this pass (free/expired first, else at most N steals)."""
        self.observe(leases, now)
        active = [lease for lease in leases if not lease.is_finished]
        for key in [k for k in self._held_off if k not in {lease.lease_key for lease in leases}]:
            del self._held_off[key]
        if not active:
            return []
        # Our own name on an expired lease counts too (as in the KCL): after a renew outage
        # longer than failover we dropped it, and alone we would never get it back.
        # Leases we still hold are filtered out by the coordinator.
        expired = [lease for lease in active if self.is_expired(lease, now)
                   and not self._is_held_off(lease.lease_key, now)]
        counts: dict[str, int] = {}
        for lease in active:
            if lease.lease_owner is not None and not self.is_expired(lease, now):
                counts[lease.lease_owner] = counts.get(lease.lease_owner, 0) + 1
        counts.setdefault(self.worker_id, 0)
        target = min(math.ceil(len(active) / len(counts)), self.max_leases_for_worker)
        needed = target - counts[self.worker_id]
        if needed <= 0:
            return []
        if expired:
            random.shuffle(expired)
            return expired[:needed]
        busiest, busiest_count = max(
            ((owner, n) for owner, n in counts.items() if owner != self.worker_id),
            key=lambda item: item[1], default=(None, 0))
        if busiest is None:
            return []
        # Steal only from a worker above target, or at target when we are 2+ short:
        # otherwise two workers would trade a lease back and forth.
        if busiest_count > target:
            steal = min(needed, busiest_count - target, self.max_leases_to_steal_at_one_time)
        elif busiest_count == target and needed > 1:
            steal = 1
        else:
            return []
        candidates = [lease for lease in active if lease.lease_owner == busiest
                      and not self._is_held_off(lease.lease_key, now)]
        random.shuffle(candidates)
        return candidates[:steal]


class TakingPace:
    """When the next taker pass runs and how many leases it may take.

    Free leases are taken 1, 2, 4, ... per pass, ``ramp_interval_s`` apart, not all at once:
    workers started together then see each other and split the shards without stealing (a
    stolen shard's records after its last checkpoint would be read twice). The first lease
    is taken in the first pass, so the first record is not delayed.
    """

    def __init__(self, interval_s: float, ramp_interval_s: float = 0.5):
        self.interval_s = interval_s
        self.ramp_interval_s = ramp_interval_s
        self.budget = 1
        self._next_at = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next_at

    def passed(self, wanted_more: bool, now: float) -> None:
        if wanted_more:
            self.budget *= 2
            self._next_at = now + self.ramp_interval_s
        else:
            self._next_at = now + self.interval_s

    def soon(self) -> None:
        """Look again at the next tick (after a shard sync created leases)."""
        self._next_at = 0.0
