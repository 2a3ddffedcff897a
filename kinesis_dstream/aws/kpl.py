"""The KPL aggregate format, both ways: de-aggregation for every reader and the aggregates
the producer writes.

MAGIC + protobuf ``AggregatedRecord`` + its MD5 (amazon-kinesis-producer's
aggregation-format.md), from aws-kinesis-agg's generated messages, so every KPL
de-aggregator reads what we write. Not aws-kinesis-agg's own modules: they import ``six``
(undeclared) and put their directory first on ``sys.path``; their de-aggregator drops an
aggregate it cannot split, where ours delivers it whole as one plain record with a warning,
so a consumer sees it. ``Aggregate`` holds the user records bound for one shard and keeps the
size of their encoding exact.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import importlib
import logging
import sys
from types import ModuleType
from typing import Any, Iterable

from aws_kinesis_agg import DIGEST_SIZE, MAGIC
from google.protobuf.message import DecodeError

from ..records import Record

__all__ = ["DIGEST_SIZE", "MAGIC", "Aggregate", "deaggregate", "epoch_ms", "messages_pb2"]

log = logging.getLogger(__name__)


def _load_messages() -> ModuleType:
    """aws-kinesis-agg's ``messages_pb2``, whose plain ``import config_pb2`` is made to
    resolve for that one import only, not by putting its directory on ``sys.path``."""
    loaded = sys.modules.get("aws_kinesis_agg.messages_pb2")
    if loaded is not None:
        return loaded
    if "config_pb2" in sys.modules:  # aws-kinesis-agg's own sys.path trick ran already
        return importlib.import_module("aws_kinesis_agg.messages_pb2")
    sys.modules["config_pb2"] = importlib.import_module("aws_kinesis_agg.config_pb2")
    try:
        return importlib.import_module("aws_kinesis_agg.messages_pb2")
    finally:
        sys.modules.pop("config_pb2", None)


messages_pb2 = _load_messages()

_MAGIC_LEN = len(MAGIC)
_MIN_AGGREGATE_LEN = _MAGIC_LEN + DIGEST_SIZE


# -- reading -------------------------------------------------------------------------------------
def epoch_ms(value: Any) -> int:
    """ApproximateArrivalTimestamp as kclpy gives it: integer epoch milliseconds."""
    if value is None:
        return 0
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return int(value.timestamp() * 1000)
    return int(float(value) * 1000)  # epoch seconds, as the JSON wire format has it


def _split(data: bytes, sequence_number: str, arrival_ms: int,
           shard_id: str) -> list[Record] | None:
    """The user records of an aggregate, or None (after a warning) when it is malformed."""
    def malformed(why: str) -> list[Record] | None:
        log.warning("malformed KPL aggregate in shard %s at sequence number %s (%s, %d bytes): "
                    "delivered as one plain record", shard_id, sequence_number, why, len(data))
        return None

    if len(data) <= _MIN_AGGREGATE_LEN:
        return malformed("truncated: shorter than magic and checksum")
    body = data[_MAGIC_LEN:-DIGEST_SIZE]
    if hashlib.md5(body).digest() != data[-DIGEST_SIZE:]:
        return malformed("checksum mismatch")
    aggregate = messages_pb2.AggregatedRecord()
    try:
        aggregate.ParseFromString(body)
    except DecodeError as exc:
        return malformed(f"bad protobuf: {exc}")
    keys = list(aggregate.partition_key_table)
    hash_keys = list(aggregate.explicit_hash_key_table)
    n_keys, n_hash_keys = len(keys), len(hash_keys)
    out: list[Record] = []
    for sub, user in enumerate(aggregate.records):
        key_index = user.partition_key_index
        if key_index >= n_keys:
            return malformed(f"user record {sub} has partition key index {key_index} "
                             f"of {n_keys}")
        explicit_hash_key = None
        if user.HasField("explicit_hash_key_index"):
            hash_index = user.explicit_hash_key_index
            if hash_index >= n_hash_keys:
                return malformed(f"user record {sub} has explicit hash key index {hash_index} "
                                 f"of {n_hash_keys}")
            explicit_hash_key = hash_keys[hash_index]
        out.append(Record(binary_data=user.data, partition_key=keys[key_index],
                          sequence_number=sequence_number, sub_sequence_number=sub,
                          approximate_arrival_timestamp=arrival_ms, shard_id=shard_id,
                          explicit_hash_key=explicit_hash_key, aggregated=True))
    if not out:
        return malformed("no user records")
    return out


def deaggregate(kinesis_records: Iterable[dict], shard_id: str) -> list[Record]:
    """User records from GetRecords' ``Records`` (boto3 shape), in shard order.

    Plain records get sub-sequence number 0 and ``aggregated=False``; the user records of an
    aggregate get their index in it and the partition key from the aggregate's own table
    (not the Kinesis record's key, which the KPL takes from the first user record).
    """
    out: list[Record] = []
    for raw in kinesis_records:
        data = raw["Data"]
        sequence_number = raw["SequenceNumber"]
        arrival_ms = epoch_ms(raw.get("ApproximateArrivalTimestamp"))
        if data[:_MAGIC_LEN] == MAGIC:  # the KPL magic (a plain record could carry it, rarely)
            users = _split(data, sequence_number, arrival_ms, shard_id)
            if users is not None:
                out.extend(users)
                continue
        out.append(Record(binary_data=data, partition_key=raw["PartitionKey"],
                          sequence_number=sequence_number, sub_sequence_number=0,
                          approximate_arrival_timestamp=arrival_ms, shard_id=shard_id,
                          explicit_hash_key=None, aggregated=False))
    return out


# -- writing -------------------------------------------------------------------------------------
def _varint_len(value: int) -> int:
    n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


def _field_len(payload_len: int) -> int:
    """A length-delimited protobuf field (tags 1-15 take one byte)."""
    return 1 + _varint_len(payload_len) + payload_len


class Aggregate:
    """User records bound for one shard, with the size of their KPL encoding kept exact."""

    __slots__ = ("shard_id", "keys", "hash_keys", "records", "body_bytes", "first_key",
                 "first_hash_key")

    def __init__(self, shard_id: str) -> None:
        self.shard_id = shard_id
        self.keys: dict[str, int] = {}
        self.hash_keys: dict[str, int] = {}
        self.records: list[tuple[int, int | None, bytes]] = []
        self.body_bytes = 0
        self.first_key = ""
        self.first_hash_key = 0

    def kinesis_bytes(self, body_bytes: int, first_key: str) -> int:
        """What Kinesis counts against the 1 MiB record limit: data + partition key."""
        return len(MAGIC) + body_bytes + DIGEST_SIZE + len(first_key.encode("utf-8"))

    def try_add(self, partition_key: str, key_bytes: bytes, explicit_hash_key: str | None,
                data: bytes, hash_key: int, max_bytes: int) -> bool:
        """Add one user record unless the aggregate would outgrow ``max_bytes``.

        The size is computed, not encoded: protobuf's length-delimited fields and varints,
        the key tables included (a test compares it with the real encoding).
        """
        key_index = self.keys.get(partition_key)
        grow = 0
        if key_index is None:
            grow += _field_len(len(key_bytes))
        record = 1 + _varint_len(len(self.keys) if key_index is None else key_index)
        record += _field_len(len(data))
        ehk_index = None
        if explicit_hash_key is not None:
            ehk_index = self.hash_keys.get(explicit_hash_key)
            if ehk_index is None:
                grow += _field_len(len(explicit_hash_key))  # ASCII digits: chars == bytes
            record += 1 + _varint_len(len(self.hash_keys) if ehk_index is None else ehk_index)
        grow += _field_len(record)
        first_key = self.first_key if self.records else partition_key
        if self.kinesis_bytes(self.body_bytes + grow, first_key) > max_bytes:
            return False
        if key_index is None:
            key_index = self.keys[partition_key] = len(self.keys)
        if explicit_hash_key is not None and ehk_index is None:
            ehk_index = self.hash_keys[explicit_hash_key] = len(self.hash_keys)
        if not self.records:
            self.first_key, self.first_hash_key = partition_key, hash_key
        self.records.append((key_index, ehk_index, data))
        self.body_bytes += grow
        return True

    def encode(self) -> bytes:
        message = messages_pb2.AggregatedRecord()
        message.partition_key_table.extend(self.keys)
        message.explicit_hash_key_table.extend(self.hash_keys)
        for key_index, ehk_index, data in self.records:
            record = message.records.add()
            record.partition_key_index = key_index
            if ehk_index is not None:
                record.explicit_hash_key_index = ehk_index
            record.data = data
        body = message.SerializeToString()
        return MAGIC + body + hashlib.md5(body).digest()
