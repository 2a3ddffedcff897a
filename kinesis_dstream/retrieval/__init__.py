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
"""
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

__all__ = ["ITERATOR_TTL_S", "MAX_FETCH_TIME_PER_SHARD_S", "ReadReport", "ShardRange",
           "StartingPosition", "shard_name", "FetchPace", "Pacer", "KinesisDataFetcher",
           "group_shards", "read_each", "read_shards", "read_shard_range",
           "waiting_out_dynamodb", "RecordSource", "open_source"]
