"""LeaseTaker: which leases a worker takes, on a clock the test controls (tier 1, no I/O)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest

from kinesis_dstream.aws.lease_table import Lease
from kinesis_dstream.records import ExtendedSequenceNumber
from kinesis_dstream.worker.lease_taker import LeaseTaker

pytestmark = pytest.mark.unit

FAILOVER_MS = 10_000


def taker(worker: str = "B", **kwargs) -> LeaseTaker:
    return LeaseTaker(worker, FAILOVER_MS, **kwargs)


def leases_owned(*owners: str | None, counter: int = 1) -> list[Lease]:
    return [Lease(lease_key=f"shard-{i:03d}", lease_owner=owner, lease_counter=counter)
            for i, owner in enumerate(owners)]


def keys(leases: list[Lease]) -> set[str]:
    return {lease.lease_key for lease in leases}


def apply(leases: list[Lease], taken: list[Lease], worker: str) -> list[Lease]:
    """What the table looks like after ``worker`` took ``taken`` (counter bumped)."""
    chosen = keys(taken)
    return [replace(lease, lease_owner=worker, lease_counter=lease.lease_counter + 1)
            if lease.lease_key in chosen else lease for lease in leases]


def renew(leases: list[Lease], owner: str) -> list[Lease]:
    return [replace(lease, lease_counter=lease.lease_counter + 1)
            if lease.lease_owner == owner else lease for lease in leases]


def test_unowned_leases_are_taken_at_once():
    leases = leases_owned(None, None, None)
    assert keys(taker().choose(leases, now=0.0)) == keys(leases)


def test_alone_a_worker_takes_everything_free():
    leases = leases_owned(*([None] * 7))
    assert len(taker().choose(leases, now=0.0)) == 7


def test_max_leases_for_worker_caps_taking():
    leases = leases_owned(*([None] * 7))
    assert len(taker(max_leases_for_worker=3).choose(leases, now=0.0)) == 3


def test_finished_leases_are_ignored():
    leases = [Lease("shard-0", checkpoint=ExtendedSequenceNumber.SHARD_END),
              Lease("shard-1", lease_owner="A", lease_counter=4,
                    checkpoint=ExtendedSequenceNumber.SHARD_END)]
    assert taker().choose(leases, now=0.0) == []
    later = taker()
    later.choose(leases, now=0.0)
    assert later.choose(leases, now=1000.0) == []


def test_finished_leases_do_not_count_toward_the_target():
    # 2 live leases held by A + 6 finished ones: B's fair share is 1, not 4.
    live = leases_owned("A", "A")
    done = [Lease(f"old-{i}", lease_owner="A", lease_counter=9,
                  checkpoint=ExtendedSequenceNumber.SHARD_END) for i in range(6)]
    chosen = taker().choose(live + done, now=0.0)
    assert len(chosen) == 1 and chosen[0].lease_key.startswith("shard-")


def test_owned_lease_expires_only_after_its_counter_stood_still_for_failover_time():
    t = taker()
    leases = leases_owned("A", counter=5)
    # A owns the only lease, at target (ceil(1/2) = 1): B neither takes nor steals.
    assert t.choose(leases, now=100.0) == []
    assert not t.is_expired(leases[0], now=100.0 + FAILOVER_MS / 1000 - 0.001)
    assert t.choose(leases, now=100.0 + FAILOVER_MS / 1000 - 0.001) == []
    # Counter still 5 after failover time on B's clock: expired, taken.
    assert t.is_expired(leases[0], now=100.0 + FAILOVER_MS / 1000 + 0.001)
    assert keys(t.choose(leases, now=100.0 + FAILOVER_MS / 1000 + 0.001)) == {"shard-000"}


def test_a_moving_counter_resets_the_expiry_clock():
    t = taker()
    leases = leases_owned("A", counter=5)
    t.choose(leases, now=0.0)
    renewed = renew(leases, "A")
    assert t.choose(renewed, now=9.0) == []          # counter moved at t=9
    assert t.choose(renewed, now=18.0) == []         # only 9 s since then
    assert not t.is_expired(renewed[0], now=18.0)
    assert keys(t.choose(renewed, now=19.5)) == {"shard-000"}


def test_expiry_is_judged_on_our_clock_not_from_the_first_sight():
    # A lease first seen long after it was last renewed still gets a full failover period:
    # we cannot know the owner's clock.
    t = taker()
    leases = leases_owned("A", counter=5)
    assert t.choose(leases, now=1_000_000.0) == []
    assert t.choose(leases, now=1_000_000.0 + 9.9) == []
    assert len(t.choose(leases, now=1_000_000.0 + 10.1)) == 1


def test_dead_worker_leases_are_all_taken_by_the_survivor():
    t = taker("B")
    leases = leases_owned("A", "A", "B", "B")
    t.choose(leases, now=0.0)
    # B keeps renewing, A is dead.
    later = renew(leases, "B")
    chosen = t.choose(later, now=11.0)
    assert keys(chosen) == {"shard-000", "shard-001"}


def test_our_own_renewed_leases_are_not_chosen():
    t = taker("B")
    leases = leases_owned("B", None)
    t.choose(leases, now=0.0)
    assert keys(t.choose(renew(leases, "B"), now=5.0)) == {"shard-001"}


def test_our_own_expired_lease_is_taken_back():
    # We stopped renewing it (a renew outage past failover): alone, nobody else would take it.
    t = taker("B")
    leases = leases_owned("B", None)
    t.choose(leases, now=0.0)
    assert keys(t.choose(leases, now=10.5)) == {"shard-000", "shard-001"}


@pytest.mark.parametrize("n_leases, n_workers", [(4, 2), (5, 2), (7, 3), (10, 4), (3, 3)])
def test_even_spread_target_is_ceil_n_over_workers(n_leases, n_workers):
    """Workers join one by one and run passes until nothing changes; loads end even."""
    workers = [f"w{i}" for i in range(n_workers)]
    takers = {w: taker(w) for w in workers}
    leases = leases_owned(*([None] * n_leases))
    now = 0.0
    for _ in range(50):
        changed = False
        for w in workers:
            chosen = takers[w].choose(leases, now)
            if chosen:
                changed = True
                leases = apply(leases, chosen, w)
            # Everyone renews each round, so nobody expires.
            leases = renew(leases, w)
        now += 1.0
        if not changed:
            break
    else:
        pytest.fail("lease taking never settled")
    load = Counter(lease.lease_owner for lease in leases)
    target = math.ceil(n_leases / n_workers)
    assert sum(load.values()) == n_leases
    assert max(load.values()) <= target
    # Nobody is left two or more below target (that worker would still be stealing).
    assert min(load.get(w, 0) for w in workers) >= target - 1


def test_steal_only_when_nothing_is_free_and_at_most_max_per_pass():
    t = taker("B")
    leases = leases_owned("A", "A", "A", "A")
    chosen = t.choose(leases, now=0.0)
    assert len(chosen) == 1 and chosen[0].lease_owner == "A"
    t2 = taker("B", max_leases_to_steal_at_one_time=5)
    # Target 2, A is 2 above it: at most 2 even though 5 would be allowed.
    assert len(t2.choose(leases, now=0.0)) == 2


def test_free_leases_are_preferred_to_steals():
    t = taker("B")
    leases = leases_owned("A", "A", "A", None)
    chosen = t.choose(leases, now=0.0)
    assert keys(chosen) == {"shard-003"}


def test_four_leases_two_workers_converge_one_steal_per_pass():
    a, b = taker("A"), taker("B")
    leases = leases_owned(None, None, None, None)
    leases = apply(leases, a.choose(leases, 0.0), "A")
    assert Counter(lease.lease_owner for lease in leases) == {"A": 4}
    first = b.choose(leases, 0.5)
    assert len(first) == 1
    leases = apply(leases, first, "B")
    second = b.choose(leases, 1.0)
    assert len(second) == 1
    leases = apply(leases, second, "B")
    assert Counter(lease.lease_owner for lease in leases) == {"A": 2, "B": 2}
    # Balanced: no one takes anything, from either side (no ping-pong).
    assert b.choose(leases, 1.5) == []
    assert a.choose(leases, 1.5) == []


def test_no_ping_pong_when_balanced():
    leases = leases_owned("A", "A", "B", "B")
    assert taker("A").choose(leases, 0.0) == []
    assert taker("B").choose(leases, 0.0) == []


def test_five_leases_two_workers_settle_at_three_and_two():
    leases = leases_owned("A", "A", "A", "A", "A")
    b = taker("B")
    leases = apply(leases, b.choose(leases, 0.0), "B")
    leases = apply(leases, b.choose(leases, 0.1), "B")
    assert Counter(lease.lease_owner for lease in leases) == {"A": 3, "B": 2}
    # B at 2 is one below target 3, and A is at target: stealing would only swap roles.
    assert b.choose(leases, 0.2) == []
    assert taker("A").choose(leases, 0.2) == []
    # The worker with 3 would not take from the one with 2 either.
    leases_swapped = leases_owned("B", "B", "B", "A", "A")
    assert taker("A").choose(leases_swapped, 0.0) == []


def test_steal_only_from_a_worker_above_target():
    # 6 leases, 3 workers: target 2. A has 3 (above), C has 2 (at target), B has 1.
    leases = leases_owned("A", "A", "A", "B", "C", "C")
    chosen = taker("B").choose(leases, 0.0)
    assert len(chosen) == 1 and chosen[0].lease_owner == "A"
    # Now A 2, B 2, C 2: nobody steals.
    leases = leases_owned("A", "A", "B", "B", "C", "C")
    for w in "ABC":
        assert taker(w).choose(leases, 0.0) == []


def test_one_short_of_target_does_not_steal_from_a_worker_at_target():
    # 3 workers, 7 leases: target 3. A 3, C 3, B 1: B is 2 short -> may take one (KCL rule);
    # with A 3, C 2, B 2 every worker is within one of target: nothing moves.
    leases = leases_owned("A", "A", "A", "C", "C", "B", "B")
    for w in "ABC":
        assert taker(w).choose(leases, 0.0) == []


def test_two_short_may_steal_one_from_a_worker_at_target():
    # The KCL's exception: 4 leases, 3 workers, target 2; A 2, B 2, C 0.
    # C is 2 short and nobody is above target: one steal, then it is stable.
    leases = leases_owned("A", "A", "B", "B")
    c = taker("C")
    chosen = c.choose(leases, 0.0)
    assert len(chosen) == 1
    leases = apply(leases, chosen, "C")
    for w in "ABC":
        assert taker(w).choose(leases, 0.1) == []


def test_leases_that_vanish_are_forgotten():
    t = taker()
    leases = leases_owned("A", "A")
    t.choose(leases, 0.0)
    t.choose(leases[:1], 1.0)
    assert set(t._seen) == {"shard-000"}


def test_a_dead_workers_leases_are_taken_at_once_not_after_failover():
    """A recovered driver knows its predecessor is dead: no failover wait for its leases,
    while a live worker's leases are still only taken once they expire."""
    leases = leases_owned("dead", "dead", "alive", "alive")
    first = taker(dead_owners={"dead"}).choose(leases, now=0.0)
    assert keys(first) == {"shard-000", "shard-001"}
    assert len(taker().choose(leases, now=0.0)) == 1  # without the proof: one steal a pass


