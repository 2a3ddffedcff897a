"""Lease coordination: holding this worker's leases (taking what ``lease_taker`` chose,
renewing, checkpointing, releasing).

A lease is held while its renewals keep within failover time on our own clock; every write
to it is conditional on the counter we last wrote, so a lease another worker took is found
lost at our next write, and one we could not renew in time is let go before any call.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

from ..aws.lease_table import Lease, LeaseTable
from ..config import ConsumerConfig
from ..errors import KinesisDStreamError, LeaseLostError
from ..records import ExtendedSequenceNumber
from .lease_taker import LeaseTaker

log = logging.getLogger(__name__)

# Lease renewals at once (the KCL's renewer uses a pool of 20 threads).
RENEW_THREADS = 20


def parents_done(lease: Lease, leases: dict[str, Lease]) -> bool:
    """A child may start once every parent that has a lease has checkpointed SHARD_END."""
    keys = [lease.key_of(parent) for parent in lease.parent_shard_ids]
    return all(key not in leases or leases[key].is_finished for key in keys)


class LeaseCoordinator:
    """Holds this worker's leases: takes them, renews them, checkpoints and releases them.

    All writes to one lease go through that lease's lock so the counter we hold stays the
    counter in the table; a failed guard drops the lease and tells ``on_lease_lost`` at once.
    A lease let go for want of renewal goes to ``on_lease_lapsed`` with the lease as we last
    held it (to ``on_lease_lost`` when that is not given), and each take to
    ``on_lease_taken`` with the lease as the take found it: a holder that can resume a
    lapsed lease's work judges from these alone.
    """

    def __init__(self, config: ConsumerConfig, table: LeaseTable,
                 on_lease_lost: Callable[[str], None] = lambda shard_id: None,
                 clock: Callable[[], float] = time.monotonic, *,
                 on_lease_lapsed: Callable[[str, Lease], None] | None = None,
                 on_lease_taken: Callable[[Lease, Lease], None] | None = None,
                 accepts: Callable[[Lease], bool] | None = None):
        self.config = config
        self.table = table
        self.worker_id = config.worker_id
        self.taker = LeaseTaker(config.worker_id, config.failover_time_ms,
                                config.max_leases_for_worker, config.max_leases_to_steal_at_one_time)
        self._on_lease_lost = on_lease_lost
        self._on_lease_lapsed = on_lease_lapsed
        self._on_lease_taken = on_lease_taken
        self._clock = clock
        # Which of the table's leases are this worker's kind (single- or multi-stream keys).
        self._accepts = accepts
        self._lock = threading.RLock()
        self._owned: dict[str, Lease] = {}
        self._last_renewed: dict[str, float] = {}
        self._lease_locks: dict[str, threading.Lock] = {}
        self._all: dict[str, Lease] = {}
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

    def known_leases(self, drop_lapsed: bool = False) -> dict[str, Lease]:
        """Every lease as of the last table scan, ours as we hold them; ``drop_lapsed``
        first lets go of those not renewed for failover time (``drop_lapsed``), as a reader
        about to plan reads does."""
        if drop_lapsed:
            self.drop_lapsed()
        with self._lock:
            return {**self._all, **self._owned}

    def waiting_on_parents(self, shard_ids: Iterable[str], drop_lapsed: bool = False,
                           ) -> set[str]:
        """Of ``shard_ids``, those whose lease (as ``known_leases`` has it) has a parent not
        done yet (``parents_done``): a child is read only after its parents."""
        leases = self.known_leases(drop_lapsed)
        return {s for s in shard_ids if s in leases and not parents_done(leases[s], leases)}

    # -- taking ---------------------------------------------------------------------------
    def refresh(self) -> list[Lease]:
        leases = self.table.list_leases()
        if self._accepts is not None:
            leases = [lease for lease in leases if self._accepts(lease)]
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
            if self._on_lease_taken is not None:
                self._on_lease_taken(lease, new)
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
        log.warning("lost lease %s: %s", shard_id, reason)
        if lapsed and self._on_lease_lapsed is not None:
            self._on_lease_lapsed(shard_id, lease)
        else:
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

    def hold_off(self, shard_id: str, seconds: float) -> None:
        """Take ``shard_id`` in no pass for ``seconds`` (``LeaseTaker.hold_off``); called
        from the thread that runs the taker passes (the scheduler's)."""
        self.taker.hold_off(shard_id, self._clock() + seconds)

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
