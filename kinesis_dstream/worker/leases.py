"""Lease coordination: which leases to take (LeaseTaker), holding them (LeaseCoordinator).

Expiry is judged the KCL's way, on our own clock: a lease whose ``leaseCounter`` has not
moved for ``failover_time_ms`` since we first saw that value is expired, whatever the
owner's clock says. Taking aims at an even spread: each worker wants
``ceil(leases / workers)``; free and expired leases are taken first, and only when none are
left does a worker steal, ``max_leases_to_steal_at_one_time`` per pass, from the most
loaded worker. One steal per pass keeps joins and leaves from turning into stealing storms.
"""
from __future__ import annotations

import logging
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..aws.lease_table import Lease, LeaseTable
from ..config import ConsumerConfig
from ..errors import KinesisDStreamError, LeaseLostError
from ..records import ExtendedSequenceNumber
from .metrics import (
    CURRENT_LEASES,
    RENEW_ALL_LEASES,
    TAKE_LEASES,
    TAKEN_LEASES,
    TOTAL_LEASES,
    MetricsPublisher,
)

log = logging.getLogger(__name__)

# Lease renewals at once (the KCL's renewer uses a pool of 20 threads).
RENEW_THREADS = 20


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
        if not active:
            return []
        # Our own name on an expired lease counts too (as in the KCL): after a renew outage
        # longer than failover we dropped it, and alone we would never get it back.
        # Leases we still hold are filtered out by the coordinator.
        expired = [lease for lease in active if self.is_expired(lease, now)]
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
        candidates = [lease for lease in active if lease.lease_owner == busiest]
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


