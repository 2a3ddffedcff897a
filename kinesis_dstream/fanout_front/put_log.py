"""The records the front relayed to the emulator, per shard (``wake_only`` fronts).

When every put comes through the front (``FrontSettings.wake_only``), a put's answer names
the shard and sequence number of each record it wrote, and its call holds the data: the
subscriptions of that shard can push the records from here instead of reading them back
with GetRecords. A benchmark's emulator then spends its time on the puts, not on serving
the front what the front has just handed it (kinesalite took a third of two cores doing so).

Puts are relayed one at a time while the log is kept, so each shard's records arrive in
sequence-number order and a subscription that pushed up to one never misses a lower one
answered later. A shard keeps its newest ``per_shard`` records; a subscription whose
position is older than that reads the emulator again (``after`` answers None).
"""
from __future__ import annotations

import bisect
import threading
import time
from typing import Any

PER_SHARD = 10000


class _ShardLog:
    def __init__(self) -> None:
        self.sequences: list[int] = []
        self.records: list[dict[str, Any]] = []
        self.dropped_through = -1  # the newest sequence number no longer held

    def add(self, sequence: int, record: dict[str, Any], keep: int) -> None:
        self.sequences.append(sequence)
        self.records.append(record)
        if len(self.sequences) > 2 * keep:  # drop in halves: amortised, not a shift a put
            cut = len(self.sequences) - keep
            self.dropped_through = self.sequences[cut - 1]
            del self.sequences[:cut], self.records[:cut]


class PutLog:
    """Each shard's relayed records by sequence number, newest ``per_shard`` kept."""

    def __init__(self, per_shard: int = PER_SHARD) -> None:
        self.per_shard = per_shard
        self._shards: dict[tuple[str, str], _ShardLog] = {}
        self._lock = threading.Lock()
        self.relay = threading.Lock()  # held around a put's relay and ``add``: answers in order

    def add(self, stream: str, operation: str, call: dict[str, Any],
            answer: dict[str, Any]) -> None:
        """Log what a successful PutRecord or PutRecords call wrote (failed entries skipped)."""
        now = round(time.time(), 3)
        if operation == "PutRecord":
            pairs = [(call, answer)]
        else:
            pairs = list(zip(call.get("Records") or (), answer.get("Records") or (), strict=False))
        with self._lock:
            for entry, written in pairs:
                if "SequenceNumber" not in written:
                    continue  # refused (throttled, failed): not on the shard
                record = {"Data": entry.get("Data", ""), "PartitionKey": entry.get("PartitionKey"),
                          "SequenceNumber": str(written["SequenceNumber"]),
                          "ApproximateArrivalTimestamp": now, "EncryptionType": "NONE"}
                key = (stream, str(written["ShardId"]))
                self._shards.setdefault(key, _ShardLog()).add(
                    int(written["SequenceNumber"]), record, self.per_shard)

    def after(self, stream: str, shard_id: str, sequence: str) -> list[dict[str, Any]] | None:
        """The shard's logged records after ``sequence``, or None when some of them may no
        longer be held (the caller reads the emulator)."""
        position = int(sequence)
        with self._lock:
            log = self._shards.get((stream, shard_id))
            if log is None:
                return []
            if log.dropped_through > position:
                return None
            return log.records[bisect.bisect_right(log.sequences, position):]
