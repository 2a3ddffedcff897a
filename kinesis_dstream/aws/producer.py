"""A Kinesis producer for one stream: KPL aggregation, PutRecords limits, per-entry retries.

Not aws-kinesis-agg's ``RecordAggregator``: it sends a whole aggregate under its first record's
partition key, so records with other keys land on the wrong shard. As the KPL does, user
records are grouped by the shard whose hash range holds MD5(partition key) (or the explicit
hash key), and each aggregate goes with an ExplicitHashKey in that range (the format is
``kpl.py``'s). Shard ranges come from ListShards, again when an answer reveals a reshard.

Delivery is at-least-once: PutRecords is not idempotent, so a retried call or Spark task may
write a record twice; refused entries are retried, never dropped silently.
"""
from __future__ import annotations

import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..config import ConsumerConfig
from ..errors import (
    ConfigurationError,
    KinesisDStreamError,
    PutRecordsFailedError,
    RetriesExhaustedError,
)
from ..retry import PERMANENT, THROTTLING, RetryPolicy, classify
from .clients import call, error_for_code, make_client
from .kinesis import KinesisClient
from .kpl import Aggregate
from .protocols import KinesisAPI
from .shard_map import MAX_HASH_KEY, ShardMap, hash_key_of

log = logging.getLogger(__name__)

# Kinesis limits (PutRecords API reference).
MAX_RECORD_BYTES = 1024 * 1024          # one record: data + partition key
MAX_REQUEST_BYTES = 5 * 1024 * 1024     # one PutRecords: data + partition keys
MAX_REQUEST_ENTRIES = 500
MAX_PARTITION_KEY_CHARS = 256
# The KPL's AggregationMaxSize default: big enough for hundreds of small records per
# Kinesis record, small enough that a consumer's GetRecords page stays a sane size.
DEFAULT_AGGREGATION_MAX_BYTES = 51200

# How failed entries are sent again: up to 10 tries within 2 minutes, waits doubling from
# 100 ms (the sink's flushWaitTimeMs) to 5 s. Each try is one PutRecords call, itself retried
# under the Spark retry settings when the whole call fails.
PUT_RECORDS_RETRY = RetryPolicy(wait_time_ms=100, max_attempts=10, max_wait_ms=5000,
                                deadline_ms=120_000)


@dataclass
class _Entry:
    """One PutRecords entry and what it stands for."""

    request: dict[str, Any]
    size: int
    user_records: int
    shard_id: str | None  # where it must land (aggregates), None for plain records


@dataclass
class ProducerStats:
    """Counters since the producer was built."""

    user_records: int = 0
    kinesis_records: int = 0
    put_records_calls: int = 0
    entries_retried: int = 0
    shard_map_refreshes: int = 0
    failed_codes: dict[str, int] = field(default_factory=dict)


