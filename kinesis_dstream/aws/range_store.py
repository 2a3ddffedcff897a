"""Where batch ranges are kept: the one interface the readers use, and the choice of store.

Two stores keep the same facts (``range_table``'s docstring says what a range is for): the
DynamoDB range table (``BatchRangeTable``; the DStream's, and the SQL source's with
``kinesis.metadataCommitterType`` DYNAMODB) and small files under a path
(``FileRangeStore``; the SQL source's with HDFS and ``kinesis.metadataPath``: local or S3),
with which a query makes no DynamoDB call at all. ``ConsumerConfig.range_path`` chooses,
and travels with the config to the executors.
"""
from __future__ import annotations

from typing import Iterable, Protocol

from ..config import ConsumerConfig
from .range_table import BatchRange, BatchRangeTable, range_table_name


class RangeStore(Protocol):
    """Conditional writes and consistent reads of batch ranges; no policy."""

    def prepare(self) -> None:
        """Make what the store needs before its first write (the DynamoDB table)."""

    def get(self, stream_key: str, shard_id: str, batch_ms: int) -> BatchRange | None: ...

    def latest_before(self, stream_key: str, shard_id: str, batch_ms: int,
                      since_ms: int) -> BatchRange | None:
        """The range of the shard's latest batch in [since_ms, batch_ms), if any."""

    def put_if_absent(self, batch_range: BatchRange) -> BatchRange:
        """Store the range unless one is stored for its (stream key, shard, batch): the
        stored one (ours or the first writer's)."""

    def delete(self, ranges: Iterable[tuple[str, str, int]]) -> int:
        """Delete these (stream key, shard id, batch time) ranges; how many were asked."""

    def batch_times(self, stream_key: str, shard_id: str) -> list[int]:
        """Every stored batch time of a shard of a stream."""


def open_range_store(config: ConsumerConfig) -> RangeStore:
    """The store ``config`` names: files under ``range_path``, else the DynamoDB table."""
    if config.range_path is not None:
        from .range_files import FileRangeStore

        return FileRangeStore(config)
    return BatchRangeTable(config)


def range_store_name(config: ConsumerConfig) -> str:
    """The store, as logs name it: its path, or the DynamoDB table."""
    if config.range_path is not None:
        return f"batch ranges under {config.range_path}"
    return f"DynamoDB (tables {config.application_name} and " \
           f"{range_table_name(config.application_name)})"
