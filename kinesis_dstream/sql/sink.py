"""The Kinesis sink: ``df.write`` / ``df.writeStream`` ``.format("aws-kinesis")``, and the same
producer for DStreams (``write_to_kinesis``).

``write`` runs in Spark's Python workers on the executors, one ``KinesisProducer`` per task,
so records go from where they are to Kinesis without passing through the driver; the driver
only sees each task's counts (``KinesisCommitMessage``) in ``commit``/``abort``.

**At-least-once.** PutRecords is not idempotent: a task that Spark retries, or a streaming
batch re-run after a failure, writes its records again. A task succeeds only when every one of
its records is in the stream; otherwise it fails with ``PutRecordsFailedError`` naming the
stream and the number of records not written, and Spark retries it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from ..aws.clients import make_client
from ..aws.producer import PUT_RECORDS_RETRY, KinesisProducer
from ..errors import ConfigurationError
from ..preflight import check_executors, use_driver_python_on_local_master
from .executor_guard import guarded_reduce
from .option_table import ENDPOINT_URL, REGION, STREAM_NAME
from .options import KinesisOptions, parse_options

if TYPE_CHECKING:
    from pyspark.streaming import DStream

log = logging.getLogger(__name__)

DATA, PARTITION_KEY, EXPLICIT_HASH_KEY = "data", "partitionKey", "explicitHashKey"


@dataclass
class KinesisCommitMessage(WriterCommitMessage):
    """What one task wrote."""

    records: int
    kinesis_records: int
    put_records_calls: int
    entries_retried: int


def make_producer(options: KinesisOptions) -> KinesisProducer:
    """The producer the sink options describe (one per task).

    kinesis.sink.recordTtl is the retries' deadline: the KPL drops a record not written
    within it, and the awslabs sink then fails the task; ours fails the write, naming the
    records not written. Enough tries are allowed that the deadline, not their count, ends
    them (the waits soon reach ``max_wait_ms``, of which jitter keeps at least half).
    """
    sink = options.sink
    attempts = PUT_RECORDS_RETRY.max_attempts + 2 * sink.record_ttl_ms // \
        PUT_RECORDS_RETRY.max_wait_ms
    retry = replace(PUT_RECORDS_RETRY, wait_time_ms=sink.flush_wait_time_ms,
                    deadline_ms=sink.record_ttl_ms, max_attempts=attempts)
    client = None if sink.proxies is None else \
        make_client(options.config, "kinesis", proxies=sink.proxies)
    return KinesisProducer(options.config, aggregation=sink.aggregation_enabled,
                           record_max_buffered_time_ms=sink.record_max_buffered_time_ms,
                           max_connections=sink.max_connections, retry=retry, client=client)


def _column_indexes(schema: StructType) -> tuple[int, int, int | None]:
    """Positions of data, partitionKey and explicitHashKey; checked once, on the driver."""
    by_name = {f.name.lower(): (i, f) for i, f in enumerate(schema.fields)}
    found: list[int | None] = []
    for name, types, required in ((DATA, (StringType, BinaryType), True),
                                  (PARTITION_KEY, (StringType,), True),
                                  (EXPLICIT_HASH_KEY, (StringType,), False)):
        entry = by_name.get(name.lower())
        if entry is None:
            if required:
                raise ConfigurationError(
                    f"the Kinesis sink needs a column {name!r} ({' or '.join(t.typeName() for t in types)}); "
                    f"the input has {[f.name for f in schema.fields]}")
            found.append(None)
            continue
        index, column = entry
        if not isinstance(column.dataType, types):
            raise ConfigurationError(
                f"column {name!r} must be {' or '.join(t.typeName() for t in types)}, "
                f"got {column.dataType.simpleString()}")
        found.append(index)
    data, key, hash_key = found
    assert data is not None and key is not None  # required: refused above when missing
    return data, key, hash_key


class _RowWriter:
    """The part shared by the batch and the streaming writer; pickled to the executors."""

    def __init__(self, options: KinesisOptions, schema: StructType) -> None:
        self.options = options
        self.indexes = _column_indexes(schema)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A worker without the package fails naming its interpreter (executor_guard).
        return guarded_reduce(self, dict(self.__dict__), "format(\"aws-kinesis\")'s writes") \
            or super().__reduce_ex__(protocol)

    def write(self, iterator: Iterator[Any]) -> KinesisCommitMessage:
        data_at, key_at, ehk_at = self.indexes
        producer = make_producer(self.options)
        with producer:
            for row in iterator:
                data, key = row[data_at], row[key_at]
                if data is None or key is None:
                    raise ConfigurationError(
                        f"null {DATA if data is None else PARTITION_KEY!r} in a row for stream "
                        f"{self.options.stream_name!r}: Kinesis needs both")
                if isinstance(data, bytearray):
                    data = bytes(data)
                producer.put(data, key, row[ehk_at] if ehk_at is not None else None)
        stats = producer.stats
        return KinesisCommitMessage(stats.user_records, stats.kinesis_records,
                                    stats.put_records_calls, stats.entries_retried)

    def _log(self, messages: list[KinesisCommitMessage | None], outcome: str,
             batch_id: int | None = None) -> None:
        done = [m for m in messages if m is not None]
        level = logging.INFO if outcome == "committed" else logging.WARNING
        log.log(level, "%s%s: %d records as %d Kinesis records to stream %r (%d tasks, %d "
                "PutRecords calls, %d entries retried)%s",
                f"batch {batch_id} " if batch_id is not None else "", outcome,
                sum(m.records for m in done), sum(m.kinesis_records for m in done),
                self.options.stream_name, len(messages), sum(m.put_records_calls for m in done),
                sum(m.entries_retried for m in done),
                "" if outcome == "committed" else
                "; records of finished tasks are in the stream (at-least-once)")


class KinesisBatchWriter(_RowWriter, DataSourceWriter):
    """``df.write.format("aws-kinesis")``."""

    def commit(self, messages: list[KinesisCommitMessage | None]) -> None:  # type: ignore[override]
        self._log(messages, "committed")

    def abort(self, messages: list[KinesisCommitMessage | None]) -> None:  # type: ignore[override]
        self._log(messages, "aborted")


class KinesisStreamWriter(_RowWriter, DataSourceStreamWriter):
    """``df.writeStream.format("aws-kinesis")``: each micro-batch like a batch write."""

    def commit(self, messages: list[KinesisCommitMessage | None],  # type: ignore[override]
               batchId: int) -> None:  # noqa: N803 - Spark's name
        self._log(messages, "committed", batchId)

    def abort(self, messages: list[KinesisCommitMessage | None],  # type: ignore[override]
              batchId: int) -> None:  # noqa: N803 - Spark's name
        self._log(messages, "aborted", batchId)


def _partition_writer(options: KinesisOptions,
                      partition_key: Callable[[Any], str] | None) -> Callable[[Iterable[Any]], None]:
    def write_partition(elements: Iterable[Any]) -> None:
        with make_producer(options) as producer:
            for element in elements:
                if partition_key is not None:
                    producer.put(element, partition_key(element))
                else:
                    producer.put(element[1], element[0], *element[2:3])
    return write_partition


def write_to_kinesis(dstream: "DStream", stream_name: str, endpoint_url: str | None = None,
                     region_name: str | None = None, *,
                     partition_key: Callable[[Any], str] | None = None,
                     options: Mapping[str, str] | None = None) -> None:
    """Write every batch of ``dstream`` to a Kinesis stream, from the executors.

    Elements are ``(partition_key, data)`` or ``(partition_key, data, explicit_hash_key)``
    tuples, data ``bytes`` or ``str``; or any ``data`` when ``partition_key`` is a function of
    it. ``options`` takes the sink options of ``format("aws-kinesis")`` by the same names
    (``kinesis.sink.aggregationEnabled``, credentials, ...). At-least-once, like the sink: a
    batch whose output is retried writes its records again. Bad options fail here, on the
    driver, before the stream starts.
    """
    given = dict(options or {})
    given[STREAM_NAME] = stream_name
    if endpoint_url:
        given[ENDPOINT_URL] = endpoint_url
    if region_name:
        given[REGION] = region_name
    parsed = parse_options(given)
    use_driver_python_on_local_master(dstream.context().sparkContext)
    check_executors(dstream.context().sparkContext, purpose="write_to_kinesis's writes")
    writer = _partition_writer(parsed, partition_key)
    dstream.foreachRDD(lambda rdd: rdd.foreachPartition(writer))
