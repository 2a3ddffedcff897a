"""The batch-range table: which records each Spark batch read from each shard, durably.

A Spark batch must read the same records however often a partition of it is computed (a
task retry, a lost cached block, a second output operation, a re-run after ``getOrCreate``).
Kinesis cannot say in advance where a shard's records stop, so the first task that reads a
(batch, shard) writes the range it read here, conditionally, before it hands out a record;
every later computation of that partition finds the range and reads exactly it. The JVM
connectors keep the same fact in HDFS or DynamoDB; we keep it in DynamoDB next to the lease
table, never in it (Java KCL workers scan the lease table). The SQL source may keep them as
files instead (``range_files``; ``range_store`` chooses).

One item per (input stream, shard, batch): ``rangeKey`` = "<stream key>/<shard id>" (HASH),
``batchTime`` = batch time in epoch ms (RANGE). Items are deleted once the batch's positions
are checkpointed (and carry ``expiresAt`` for a table with TTL on), so the table holds only
the batches after each shard's last checkpoint.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

import botocore.exceptions

from ..config import ConsumerConfig
from ..errors import RetriesExhaustedError, ThrottlingError
from ..records import ExtendedSequenceNumber
from ..retry import RetryPolicy
from .clients import call, make_client
from .protocols import DynamoDBAPI
from .tables import TableSettings, create_table_if_not_exists

log = logging.getLogger(__name__)

# Items outlive a crashed driver that never cleans up, but not forever.
RANGE_TTL_S = 7 * 24 * 3600
RANGE_TTL_ATTRIBUTE = "expiresAt"
# BatchWriteItem's UnprocessedItems (DynamoDB throttling a batch) are sent again after the
# retry policy's backoff, this many calls at least and within this time, then given up on.
UNPROCESSED_ATTEMPTS = 8
UNPROCESSED_DEADLINE_MS = 20_000
# (attribute, key type, attribute type)
RANGE_TABLE_KEYS = (("rangeKey", "HASH", "S"), ("batchTime", "RANGE", "N"))


def range_table_name(application_name: str) -> str:
    """Beside the lease table, named so that no KCL table (``<app>-WorkerMetricStats``,
    ``<app>-CoordinatorState``) can ever clash with it."""
    return f"{application_name}-kinesis-dstream-ranges"


@dataclass(frozen=True)
class BatchRange:
    """What one batch read from one shard: after ``start`` through ``end`` (inclusive).

    ``start`` is a position (exclusive) or a sentinel (TRIM_HORIZON, or AT_TIMESTAMP with
    ``start_timestamp``): both give the same records every time they are read. ``end`` is the
    last user record read, None when the batch read nothing.
    """

    stream_key: str
    shard_id: str
    batch_ms: int
    start: ExtendedSequenceNumber
    start_timestamp: float | None = None
    end: ExtendedSequenceNumber | None = None
    records: int = 0
    shard_end: bool = False
    child_shard_ids: tuple[str, ...] = field(default_factory=tuple)
    # Kinesis' NextShardIterator after ``end`` when the read ended at a page boundary, and
    # when it was handed out (epoch s): a reader that learns where the next read starts from
    # this item (the SQL source's driver) can start it without a GetShardIterator.
    next_iterator: str | None = field(default=None, repr=False, compare=False)
    iterator_time: float = field(default=0.0, compare=False)
    # How far behind the shard's tip the read ended (its last GetRecords' MillisBehindLatest):
    # the SQL source's driver reports it for a shard it reads again without probing.
    millis_behind_latest: int | None = field(default=None, compare=False)
    # Under fan-out, the executor process (``host:port``) that holds the shard's subscription
    # after this read: the next batch's task asks it (``retrieval.subscription_peers``).
    subscriber: str | None = field(default=None, compare=False)
    # What the read that decided this range cost (ms): in GetRecords calls, asleep between
    # them (throttle pauses, backoffs, pacing), and turning the records into what the task
    # hands out. The SQL source's driver reports them in the query progress.
    read_ms: float | None = field(default=None, compare=False)
    wait_ms: float | None = field(default=None, compare=False)
    convert_ms: float | None = field(default=None, compare=False)
    # Epoch s when the shard is expected to serve the next read: this read's pages spent its
    # 2 MiB/s ahead until then (0.0: at once). The next batch's task waits for it rather
    # than be refused.
    ready_at: float = field(default=0.0, compare=False)

    @property
    def next_start(self) -> ExtendedSequenceNumber:
        """Where the shard's next batch starts (exclusive)."""
        return self.end if self.end is not None else self.start


def start_after(previous: BatchRange | None, floor: ExtendedSequenceNumber,
                floor_timestamp: float | None) -> tuple[ExtendedSequenceNumber, float | None]:
    """Where a shard's next read starts: where its previous batch in this lease period ended,
    or the period's floor. The one rule, for the driver (from a read's report), for a task
    that looks the previous batch up and for the SQL offsets."""
    if previous is not None:
        return previous.next_start, previous.start_timestamp
    return floor, floor_timestamp


