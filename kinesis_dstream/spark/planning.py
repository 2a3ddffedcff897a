"""The one interface between a batch planner and the driver's shard coordinator.

Per batch, one call plans it (``plan``), one hands over what its read-ahead read
(``batch_read``) and one completes it (``batch_completed``); the reads are one input
stream's of one batch, keyed by shard (the planner picks them out of the accumulator once).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..config import ConsumerConfig
from ..retrieval import ReadReport
from .lease_period import PlannedShard


@dataclass(frozen=True)
class BatchPlan:
    """What one input stream reads in one batch."""

    shards: list[PlannedShard]
    owner: str  # the driver's worker id: tasks read only while it holds the lease
    # The last taker pass left free leases to the next one (the ramp-up after start).
    taking_leases: bool


class BatchCoordinator(Protocol):
    """What a ``BatchPlanner`` needs of the ``ShardCoordinator``."""

    name: str
    config: ConsumerConfig
    stopped: bool

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def plan(self, member: str, batch_ms: int) -> BatchPlan: ...

    def batch_read(self, member: str, batch_ms: int, reads: dict[str, ReadReport]) -> None: ...

    def batch_completed(self, member: str, batch_ms: int, succeeded: bool,
                        reads: dict[str, ReadReport]) -> None: ...

    def metrics(self, member: str | None = None) -> dict[str, dict]: ...
