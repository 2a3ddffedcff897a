"""Shard sync: one lease per shard, parents before children (HierarchicalShardSyncer).

Leases are created for shards that have none. A child shard's lease names its parents
(``parentShardId``) and starts at TRIM_HORIZON, so nothing written after a split or merge
is skipped; ``leases.parents_done`` is what keeps a child from being read before its parents
have checkpointed SHARD_END, which keeps per-key order across resharding.
With LATEST on a fresh table, closed shards get no lease: their data is history.
In multi-stream mode each stream is synced on its own (``stream``): its leases are keyed
the KCL's multi-stream way, parents still name shard ids, and "fresh" means the stream has
no lease yet.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Iterable, Protocol

from ..aws.kinesis import Shard
from ..aws.lease_table import Lease, LeaseTable
from ..aws.stream_identifier import StreamIdentifier
from ..config import ConsumerConfig
from ..records import AT_TIMESTAMP, LATEST, TRIM_HORIZON, ExtendedSequenceNumber
from .leases import RENEW_THREADS

log = logging.getLogger(__name__)

# Leases written at once by a shard sync: as many as the lease renewer writes at once.
CREATE_THREADS = RENEW_THREADS


def initial_checkpoint(config: ConsumerConfig) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber({"LATEST": LATEST, "TRIM_HORIZON": TRIM_HORIZON,
                                   "AT_TIMESTAMP": AT_TIMESTAMP}[config.initial_position])


def new_leases(shards: Iterable[Shard], existing: dict[str, Lease],
               config: ConsumerConfig, stream: StreamIdentifier | None = None) -> list[Lease]:
    """The leases to create for shards that have none (pure: tested without AWS).

    ``existing`` is keyed by shard id (the stream's leases only, in multi-stream mode)."""
    shards = list(shards)
    known = {shard.shard_id for shard in shards} | set(existing)
    fresh_table = not existing
    leased_lineage = _with_leased_descendants(shards, existing)
    leases = []
    for shard in shards:
        if shard.shard_id in existing:
            continue
        # A closed shard whose descendants have leases was read (its lease was deleted at
        # completion, lease_cleanup) or skipped as history: leasing it again would replay it.
        if shard.is_closed and shard.shard_id in leased_lineage:
            continue
        # Every closed shard, not only closed roots: a leased closed middle generation
        # would make the open shards its children, read from TRIM_HORIZON (a full replay).
        if shard.is_closed and config.initial_position == LATEST and fresh_table:
            continue
        parents = frozenset(p for p in shard.parent_shard_ids if p in known)
        if parents:
            checkpoint = ExtendedSequenceNumber(TRIM_HORIZON)
        else:
            checkpoint = initial_checkpoint(config)
        leases.append(Lease(lease_key=shard.shard_id if stream is None
                            else stream.lease_key(shard.shard_id),
                            checkpoint=checkpoint, parent_shard_ids=parents,
                            starting_hash_key=shard.starting_hash_key,
                            ending_hash_key=shard.ending_hash_key,
                            stream_identifier=None if stream is None else stream.serialize()))
    # With LATEST on a fresh table the closed parents got no lease: their children are
    # roots now and start where the application asked, not at TRIM_HORIZON.
    created = {lease.shard_id for lease in leases} | set(existing)
    fixed = []
    for lease in leases:
        parents = frozenset(p for p in lease.parent_shard_ids if p in created)
        if parents != lease.parent_shard_ids:
            lease = replace(lease, checkpoint=initial_checkpoint(config), parent_shard_ids=parents)
        fixed.append(lease)
    return fixed


def _with_leased_descendants(shards: list[Shard], existing: dict[str, Lease]) -> set[str]:
    """The shard ids with a descendant (child, grandchild, ...) among ``existing``."""
    parents_of = {shard.shard_id: shard.parent_shard_ids for shard in shards}
    found: set[str] = set()
    pending = [p for shard_id in existing for p in parents_of.get(shard_id, ())]
    pending += [p for lease in existing.values() for p in lease.parent_shard_ids]
    while pending:
        shard_id = pending.pop()
        if shard_id not in found:
            found.add(shard_id)
            pending.extend(parents_of.get(shard_id, ()))
    return found


def in_generations(leases: list[Lease]) -> list[list[Lease]]:
    """``leases`` in groups that may be created together: each lease after its parents'.

    A child whose parent has no lease yet counts as a root (``leases.parents_done``), so a worker
    scanning the table while leases are being created could read it before its parent."""
    pending = {lease.lease_key: lease for lease in leases}
    generations = []
    while pending:
        ready = [lease for lease in pending.values()
                 if not any(lease.key_of(p) in pending for p in lease.parent_shard_ids)]
        generations.append(ready or list(pending.values()))  # no cycle in Kinesis' lineage
        for lease in generations[-1]:
            del pending[lease.lease_key]
    return generations


class ShardLister(Protocol):
    """Where the shards come from: a ``KinesisClient``, or a test's fixed list."""

    def list_shards(self) -> list[Shard]: ...


class ShardSyncer:
    def __init__(self, config: ConsumerConfig, kinesis: ShardLister, table: LeaseTable,
                 stream: StreamIdentifier | None = None):
        self.config = config
        self.kinesis = kinesis
        self.table = table
        self.stream = stream

    def sync(self, leases: list[Lease] | None = None) -> int:
        """List shards and create missing leases; returns how many were created.

        ``leases``: the table as just scanned (a multi-stream sync scans once for all its
        streams); None scans it here.
        The leases of one generation are written concurrently: a new application on a
        wide stream would otherwise wait for a PutItem per shard, one after the other,
        before its first lease is taken (the KCL writes them one by one)."""
        shards = self.kinesis.list_shards()
        if leases is None:
            leases = self.table.list_leases()
        mine = None if self.stream is None else self.stream.serialize()
        existing = {lease.shard_id: lease for lease in leases
                    if lease.stream_identifier == mine}
        created = 0
        for generation in in_generations(new_leases(shards, existing, self.config, self.stream)):
            if len(generation) == 1:
                made = [self.table.create_lease_if_not_exists(generation[0])]
            else:
                with ThreadPoolExecutor(min(CREATE_THREADS, len(generation)),
                                        thread_name_prefix="kinesis-dstream-sync") as pool:
                    made = list(pool.map(self.table.create_lease_if_not_exists, generation))
            for lease, new in zip(generation, made, strict=True):
                if new:
                    created += 1
                    log.info("created lease %s at %s (parents %s)", lease.lease_key,
                             lease.checkpoint, sorted(lease.parent_shard_ids) or "none")
        return created