# The read's costs: item attribute -> BatchRange field.
_COST_FIELDS = {"readMs": "read_ms", "waitMs": "wait_ms", "convertMs": "convert_ms"}


def _item(r: BatchRange) -> dict[str, Any]:
    item: dict[str, Any] = {
        "rangeKey": {"S": f"{r.stream_key}/{r.shard_id}"},
        "batchTime": {"N": str(r.batch_ms)},
        "start": {"S": r.start.sequence_number},
        "startSub": {"N": str(r.start.sub_sequence_number)},
        "records": {"N": str(r.records)},
        "shardEnd": {"BOOL": r.shard_end},
        RANGE_TTL_ATTRIBUTE: {"N": str(int(time.time()) + RANGE_TTL_S)},
    }
    if r.start_timestamp is not None:
        item["startTimestamp"] = {"N": repr(float(r.start_timestamp))}
    if r.end is not None:
        item["end"] = {"S": r.end.sequence_number}
        item["endSub"] = {"N": str(r.end.sub_sequence_number)}
    if r.child_shard_ids:
        item["childShardIds"] = {"SS": sorted(r.child_shard_ids)}
    if r.next_iterator is not None:
        item["nextIterator"] = {"S": r.next_iterator}
        item["iteratorTime"] = {"N": repr(float(r.iterator_time))}
    if r.millis_behind_latest is not None:
        item["millisBehindLatest"] = {"N": str(int(r.millis_behind_latest))}
    if r.subscriber is not None:
        item["subscriber"] = {"S": r.subscriber}
    if r.ready_at:
        item["readyAt"] = {"N": repr(round(float(r.ready_at), 3))}
    for name, field_name in _COST_FIELDS.items():
        value = getattr(r, field_name)
        if value is not None:
            item[name] = {"N": str(round(value, 1))}
    return item


def _range(item: dict[str, Any]) -> BatchRange:
    stream_key, _, shard_id = item["rangeKey"]["S"].rpartition("/")
    end = None
    if "end" in item:
        end = ExtendedSequenceNumber(item["end"]["S"], int(item["endSub"]["N"]))
    return BatchRange(
        stream_key=stream_key, shard_id=shard_id, batch_ms=int(item["batchTime"]["N"]),
        start=ExtendedSequenceNumber(item["start"]["S"], int(item["startSub"]["N"])),
        start_timestamp=float(item["startTimestamp"]["N"]) if "startTimestamp" in item else None,
        end=end, records=int(item["records"]["N"]), shard_end=item["shardEnd"]["BOOL"],
        child_shard_ids=tuple(item.get("childShardIds", {}).get("SS", ())),
        next_iterator=item.get("nextIterator", {}).get("S"),
        iterator_time=float(item.get("iteratorTime", {}).get("N", 0.0)),
        millis_behind_latest=(int(item["millisBehindLatest"]["N"])
                              if "millisBehindLatest" in item else None),
        subscriber=item.get("subscriber", {}).get("S"),
        ready_at=float(item.get("readyAt", {}).get("N", 0.0)),
        **{field_name: float(item[name]["N"]) for name, field_name in _COST_FIELDS.items()
           if name in item})


def enable_ttl(client: DynamoDBAPI, table_name: str) -> None:
    """TTL on ``expiresAt``, where the DynamoDB has it (dynalite has not): the explicit
    deletes are what count, TTL only sweeps what a crashed driver left."""
    try:
        client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": RANGE_TTL_ATTRIBUTE})
    except Exception as exc:  # noqa: BLE001 - optional, and logged
        log.debug("no TTL on %s: %s", table_name, exc)


class _Unprocessed(ThrottlingError):
    """Some requests of a BatchWriteItem came back unprocessed: throughput, to back off."""


