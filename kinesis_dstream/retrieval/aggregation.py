"""KPL de-aggregation that never drops a record.

aws-kinesis-agg's ``iter_deaggregate_records`` prints an exception to stderr and drops the
records of an aggregate it cannot split, and builds a Lambda-style dict (base64 and all) per
user record. We parse the aggregate format ourselves with its protobuf messages instead:
it is faster, and a malformed aggregate (KPL magic present but bad checksum, bad protobuf,
truncated, out-of-range key index, no user records) is delivered whole as ONE plain record
with a warning naming the shard and sequence number, so a consumer sees it and can decide.

Format (amazon-kinesis-producer aggregation-format.md): MAGIC (4 bytes) + protobuf
``AggregatedRecord`` + MD5 of the protobuf (16 bytes).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import logging
from typing import Any, Iterable

from google.protobuf.message import DecodeError

from ..aws.kpl import DIGEST_SIZE, MAGIC, messages_pb2
from ..records import Record

log = logging.getLogger(__name__)

_MAGIC_LEN = len(MAGIC)
_MIN_AGGREGATE_LEN = _MAGIC_LEN + DIGEST_SIZE


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
    def malformed(why: str) -> None:
        log.warning("malformed KPL aggregate in shard %s at sequence number %s (%s, %d bytes): "
                    "delivered as one plain record", shard_id, sequence_number, why, len(data))

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
