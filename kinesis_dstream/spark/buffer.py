"""The driver's bounded buffer of received records.

Bounded by acknowledging late: a worker's shard thread waits for the ack of each batch it
forwards, so while the buffer is over capacity no shard of that worker fetches more
(backpressure reaches GetRecords). Memory stays under capacity plus one GetRecords answer
per shard.

Each shard's records in the buffer only ever go forward: a record at or below the highest
position this buffer has received for its shard (in the driver's life) is dropped. When a
lease moves between two workers of this driver, the new owner re-reads from the last
checkpoint what the old owner already forwarded; those records are buffered or processed
here already, and taking them again would count them twice. The new owner starts at the
lease's checkpoint, which this driver wrote only for records it received, so its re-reads
join the old owner's without a gap, even while the old owner, not yet aware of the loss,
still forwards.
"""
from __future__ import annotations

import threading
from bisect import bisect_right
from collections import Counter, deque
from typing import Callable, NamedTuple, Sequence

# (data, partition key, sequence number, sub-sequence number, arrival epoch ms)
WireRecord = tuple
Ack = Callable[[], None]


def record_position(record: WireRecord) -> tuple[int, int]:
    """(sequence number, sub-sequence) as integers: decimal strings do not sort as text."""
    return int(record[2]), int(record[3] or 0)


class PutResult(NamedTuple):
    accepted: int
    dropped: int  # already received for this shard: buffered or processed before


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
        self._highest: dict[str, tuple[int, int]] = {}  # per shard, over the buffer's life

    def put(self, shard_id: str, records: Sequence[WireRecord], ack: Ack) -> PutResult:
        """Queue the records not received before; ``ack`` runs now if there is room, else
        once batches made room.

        ``records`` are one GetRecords page of one shard, in order, so the check is two
        comparisons, and a search only for the page that straddles the highest position.
        """
        with self._lock:
            total = len(records)
            records = self._newer_locked(shard_id, records)
            if records:
                self._chunks.append([shard_id, records, 0])
                self._count += len(records)
                self._per_shard[shard_id] += len(records)
            room = self._count <= self.capacity
            if not room:
                self._waiting_acks.append(ack)
        if room:
            ack()
        return PutResult(len(records), total - len(records))

    def _newer_locked(self, shard_id: str, records: Sequence[WireRecord]) -> Sequence[WireRecord]:
        if not records:
            return records
        highest = self._highest.get(shard_id)
        last = record_position(records[-1])
        if highest is not None:
            if last <= highest:
                return records[:0]
            if record_position(records[0]) <= highest:
                records = records[bisect_right(records, highest, key=record_position):]
        self._highest[shard_id] = last
        return records

    def highest(self, shard_id: str) -> tuple[int, int] | None:
        """The highest position received for the shard (buffered or already taken)."""
        with self._lock:
            return self._highest.get(shard_id)

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