class KinesisProducer:
    """Writes user records to one stream, KPL-aggregated by default; at-least-once.

    Synchronous, for one caller (Spark's ``write`` runs one per task); ``max_connections`` > 1
    sends full requests concurrently. After a reshard, aggregates built before the answer
    that revealed it may land whole on one child shard, as with the KPL.
    ``put`` may send (when a request fills up or records waited ``record_max_buffered_time_ms``);
    ``flush`` sends everything buffered and returns only when it is written, or raises
    ``PutRecordsFailedError`` naming the records not written. Use as a context manager or
    call ``close`` (which flushes); a block left by an exception sends nothing more, so the
    caller's retry (a Spark task retry) decides. ``retry`` governs failed entries
    (``PUT_RECORDS_RETRY``). ``client``, ``sleep``, ``clock`` and ``rand`` exist for tests.
    """

    def __init__(self, config: ConsumerConfig, *, aggregation: bool = True,
                 aggregation_max_bytes: int = DEFAULT_AGGREGATION_MAX_BYTES,
                 record_max_buffered_time_ms: int = 1000, max_connections: int = 1,
                 retry: RetryPolicy = PUT_RECORDS_RETRY, client: KinesisAPI | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random) -> None:
        if not 0 < aggregation_max_bytes <= MAX_RECORD_BYTES:
            raise ConfigurationError(
                f"aggregation_max_bytes must be within 1..{MAX_RECORD_BYTES}, got "
                f"{aggregation_max_bytes}")
        if max_connections < 1:
            raise ConfigurationError(f"max_connections must be at least 1, got {max_connections}")
        self.stream_name = config.stream_name
        self.aggregation = aggregation
        self._aggregation_max_bytes = aggregation_max_bytes
        self._max_buffered_s = record_max_buffered_time_ms / 1000.0
        self._max_connections = max_connections
        self.retry = retry
        self._client = client if client is not None else make_client(config, "kinesis")
        self._kinesis = KinesisClient(config, client=self._client, sleep=sleep, rand=rand)
        self._policy = RetryPolicy.from_config(config)
        self._sleep = sleep
        self._clock = clock
        self._rand = rand
        self._shard_map: ShardMap | None = None
        self._open: dict[str, Aggregate] = {}
        self._ready: list[_Entry] = []   # the request being filled
        self._ready_bytes = 0
        self._full: list[list[_Entry]] = []  # requests at a limit, waiting to be sent
        self._oldest: float | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.stats = ProducerStats()

    # -- buffering ---------------------------------------------------------------------------
    def put(self, data: bytes | str, partition_key: str,
            explicit_hash_key: str | None = None) -> None:
        """Buffer one user record; may send full requests before returning."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(partition_key, str) or not 1 <= len(partition_key) <= MAX_PARTITION_KEY_CHARS:
            raise ConfigurationError(
                f"partition key must be a string of 1..{MAX_PARTITION_KEY_CHARS} characters, "
                f"got {partition_key!r}")
        if explicit_hash_key is not None:
            explicit_hash_key = str(explicit_hash_key)
            if not explicit_hash_key.isdigit() or int(explicit_hash_key) > MAX_HASH_KEY:
                raise ConfigurationError(
                    f"explicit hash key must be a decimal within 0..2^128-1, got "
                    f"{explicit_hash_key!r}")
        key_bytes = partition_key.encode("utf-8")
        if len(data) + len(key_bytes) > MAX_RECORD_BYTES:
            raise ConfigurationError(
                f"a record of {len(data)} bytes with partition key {partition_key!r} exceeds "
                f"Kinesis' {MAX_RECORD_BYTES}-byte record limit (stream {self.stream_name!r})")
        now = self._clock()
        if self._oldest is None:
            self._oldest = now
        self.stats.user_records += 1
        if self.aggregation:
            self._aggregate(data, partition_key, key_bytes, explicit_hash_key)
        else:
            self._add_plain(data, partition_key, key_bytes, explicit_hash_key)
        if self._max_buffered_s >= 0 and now - self._oldest >= self._max_buffered_s:
            self.flush()

    def put_many(self, records: Iterable[tuple[bytes | str, str] |
                                          tuple[bytes | str, str, str | None]]) -> None:
        """``put`` for (data, partition_key[, explicit_hash_key]) tuples."""
        for record in records:
            self.put(*record)

    def _add_plain(self, data: bytes, partition_key: str, key_bytes: bytes,
                   explicit_hash_key: str | None, shard_id: str | None = None,
                   user_records: int = 1) -> None:
        request: dict[str, Any] = {"Data": data, "PartitionKey": partition_key}
        if explicit_hash_key is not None:
            request["ExplicitHashKey"] = explicit_hash_key
        self._enqueue(_Entry(request, len(data) + len(key_bytes), user_records, shard_id))

    def _aggregate(self, data: bytes, partition_key: str, key_bytes: bytes,
                   explicit_hash_key: str | None) -> None:
        hash_key = hash_key_of(partition_key, explicit_hash_key)
        shard = self._shards().shard_for(hash_key)
        aggregate = self._open.get(shard.shard_id)
        if aggregate is None:
            aggregate = self._open[shard.shard_id] = Aggregate(shard.shard_id)
        if aggregate.try_add(partition_key, key_bytes, explicit_hash_key, data, hash_key,
                             self._aggregation_max_bytes):
            return
        if aggregate.records:  # full: close it and start the next one with this record
            self._close_aggregate(aggregate)
            aggregate = self._open[shard.shard_id] = Aggregate(shard.shard_id)
            if aggregate.try_add(partition_key, key_bytes, explicit_hash_key, data, hash_key,
                                 self._aggregation_max_bytes):
                return
        # Too large to aggregate even alone: sent plain, it lands where its own key maps.
        del self._open[shard.shard_id]
        self._add_plain(data, partition_key, key_bytes, explicit_hash_key, shard.shard_id)

    def _close_aggregate(self, aggregate: Aggregate) -> None:
        if len(aggregate.records) == 1:
            # One user record: plain is smaller and every consumer reads it.
            key_index, ehk_index, data = aggregate.records[0]
            ehk = next(iter(aggregate.hash_keys), None) if ehk_index is not None else None
            self._add_plain(data, aggregate.first_key, aggregate.first_key.encode("utf-8"), ehk,
                            aggregate.shard_id)
            return
        blob = aggregate.encode()
        request = {"Data": blob, "PartitionKey": aggregate.first_key,
                   # Inside the shard's range by construction: the aggregate lands where
                   # every one of its user records belongs.
                   "ExplicitHashKey": str(aggregate.first_hash_key)}
        self._enqueue(_Entry(request, len(blob) + len(aggregate.first_key.encode("utf-8")),
                             len(aggregate.records), aggregate.shard_id))

    def _enqueue(self, entry: _Entry) -> None:
        if self._ready and (len(self._ready) >= MAX_REQUEST_ENTRIES
                            or self._ready_bytes + entry.size > MAX_REQUEST_BYTES):
            self._full.append(self._ready)
            self._ready, self._ready_bytes = [], 0
            if len(self._full) >= self._max_connections:
                self._send_full()
        self._ready.append(entry)
        self._ready_bytes += entry.size

    def _shards(self) -> ShardMap:
        if self._shard_map is None:
            self._shard_map = ShardMap.load(self._kinesis)
            self.stats.shard_map_refreshes += 1
            log.debug("stream %s: %d open shards", self.stream_name,
                      len(self._shard_map.shards))
        return self._shard_map

    # -- sending -----------------------------------------------------------------------------
    def buffered_records(self) -> int:
        """User records accepted by ``put`` and not yet written."""
        return (sum(len(a.records) for a in self._open.values())
                + sum(e.user_records for e in self._ready)
                + sum(e.user_records for r in self._full for e in r))

    def flush(self) -> None:
        """Send every buffered record; returns when all are written.

        Raises ``PutRecordsFailedError`` (stream name, count not written) when entries still
        fail after the retries; the buffer is empty afterwards either way.
        """
        for aggregate in list(self._open.values()):
            self._close_aggregate(aggregate)
        self._open.clear()
        if self._ready:
            self._full.append(self._ready)
            self._ready, self._ready_bytes = [], 0
        self._oldest = None
        self._send_full()

    def _send_full(self) -> None:
        """Send the full requests, ``max_connections`` at a time."""
        requests, self._full = self._full, []
        if self._max_connections == 1 or len(requests) == 1:
            for index, request in enumerate(requests):
                try:
                    self._send_with_retries(request)
                except PutRecordsFailedError as exc:
                    # The later requests are not sent: they count as not written too.
                    total = exc.not_written + sum(e.user_records for r in requests[index + 1:]
                                                  for e in r)
                    raise PutRecordsFailedError(self._failure_text(total, exc), total,
                                                exc.last_error) from exc
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._max_connections,
                                            thread_name_prefix="kinesis-producer")
        futures = [self._pool.submit(self._send_with_retries, r) for r in requests]
        failures = []
        for future in futures:
            try:
                future.result()
            except PutRecordsFailedError as exc:
                failures.append(exc)
        if failures:
            total = sum(f.not_written for f in failures)
            raise PutRecordsFailedError(self._failure_text(total, failures[0]), total,
                                        failures[0].last_error) from failures[0]

    def _failure_text(self, not_written: int, cause: PutRecordsFailedError) -> str:
        reason = str(cause).split(": ", 1)[-1]
        return f"{not_written} records not written to stream {self.stream_name!r}: {reason}"

    def _send_with_retries(self, entries: list[_Entry]) -> None:
        """One request, then its failed entries again, until all are in or the policy gives up."""
        pending = entries
        tries = 0

        def send() -> None:
            nonlocal pending, tries
            if tries:
                self.stats.entries_retried += len(pending)
            tries += 1
            try:
                answer = call(self._policy, self._client.put_records,
                              f"putting {len(pending)} records to stream {self.stream_name!r}",
                              sleep=self._sleep, rand=self._rand, **self._kinesis.stream,
                              Records=[e.request for e in pending])
            except KinesisDStreamError as exc:
                not_written = sum(e.user_records for e in pending)
                raise PutRecordsFailedError(
                    f"{not_written} records not written to stream {self.stream_name!r}: {exc}",
                    not_written, exc) from exc
            self.stats.put_records_calls += 1
            pending, codes = self._failed_entries(pending, answer["Records"])
            if pending:
                raise self._entries_error(pending, codes)

        try:
            self.retry.call(send, "putting records", sleep=self._sleep, rand=self._rand,
                            clock=self._clock)
        except RetriesExhaustedError as exc:
            not_written = sum(e.user_records for e in pending)
            raise PutRecordsFailedError(
                f"{not_written} records not written to stream {self.stream_name!r}: {exc}",
                not_written, exc.last_error) from exc

    def _failed_entries(self, sent: list[_Entry], results: list[dict[str, Any]]
                        ) -> tuple[list[_Entry], dict[str, int]]:
        """The entries of ``sent`` that PutRecords refused, and their error codes counted.

        Notes a reshard that the accepted ones reveal.
        """
        failed: list[_Entry] = []
        codes: dict[str, int] = {}
        for entry, result in zip(sent, results, strict=False):
            code = result.get("ErrorCode")
            if code:
                failed.append(entry)
                codes[code] = codes.get(code, 0) + 1
                self.stats.failed_codes[code] = self.stats.failed_codes.get(code, 0) + 1
                continue
            self.stats.kinesis_records += 1
            if entry.shard_id is not None and result.get("ShardId") != entry.shard_id:
                # A reshard (or a map loaded before one): the record is written, but the
                # next ones need the current ranges.
                log.info("stream %s: a record for %s landed on %s; reloading shard map",
                         self.stream_name, entry.shard_id, result.get("ShardId"))
                self._shard_map = None
        return failed, codes

    def _entries_error(self, failed: list[_Entry], codes: dict[str, int]) -> KinesisDStreamError:
        """What refused entries amount to: permanent if one code is, else throttling if one is."""
        errors = {code: error_for_code(code, f"error codes {codes}") for code in codes}
        fatal = sorted(code for code, error in errors.items() if classify(error) == PERMANENT)
        if fatal:
            not_written = sum(e.user_records for e in failed)
            return PutRecordsFailedError(
                f"{not_written} records not written to stream {self.stream_name!r}: error codes "
                f"{codes} (not retryable: {fatal})", not_written)
        return next((e for e in errors.values() if classify(e) == THROTTLING),
                    next(iter(errors.values())))

    def close(self) -> None:
        """Flush, then release the sender threads."""
        try:
            self.flush()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> "KinesisProducer":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is None:
            self.close()
        elif self._pool is not None:  # already failing: do not send more, do not mask it
            self._pool.shutdown(wait=False)
            self._pool = None
