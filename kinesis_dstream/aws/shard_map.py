"""Which open shard a record belongs on: the shards' hash ranges, and a record's hash key.

The producer groups user records by this map, as the KPL does, so that an aggregate goes
to the shard that holds each of its records' keys. It is loaded from ListShards, and again
when a PutRecords answer reveals a reshard.
"""
from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass
from typing import Iterable

from ..errors import KinesisDStreamError
from .kinesis import KinesisClient

MAX_HASH_KEY = 2**128 - 1


def hash_key_of(partition_key: str, explicit_hash_key: str | None = None) -> int:
    """Where Kinesis puts a record: its explicit hash key, else MD5(partition key) as 128 bits."""
    if explicit_hash_key is not None:
        return int(explicit_hash_key)
    return int.from_bytes(hashlib.md5(partition_key.encode("utf-8")).digest(), "big")


@dataclass(frozen=True)
class _OpenShard:
    shard_id: str
    start: int
    end: int


class ShardMap:
    """Open shards' hash ranges, for grouping user records by the shard they belong on."""

    def __init__(self, shards: Iterable[_OpenShard]) -> None:
        self.shards = sorted(shards, key=lambda s: s.start)
        self._starts = [s.start for s in self.shards]
        if not self.shards:
            raise KinesisDStreamError("the stream has no open shards")

    @classmethod
    def load(cls, kinesis: KinesisClient) -> "ShardMap":
        return cls(_OpenShard(s.shard_id, int(s.starting_hash_key), int(s.ending_hash_key))
                   for s in kinesis.list_shards() if not s.is_closed)

    def shard_for(self, hash_key: int) -> _OpenShard:
        index = bisect.bisect_right(self._starts, hash_key) - 1
        shard = self.shards[max(index, 0)]
        if not shard.start <= hash_key <= shard.end:  # a gap: only while a reshard settles
            raise KinesisDStreamError(f"no open shard holds hash key {hash_key}")
        return shard
