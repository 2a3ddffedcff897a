"""Deleting finished shards' leases (the KCL's cleanupLeasesUponShardCompletion).

Without it a stream that is resharded now and then keeps a lease per shard it ever had,
and every lease scan reads them all. The rules are the KCL's LeaseCleanupManager's: a lease
checkpointed SHARD_END goes once every child has a lease whose checkpoint has moved past
its start (TRIM_HORIZON, AT_TIMESTAMP, LATEST: the child has started and checkpointed), and
once its own parents' leases are gone, so a lineage is removed oldest first. A lease held
by a worker is left alone (its holder releases it at shard end), and the delete is
conditional on the lease not having changed since it was read. Shard sync never recreates
a deleted lease (``shard_sync.new_leases``: a closed shard with a leased descendant).
"""
from __future__ import annotations

import logging
from typing import Iterable, Mapping

from ..aws.lease_table import Lease, LeaseTable
from ..errors import KinesisDStreamError
from ..records import AT_TIMESTAMP, LATEST, TRIM_HORIZON

log = logging.getLogger(__name__)

# A child lease still at one of these has not started reading.
_NOT_STARTED = (TRIM_HORIZON, LATEST, AT_TIMESTAMP)


def children_of(lease: Lease, leases: Mapping[str, Lease]) -> set[str]:
    """The lease keys of ``lease``'s children: those recorded on it at shard end, else the
    leases naming it as a parent (a lease finished by a worker that could not record them)."""
    if lease.child_shard_ids:
        return {lease.key_of(child) for child in lease.child_shard_ids}
    return {key for key, other in leases.items()
            if other.stream_identifier == lease.stream_identifier
            and lease.shard_id in other.parent_shard_ids}


def removable(leases: Mapping[str, Lease]) -> list[Lease]:
    """The finished leases whose deletion the KCL's rules allow now (pure: tested alone)."""
    found = []
    for lease in leases.values():
        if not lease.is_finished or lease.lease_owner:
            continue
        if any(lease.key_of(parent) in leases for parent in lease.parent_shard_ids):
            continue  # parents first
        children = children_of(lease, leases)
        if children and all(key in leases and
                            leases[key].checkpoint.sequence_number not in _NOT_STARTED
                            for key in children):
            found.append(lease)
    return sorted(found, key=lambda lease: lease.lease_key)


class LeaseCleaner:
    """Deletes what ``removable`` finds, in a table's leases as last scanned."""

    def __init__(self, table: LeaseTable) -> None:
        self.table = table
        self.deleted = 0

    def clean(self, leases: Iterable[Lease]) -> list[str]:
        """Delete the removable leases of ``leases``; returns the keys deleted. A failure is
        logged and left to the next pass: a lease kept a little longer costs nothing."""
        done = []
        for lease in removable({lease.lease_key: lease for lease in leases}):
            try:
                deleted = self.table.delete_finished_lease(lease)
            except KinesisDStreamError as exc:
                log.warning("could not delete finished lease %s (next pass tries again): %s",
                            lease.lease_key, exc)
                continue
            if deleted:
                self.deleted += 1
                done.append(lease.lease_key)
                log.info("deleted lease %s: its shard is finished and its children %s have "
                         "started", lease.lease_key, sorted(children_of(lease, {})) or
                         "(found by their parentShardId)")
        return done
