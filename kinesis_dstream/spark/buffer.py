"""The driver's bounded buffer of received records.

Bounded by acknowledging late: a worker's shard thread waits for the ack of each batch it
forwards, so while the buffer is over capacity no shard of that worker fetches more
(backpressure reaches GetRecords). Memory stays under capacity plus one GetRecords answer
per shard.
"""
from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Callable, Sequence

# (data, partition key, sequence number, sub-sequence number, arrival epoch ms)
WireRecord = tuple
Ack = Callable[[], None]


class RecordBuffer:
    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"buffer capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._chunks: deque[list] = deque()  # [shard_id, records, offset]
        self._count = 0
        self._per_shard: Counter[str] = Counter()
        self._waiting_acks: list[Ack] = []

    def put(self, shard_id: str, records: Sequence[WireRecord], ack: Ack) -> None:
        """Queue records; ``ack`` runs now if there is room, else once batches made room."""
        with self._lock:
            if records:
                self._chunks.append([shard_id, records, 0])
                self._count += len(records)
                self._per_shard[shard_id] += len(records)
            room = self._count <= self.capacity
            if not room:
                self._waiting_acks.append(ack)
        if room:
            ack()

    def take(self, limit: int | None = None) -> list[tuple[str, Sequence[WireRecord]]]:
        """Up to ``limit`` records in arrival order, as (shard id, records) runs."""
        taken: list[tuple[str, Sequence[WireRecord]]] = []
        with self._lock:
            budget = self._count if limit is None else min(limit, self._count)
            while budget > 0 and self._chunks:
                chunk = self._chunks[0]
                shard_id, records, offset = chunk
                n = min(budget, len(records) - offset)
                part = records[offset:offset + n] if (offset or n < len(records)) else records
                taken.append((shard_id, part))
                budget -= n
                self._count -= n
                self._per_shard[shard_id] -= n
                if self._per_shard[shard_id] <= 0:
                    del self._per_shard[shard_id]
                if offset + n >= len(records):
                    self._chunks.popleft()
                else:
                    chunk[2] = offset + n
            acks = self._release_acks_locked()
        for ack in acks:
            ack()
        return taken

    def release_all(self) -> None:
        """Wake every waiting worker (on stop), whatever the fill."""
        with self._lock:
            acks, self._waiting_acks = self._waiting_acks, []
        for ack in acks:
            ack()

    def _release_acks_locked(self) -> list[Ack]:
        if self._count > self.capacity or not self._waiting_acks:
            return []
        acks, self._waiting_acks = self._waiting_acks, []
        return acks

    def count(self, shard_id: str | None = None) -> int:
        with self._lock:
            return self._count if shard_id is None else self._per_shard.get(shard_id, 0)

    def __len__(self) -> int:
        return self.count()
