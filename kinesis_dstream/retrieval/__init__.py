"""Retrieval: how a shard's records are read, for every entry point (no pyspark here).

The Spark glue of both APIs (``spark/``, ``sql/``) and the worker's shard consumers read
through this package; it reads Kinesis through ``aws/``. Its parts, one role each:

- ``model``: what a batch reads of a shard (``ShardRange``), what it read (``ReadReport``)
  and where a read starts (``StartingPosition``);
- ``source``: the record-source interface (``RecordSource``, ``open_source``), and
  ``polling``, the source that polls (``KinesisDataFetcher``, de-aggregating with
  ``aws.kpl``), with ``data_loss`` (records trimmed before they were read);
- ``pacer``: how every read loop waits after a refused or failed call; ``fetch_pace``:
  how fast a reading may call GetRecords (a byte rate, a least period);
- ``read_loop``: the executors' read of one shard; ``shard_reader``: the range decision,
  the same records every time a partition is computed; ``shard_groups``: which shards a
  task reads, concurrently;
- ``executor_process``: what an executor's Python worker keeps between tasks (clients,
  logging, garbage-collection set-up);
- ``fanout``: the source that is pushed to (SubscribeToShard); ``subscriptions``: a
  worker's subscriptions held between tasks; ``subscription_peers``: a held subscription
  read for a task that runs in another process.

The names below are imported on first use (PEP 562), not with the package: the SQL source's
option parsing needs ``model``'s constants only, and each of Spark's Python processes for a
SQL query parses them; the read path (``shard_groups`` down to boto3) is imported by the
processes that read.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .fetch_pace import FetchPace
    from .model import (
        ITERATOR_TTL_S,
        MAX_FETCH_TIME_PER_SHARD_S,
        ReadReport,
        ShardRange,
        StartingPosition,
        shard_name,
    )
    from .pacer import Pacer
    from .polling import KinesisDataFetcher
    from .shard_groups import group_shards, read_each, read_shards
    from .shard_reader import read_shard_range, waiting_out_dynamodb
    from .source import RecordSource, open_source

# Each name of the package, and the module that defines it.
_MODULE_OF = {
    "FetchPace": "fetch_pace",
    **dict.fromkeys(("ITERATOR_TTL_S", "MAX_FETCH_TIME_PER_SHARD_S", "ReadReport", "ShardRange",
                     "StartingPosition", "shard_name"), "model"),
    "Pacer": "pacer",
    "KinesisDataFetcher": "polling",
    **dict.fromkeys(("group_shards", "read_each", "read_shards"), "shard_groups"),
    **dict.fromkeys(("read_shard_range", "waiting_out_dynamodb"), "shard_reader"),
    **dict.fromkeys(("RecordSource", "open_source"), "source"),
}

__all__ = ["ITERATOR_TTL_S", "MAX_FETCH_TIME_PER_SHARD_S", "ReadReport", "ShardRange",
           "StartingPosition", "shard_name", "FetchPace", "Pacer", "KinesisDataFetcher",
           "group_shards", "read_each", "read_shards", "read_shard_range",
           "waiting_out_dynamodb", "RecordSource", "open_source"]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:  # a submodule (``from kinesis_dstream.retrieval import read_loop``)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