class BatchRangeTable:
    """Conditional writes and consistent reads of batch ranges; no policy."""

    def __init__(self, config: ConsumerConfig, client: DynamoDBAPI | None = None) -> None:
        self.config = config
        self.table_name = range_table_name(config.application_name)
        self.client = client if client is not None else make_client(config, "dynamodb")
        self.retry = RetryPolicy.from_config(config)

    def _call(self, what: str, operation: str, expected: tuple[str, ...] = (), **kwargs: Any) -> Any:
        return call(self.retry, getattr(self.client, operation), f"{what} (table {self.table_name})",
                    expected=expected, **kwargs)

    def prepare(self) -> None:
        """``range_store.RangeStore``'s: the table, created unless it exists."""
        self.create_table_if_not_exists()

    def create_table_if_not_exists(self, timeout_s: float = 60.0) -> bool:
        """Create the table unless it exists (billed as the config says), with TTL on
        ``expiresAt``; True if this call created it. A table that exists is left as it is."""
        created = create_table_if_not_exists(self.retry, self.client, self.table_name,
                                             "batch-range table", RANGE_TABLE_KEYS, timeout_s,
                                             TableSettings.of(self.config))
        if created:
            enable_ttl(self.client, self.table_name)
        return created

    def get(self, stream_key: str, shard_id: str, batch_ms: int) -> BatchRange | None:
        item = self._call(f"reading the range of batch {batch_ms} of shard {shard_id}", "get_item",
                          TableName=self.table_name, ConsistentRead=True,
                          Key={"rangeKey": {"S": f"{stream_key}/{shard_id}"},
                               "batchTime": {"N": str(batch_ms)}}).get("Item")
        return _range(item) if item else None

    def latest_before(self, stream_key: str, shard_id: str, batch_ms: int,
                      since_ms: int) -> BatchRange | None:
        """The range of the shard's latest batch in [since_ms, batch_ms), if any."""
        if since_ms >= batch_ms:
            return None
        items = self._call(
            f"finding the batch before {batch_ms} of shard {shard_id}", "query",
            TableName=self.table_name, ConsistentRead=True, ScanIndexForward=False, Limit=1,
            KeyConditionExpression="rangeKey = :k AND batchTime BETWEEN :lo AND :hi",
            ExpressionAttributeValues={":k": {"S": f"{stream_key}/{shard_id}"},
                                       ":lo": {"N": str(since_ms)},
                                       ":hi": {"N": str(batch_ms - 1)}}).get("Items", [])
        return _range(items[0]) if items else None

    def put_if_absent(self, batch_range: BatchRange) -> BatchRange:
        """Store the range unless another computation of this partition stored one first;
        returns the stored range (ours or theirs)."""
        try:
            self._call(f"recording the range of batch {batch_range.batch_ms} of shard "
                       f"{batch_range.shard_id}", "put_item",
                       expected=("ConditionalCheckFailedException",), TableName=self.table_name,
                       Item=_item(batch_range), ConditionExpression="attribute_not_exists(rangeKey)")
            return batch_range
        except botocore.exceptions.ClientError:
            stored = self.get(batch_range.stream_key, batch_range.shard_id, batch_range.batch_ms)
            if stored is None:  # deleted in between: only possible after a checkpoint past it
                return batch_range
            return stored

    def delete(self, ranges: Iterable[tuple[str, str, int]]) -> int:
        """Delete these (stream key, shard id, batch time) ranges, whose positions are
        checkpointed: 25 to a call, whichever shards they belong to.

        Requests DynamoDB gives back unprocessed (it throttles a batch so) are sent again
        after the retry policy's backoff, within ``UNPROCESSED_ATTEMPTS`` calls and
        ``UNPROCESSED_DEADLINE_MS``; then ``RetriesExhaustedError`` names the table and the
        ranges left (their items expire by TTL).
        """
        keys = [{"rangeKey": {"S": f"{stream_key}/{shard_id}"}, "batchTime": {"N": str(t)}}
                for stream_key, shard_id, t in sorted(set(ranges))]
        policy = replace(self.retry, max_attempts=max(self.retry.max_attempts, UNPROCESSED_ATTEMPTS),
                         deadline_ms=UNPROCESSED_DEADLINE_MS)
        for i in range(0, len(keys), 25):
            left = [{"DeleteRequest": {"Key": k}} for k in keys[i:i + 25]]

            def send() -> None:
                nonlocal left
                answer = self._call("deleting checkpointed batch ranges", "batch_write_item",
                                    RequestItems={self.table_name: left})
                left = answer.get("UnprocessedItems", {}).get(self.table_name, [])
                if left:
                    raise _Unprocessed(f"{len(left)} of the batch unprocessed")

            try:
                policy.call(send, f"deleting checkpointed batch ranges (table {self.table_name})")
            except RetriesExhaustedError as exc:
                if not isinstance(exc.last_error, _Unprocessed):
                    raise
                named = ", ".join(f"{r['DeleteRequest']['Key']['rangeKey']['S']}@"
                                  f"{r['DeleteRequest']['Key']['batchTime']['N']}" for r in left)
                undone = len(left) + len(keys[i + 25:])
                raise RetriesExhaustedError(
                    f"{exc}; {undone} range(s) of table {self.table_name} not deleted (they "
                    f"expire by TTL): {named}" + (f" and {len(keys[i + 25:])} not tried"
                                                  if keys[i + 25:] else ""),
                    exc.last_error) from exc
        return len(keys)

    def batch_times(self, stream_key: str, shard_id: str) -> list[int]:
        """Every stored batch time of a shard of a stream (for cleanup after a restart)."""
        times: list[int] = []
        kwargs: dict[str, Any] = dict(
            TableName=self.table_name, KeyConditionExpression="rangeKey = :k",
            ExpressionAttributeValues={":k": {"S": f"{stream_key}/{shard_id}"}},
            ProjectionExpression="batchTime")
        while True:
            page = self._call(f"listing batch ranges of shard {shard_id}", "query", **kwargs)
            times.extend(int(i["batchTime"]["N"]) for i in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return times
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def delete_table(self) -> None:
        self._call("deleting the batch-range table", "delete_table", TableName=self.table_name)

