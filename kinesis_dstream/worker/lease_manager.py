"""The lease side of a worker's loop: shard sync, lease taking at its pace, parent polls.

The Scheduler and the Spark driver's coordinator both run it (``lease_loop``); what they do
with the leases they hold is theirs.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

from ..config import ConsumerConfig
from .lease_cleanup import LeaseCleaner
from .lease_taker import TakingPace
from .leases import LeaseCoordinator
from .metrics import (
    CURRENT_LEASES,
    RENEW_ALL_LEASES,
    TAKE_LEASES,
    TAKEN_LEASES,
    TOTAL_LEASES,
    MetricsPublisher,
)


class ShardSync(Protocol):
    """Creates the leases of new shards (``shard_sync.ShardSyncer``); returns how many."""

    def sync(self) -> int: ...


class LeaseManager:
    """The lease side of a worker's loop: shard sync on its interval (or when asked), lease
    taking at the pace of ``TakingPace``, and, while a held child waits for its parents, a
    table refresh every ``parent_shard_poll_interval_ms``. With
    ``cleanup_leases_upon_shard_completion`` each shard sync is followed by a pass of the
    ``LeaseCleaner`` over the leases as last scanned. The Scheduler and the Spark driver's
    coordinator both run it; what they do with the leases is theirs."""

    def __init__(self, config: ConsumerConfig, coordinator: "LeaseCoordinator", syncer: ShardSync,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.coordinator = coordinator
        self.syncer = syncer
        self.pace = TakingPace(config.taker_interval_ms / 1000.0)
        self._sync_now = threading.Event()
        self._next_sync = clock() + config.shard_sync_interval_ms / 1000.0
        self._next_parent_poll = 0.0
        self.metrics: MetricsPublisher | None = None  # set by whoever owns one
        self._next_lease_report = 0.0
        self._taken_since_report = 0
        self._clock = clock
        self.cleaner = (LeaseCleaner(coordinator.table)
                        if config.cleanup_leases_upon_shard_completion else None)

    def sync_soon(self) -> None:
        self._sync_now.set()

    def run_due(self, now: float, waiting_on_parents: Callable[[], bool]) -> None:
        owned_before = set(self.coordinator.owned_shard_ids())
        self._run_due(now, waiting_on_parents)
        self._record_lease_metrics(owned_before)

    def _record_lease_metrics(self, owned_before: set[str]) -> None:
        """Lease counts once per renew interval, as often as the KCL's renewer reports them."""
        if self.metrics is None:
            return
        owned = self.coordinator.owned_shard_ids()
        self._taken_since_report += len(set(owned) - owned_before)
        now = self._clock()
        if now < self._next_lease_report:
            return
        self._next_lease_report = now + self.config.renew_interval_ms / 1000.0
        taken, self._taken_since_report = self._taken_since_report, 0
        self.metrics.record(TAKEN_LEASES, taken, operation=TAKE_LEASES)
        self.metrics.record(TOTAL_LEASES, len(self.coordinator.known_leases()),
                            operation=TAKE_LEASES)
        self.metrics.record(CURRENT_LEASES, len(owned), operation=RENEW_ALL_LEASES)

    def _run_due(self, now: float, waiting_on_parents: Callable[[], bool]) -> None:
        if self._sync_now.is_set() or now >= self._next_sync:
            self._sync_now.clear()
            self.syncer.sync()
            if self.cleaner is not None:
                self.cleaner.clean(self.coordinator.known_leases().values())
            self._next_sync = now + self.config.shard_sync_interval_ms / 1000.0
            self.pace.soon()
        if self.pace.due(now):
            self.coordinator.take_leases(limit=self.pace.budget)
            self.pace.passed(self.coordinator.wanted_more, now)
        elif now >= self._next_parent_poll and waiting_on_parents():
            self.coordinator.refresh()
            self._next_parent_poll = now + self.config.parent_shard_poll_interval_ms / 1000.0