class LeaseCoordinator:
    """Holds this worker's leases: takes them, renews them, checkpoints and releases them.

    All writes to one lease go through that lease's lock so the counter we hold stays the
    counter in the table; a failed guard drops the lease and tells ``on_lease_lost`` at once.
    """

    def __init__(self, config: ConsumerConfig, table: LeaseTable,
                 on_lease_lost: Callable[[str], None] = lambda shard_id: None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.table = table
        self.worker_id = config.worker_id
        self.taker = LeaseTaker(config.worker_id, config.failover_time_ms,
                                config.max_leases_for_worker, config.max_leases_to_steal_at_one_time)
        self._on_lease_lost = on_lease_lost
        self._clock = clock
        self._lock = threading.RLock()
        self._owned: dict[str, Lease] = {}
        self._last_renewed: dict[str, float] = {}
        self._lease_locks: dict[str, threading.Lock] = {}
        self._all: dict[str, Lease] = {}
        # Leases let go for want of renewal, as we last held them; and those taken back
        # untouched (nobody wrote them in between: the counter is still ours).
        self._lapsed: dict[str, Lease] = {}
        self._resumed: set[str] = set()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._renew_pool: ThreadPoolExecutor | None = None
        self.wanted_more = False

    # -- views ----------------------------------------------------------------------------
    def owned_shard_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._owned)

    def owned_lease(self, shard_id: str) -> Lease | None:
        with self._lock:
            return self._owned.get(shard_id)

    def is_lapsed(self, shard_id: str) -> bool:
        """Let go for want of renewal, and nobody else is known to have written it since: a
        reader of the shard may take it back where it stood (see ``take_leases``)."""
        with self._lock:
            held = self._lapsed.get(shard_id)
            if held is None:
                return False
            # A scan may predate our last renewal; any other worker's write moves the
            # counter past the one we last wrote.
            seen = self._all.get(shard_id, held)
            return seen.lease_counter <= held.lease_counter

    def resumed(self, shard_id: str) -> bool:
        """Taken back untouched after a lapse (asked once: the answer is consumed)."""
        with self._lock:
            if shard_id in self._resumed:
                self._resumed.discard(shard_id)
                return True
            return False

    def known_leases(self, drop_lapsed: bool = False) -> dict[str, Lease]:
        """Every lease as of the last table scan, ours as we hold them; ``drop_lapsed``
        first lets go of those not renewed for failover time (``drop_lapsed``), as a reader
        about to plan reads does."""
        if drop_lapsed:
            self.drop_lapsed()
        with self._lock:
            return {**self._all, **self._owned}

    # -- taking ---------------------------------------------------------------------------
    def refresh(self) -> list[Lease]:
        leases = self.table.list_leases()
        with self._lock:
            self._all = {lease.lease_key: lease for lease in leases}
        return leases

    def take_leases(self, limit: int | None = None) -> list[str]:
        """One taker pass; returns the shard ids newly taken.

        ``limit`` caps how many are taken in this pass; ``wanted_more`` then says whether
        the cap held some back, so the caller can come back soon with a larger one.
        """
        leases = self.refresh()
        with self._lock:
            mine = set(self._owned)
        # Leases we hold are renewed by us; don't let the taker see them as someone else's.
        chosen = [lease for lease in self.taker.choose(leases, self._clock())
                  if lease.lease_key not in mine]
        self.wanted_more = limit is not None and len(chosen) > limit
        if limit is not None:
            chosen = chosen[:limit]
        taken = []
        for lease in chosen:
            try:
                new = self.table.take_lease(lease, self.worker_id)
            except LeaseLostError:
                log.info("lease %s was taken by someone else first", lease.lease_key)
                continue
            except KinesisDStreamError as exc:
                log.warning("could not take lease %s: %s", lease.lease_key, exc)
                continue
            stolen = lease.lease_owner and not self.taker.is_expired(lease, self._clock())
            verb = "stole" if stolen else "took"
            log.info("%s %s lease %s (counter %d, checkpoint %s)", self.worker_id, verb,
                     lease.lease_key, new.lease_counter, new.checkpoint)
            with self._lock:
                self._owned[new.lease_key] = new
                self._last_renewed[new.lease_key] = self._clock()
                held = self._lapsed.pop(new.lease_key, None)
                # The take's condition held on the counter we last wrote: nobody took it
                # (a take moves the counter), so nobody read it since.
                if held is not None and (lease.lease_owner, lease.lease_counter) == \
                        (held.lease_owner, held.lease_counter):
                    self._resumed.add(new.lease_key)
            taken.append(new.lease_key)
        return taken

    # -- renewing -------------------------------------------------------------------------
    def start_renewer(self) -> None:
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewer", daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        interval = self.config.renew_interval_ms / 1000.0
        while not self._stop.wait(interval):
            self.renew_leases()

    def drop_lapsed(self) -> list[str]:
        """Let go of every held lease not renewed for failover time; returns their shard ids.

        Another worker may have taken such a lease: the KCL's renewer hands out only leases
        renewed within failover time, and a shard consumer whose lease is not among them
        stops. A renewal that cannot reach DynamoDB may hang for seconds before it fails, so
        this is judged on the clock alone, before any call: by the renewer at each pass, and
        by whoever is about to read a shard.
        """
        now = self._clock()
        with self._lock:
            lapsed = [(shard_id, (now - last) * 1000)
                      for shard_id, last in self._last_renewed.items()
                      if shard_id in self._owned
                      and (now - last) * 1000 >= self.config.failover_time_ms]
        for shard_id, age_ms in lapsed:
            self._lose(shard_id, f"not renewed for {age_ms:.0f} ms (failover time "
                                 f"{self.config.failover_time_ms} ms); its reads stop",
                       lapsed=True)
        return [shard_id for shard_id, _ in lapsed]

    def renew_leases(self) -> None:
        """Renew every held lease, up to RENEW_THREADS at a time.

        One after another, the renewals of many leases add up to more than a renew period,
        and past failover time another worker takes leases we still read. The KCL renews
        on a pool of 20 threads for the same reason.

        A renewal that succeeds, however late, keeps its lease (its condition proves nobody
        took it meanwhile); only leases still unrenewed after the pass are let go, as the
        KCL's renewer hands out only leases renewed within failover time.
        """
        shard_ids = self.owned_shard_ids()
        if len(shard_ids) <= 1:
            for shard_id in shard_ids:
                self._renew(shard_id)
        else:
            with self._lock:
                if self._renew_pool is None:
                    self._renew_pool = ThreadPoolExecutor(max_workers=RENEW_THREADS,
                                                          thread_name_prefix="lease-renewer")
                pool = self._renew_pool
            for future in [pool.submit(self._renew, shard_id) for shard_id in shard_ids]:
                future.result()
        self.drop_lapsed()

    def _renew(self, shard_id: str) -> None:
        try:
            self._write(shard_id, self.table.renew_lease)
        except LeaseLostError:
            return  # _write has reported it
        except KinesisDStreamError as exc:
            # Past failover time without a renew, others may take it: stop
            # processing rather than risk two workers on one shard.
            with self._lock:
                last = self._last_renewed.get(shard_id)
            if last is None:
                return
            age_ms = (self._clock() - last) * 1000
            if age_ms < self.config.failover_time_ms:
                log.warning("renewing lease %s failed, will retry: %s", shard_id, exc)
                return
            self._lose(shard_id, f"no renew for {age_ms:.0f} ms ({exc})", lapsed=True)

    def _lease_lock(self, shard_id: str) -> threading.Lock:
        with self._lock:
            return self._lease_locks.setdefault(shard_id, threading.Lock())

    def _write(self, shard_id: str, write: Callable[[Lease], Lease]) -> Lease:
        """One guarded write to a held lease, serialised per lease, not across leases.

        The DynamoDB call runs outside the coordinator's lock, so a slow write to one
        lease never stalls the others, the scheduler loop or metrics.
        """
        with self._lease_lock(shard_id):
            lease = self.owned_lease(shard_id)
            if lease is None:
                raise LeaseLostError(f"lease {shard_id} is not held by {self.worker_id}")
            try:
                new = write(lease)
            except LeaseLostError as exc:
                lost = exc
            else:
                with self._lock:
                    if shard_id in self._owned:
                        self._owned[shard_id] = new
                        self._last_renewed[shard_id] = self._clock()
                return new
        # Reported outside the lease lock: the callback closes the shard's checkpointer,
        # whose lock a shard thread may hold while it waits for this lease lock.
        self._lose(shard_id, str(lost))
        raise lost

    def _lose(self, shard_id: str, reason: str, lapsed: bool = False) -> None:
        with self._lock:
            lease = self._owned.pop(shard_id, None)
            if lease is None:
                return
            self._last_renewed.pop(shard_id, None)
            if lapsed:
                self._lapsed[shard_id] = lease
        log.warning("lost lease %s: %s", shard_id, reason)
        self._on_lease_lost(shard_id)

    # -- checkpoint and release -------------------------------------------------------------
    def checkpoint(self, shard_id: str, position: ExtendedSequenceNumber) -> Lease:
        """Write a checkpoint under the lease guard; LeaseLostError if no longer ours."""
        return self._write(shard_id, lambda lease: self.table.update_checkpoint(lease, position))

    def record_children(self, shard_id: str, child_shard_ids: list[str]) -> None:
        if not child_shard_ids:
            return
        try:
            self._write(shard_id, lambda lease: self.table.set_child_shard_ids(lease, child_shard_ids))
        except KinesisDStreamError as exc:
            log.warning("could not record children of %s: %s", shard_id, exc)

    def release(self, shard_id: str) -> None:
        """Give a lease back so another worker takes it at once (the Java KCL does not)."""
        with self._lease_lock(shard_id):
            with self._lock:
                lease = self._owned.pop(shard_id, None)
                self._last_renewed.pop(shard_id, None)
            if lease is None:
                return
            try:
                self.table.evict_lease(lease)
                log.info("released lease %s", shard_id)
            except KinesisDStreamError as exc:
                log.warning("could not release lease %s (it will expire): %s", shard_id, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        if self._renew_pool is not None:
            self._renew_pool.shutdown(wait=False)


class ShardSync(Protocol):
    """Creates the leases of new shards (``shard_sync.ShardSyncer``); returns how many."""

    def sync(self) -> int: ...


class LeaseManager:
    """The lease side of a worker's loop: shard sync on its interval (or when asked), lease
    taking at the pace of ``TakingPace``, and, while a held child waits for its parents, a
    table refresh every ``parent_shard_poll_interval_ms``. The Scheduler and the Spark
    driver's coordinator both run it; what they do with the leases is theirs."""

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
            self._next_sync = now + self.config.shard_sync_interval_ms / 1000.0
            self.pace.soon()
        if self.pace.due(now):
            self.coordinator.take_leases(limit=self.pace.budget)
            self.pace.passed(self.coordinator.wanted_more, now)
        elif now >= self._next_parent_poll and waiting_on_parents():
            self.coordinator.refresh()
            self._next_parent_poll = now + self.config.parent_shard_poll_interval_ms / 1000.0
