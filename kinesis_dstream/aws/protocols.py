"""The boto3 client operations this package calls, as Protocols.

Clients are handed in (unit tests pass stubs, an executor shares one set per process), so
the modules that take one say which operations they need instead of ``Any``. Each operation
is a read-only callable member: a boto3 client's methods take keyword arguments typed per
operation, a stub's take ``**kwargs``, and ``clients.call`` takes the method itself.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

Operation = Callable[..., Any]


class KinesisAPI(Protocol):
    """A Kinesis client: the reads, the shard listing and PutRecords."""

    @property
    def meta(self) -> Any: ...
    @property
    def describe_stream_summary(self) -> Operation: ...
    @property
    def list_shards(self) -> Operation: ...
    @property
    def get_shard_iterator(self) -> Operation: ...
    @property
    def get_records(self) -> Operation: ...
    @property
    def put_records(self) -> Operation: ...


class StreamConsumerAPI(Protocol):
    """A Kinesis client's enhanced fan-out calls: consumers and subscriptions."""

    @property
    def describe_stream_consumer(self) -> Operation: ...
    @property
    def register_stream_consumer(self) -> Operation: ...
    @property
    def deregister_stream_consumer(self) -> Operation: ...
    @property
    def subscribe_to_shard(self) -> Operation: ...


class DynamoDBAPI(Protocol):
    """A DynamoDB client: the item calls of the lease and batch-range tables, and their set-up."""

    @property
    def describe_table(self) -> Operation: ...
    @property
    def create_table(self) -> Operation: ...
    @property
    def delete_table(self) -> Operation: ...
    @property
    def update_time_to_live(self) -> Operation: ...
    @property
    def update_continuous_backups(self) -> Operation: ...
    @property
    def get_item(self) -> Operation: ...
    @property
    def put_item(self) -> Operation: ...
    @property
    def update_item(self) -> Operation: ...
    @property
    def batch_write_item(self) -> Operation: ...
    @property
    def query(self) -> Operation: ...
    @property
    def scan(self) -> Operation: ...


class CloudWatchAPI(Protocol):
    """A CloudWatch client: metrics only."""

    @property
    def put_metric_data(self) -> Operation: ...
