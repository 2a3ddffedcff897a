"""Runs in the driver: the live coordinators and planners of this driver process.

Spark's checkpoint holds configuration only (``StreamSpec``); a recovered driver finds fresh
ones here, keyed by what identifies them: one coordinator per (application, stream, region,
endpoints), one planner per input stream. Fan-out's peer key is one per driver process
(never in the checkpoint): each executor process serves this driver's tasks on one port.
"""
from __future__ import annotations

import os
import threading

from ..config import ConsumerConfig
from ..retrieval.peer_tls import PeerKey, new_peer_key
from ..worker_id import default_worker_id, made_by_another_process
from .coordinator import ShardCoordinator
from .planner import BatchPlanner, StreamSpec

_coordinators: dict[tuple, ShardCoordinator] = {}
_planners: dict[str, BatchPlanner] = {}
_lock = threading.Lock()
_planners_lock = threading.Lock()
_worker_ids: dict[int, str] = {}
_peer_keys: dict[int, PeerKey] = {}


def coordinator_for(config: ConsumerConfig) -> ShardCoordinator:
    """The driver's coordinator for this application and stream (made on first use).

    A recovered driver's configuration comes from Spark's checkpoint with the worker id of
    the driver that wrote it. Two drivers started from one checkpoint directory (a zombie and
    its replacement) must not share an identity in the lease table, so this process takes
    an id of its own; it takes the predecessor's leases at once where that process is
    provably dead (it ran on this host and its pid is gone), else after failover_time_ms.
    """
    predecessor = None
    if made_by_another_process(config.worker_id):
        predecessor = config.worker_id
        config = config.replace(worker_id=_process_worker_id())
    key = (config.application_name, config.stream_name, config.region_name,
           config.kinesis_endpoint, config.dynamodb_endpoint)
    with _lock:
        coordinator = _coordinators.get(key)
        if coordinator is None or coordinator.stopped:
            coordinator = _coordinators[key] = ShardCoordinator(config)
            if predecessor is not None:
                coordinator.recovered_from(predecessor)
        return coordinator


def _process_worker_id() -> str:
    """One worker id per driver process, for every stream it recovers."""
    return _worker_ids.setdefault(os.getpid(), default_worker_id())


def _driver_peer_key() -> PeerKey:
    """The key this driver process's tasks prove themselves with to the executor processes
    holding their shards' subscriptions."""
    key = _peer_keys.get(os.getpid())
    if key is None:
        key = _peer_keys[os.getpid()] = new_peer_key()
    return key


def coordinators() -> list[ShardCoordinator]:
    with _lock:
        return list(_coordinators.values())


def planner_for(spec: StreamSpec) -> BatchPlanner:
    """The live planner of this input stream, made fresh in a new (recovered) driver."""
    with _planners_lock:
        planner = _planners.get(spec.key)
        if planner is None or planner.coordinator.stopped:
            coordinator = coordinator_for(spec.consumer_config)
            coordinator.add_member(spec.key)
            planner = _planners[spec.key] = BatchPlanner(
                spec, coordinator,
                _driver_peer_key() if spec.consumer_config.retrieval_mode == "FANOUT" else None)
        return planner


def planners() -> list[BatchPlanner]:
    with _planners_lock:
        return list(_planners.values())