def test_leases_are_renewed_concurrently_not_one_after_another():
    """Serial renewals of 128 leases took longer than failover (another worker would take
    them): ten renewals must be under way at once."""
    import threading

    from kinesis_dstream.config import ConsumerConfig
    from kinesis_dstream.worker.leases import LeaseCoordinator

    together = threading.Barrier(10, timeout=10)

    class Table:
        renewed: list[str] = []

        def renew_lease(self, lease: Lease) -> Lease:
            together.wait()  # breaks (and fails the renewal) unless 10 renew at once
            self.renewed.append(lease.lease_key)
            return replace(lease, lease_counter=lease.lease_counter + 1)

    config = ConsumerConfig(application_name="a", stream_name="s", region_name="r",
                            worker_id="me")
    table = Table()
    coordinator = LeaseCoordinator(config, table)
    for lease in leases_owned(*(["me"] * 40)):
        coordinator._owned[lease.lease_key] = lease
    coordinator.renew_leases()
    coordinator.stop()
    assert sorted(table.renewed) == sorted(f"shard-{i:03d}" for i in range(40))
    assert all(lease.lease_counter == 2 for lease in coordinator._owned.values())


def test_a_held_off_lease_is_left_to_others_until_its_time_is_up():
    """A lease given up on a permanent error (AccessDenied) is not taken straight back."""
    t = taker("A")
    leases = leases_owned(None, None)
    t.hold_off("shard-000", until=100.0)
    assert keys(t.choose(leases, now=50.0)) == {"shard-001"}
    assert keys(t.choose(leases, now=100.0)) == {"shard-000", "shard-001"}
    t.hold_off("shard-009", until=100.0)  # a lease gone from the table is forgotten
    t.choose(leases, now=0.0)
    assert t._held_off == {}
