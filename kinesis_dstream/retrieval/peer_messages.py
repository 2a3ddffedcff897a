"""The two messages executors exchange for a held subscription: fixed fields, no pickle.

A request names a stream (the range's stream key: the serving process looks its config up,
no config is ever sent), a shard, a start and a read's bounds; a reply carries a
``Reading``'s counts and its records' fields as JSON, the records' data after it as raw
bytes. Every field is checked for its type on arrival, and a message is refused by its
announced length before it is read: a peer can name nothing to call, and can make this
process hold no more than ``MAX_REPLY_BYTES``.

A frame is a 4-byte big-endian length, a JSON header of that length, then (a reply) the
body the header announces.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from ..records import ExtendedSequenceNumber, Record
from .data_loss import TrimmedRange
from .fetch_pace import FetchPace
from .read_loop import Reading

MAX_HEADER_BYTES = 16 * 1024 * 1024  # a reply's header: ~100 bytes a record, 10,000 records
MAX_REQUEST_BYTES = 16 * 1024
# A reading's records: a shard serves 2 MiB/s, so this holds minutes of one shard. A bigger
# reading is not sent: the asking task reads its range itself.
MAX_REPLY_BYTES = 256 * 1024 * 1024
_LENGTH = struct.Struct("!I")


class MalformedMessage(ValueError):
    """A peer's message that does not have the fields and types it must."""


@dataclass(frozen=True)
class ReadRequest:
    """Read ``shard_id`` of the stream ``stream_key`` after ``start``, within the bounds."""

    stream_key: str
    shard_id: str
    start: ExtendedSequenceNumber
    timestamp: float | None
    max_records: int = 0
    time_budget_s: float = 0.0
    max_bytes: int = 0
    pace: FetchPace | None = None

    def bounds(self) -> dict[str, Any]:
        """The bounds as ``read_loop.read`` takes them."""
        return {"max_records": self.max_records, "time_budget_s": self.time_budget_s,
                "max_bytes": self.max_bytes, "pace": self.pace}


def frame(header: dict[str, Any]) -> bytes:
    data = json.dumps(header, separators=(",", ":")).encode()
    return _LENGTH.pack(len(data)) + data


def header_length(prefix: bytes, limit: int) -> int:
    """A frame's announced header length, refused above ``limit`` before it is read."""
    (length,) = _LENGTH.unpack(prefix)
    if length > limit:
        raise MalformedMessage(f"a header of {length} bytes (at most {limit})")
    return length


def _field(header: dict[str, Any], name: str, kind: type | tuple[type, ...],
           optional: bool = False) -> Any:
    value = header.get(name)
    if value is None and optional:
        return None
    # bool is an int in Python: a count must not be True
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise MalformedMessage(f"field {name!r}: {type(value).__name__}")
    return value


def _number(header: dict[str, Any], name: str, optional: bool = False) -> Any:
    value = _field(header, name, (int, float), optional)
    return None if value is None else float(value)


def _position(value: Any, name: str) -> ExtendedSequenceNumber:
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], int) and not isinstance(value[1], bool)):
        raise MalformedMessage(f"field {name!r}: not a position")
    return ExtendedSequenceNumber(value[0], value[1])


def _encode_position(position: ExtendedSequenceNumber) -> list[Any]:
    return [position.sequence_number, position.sub_sequence_number]


def encode_request(request: ReadRequest) -> bytes:
    pace = request.pace or FetchPace()
    return frame({"stream": request.stream_key, "shard": request.shard_id,
                  "start": _encode_position(request.start), "timestamp": request.timestamp,
                  "max_records": request.max_records, "time_budget_s": request.time_budget_s,
                  "max_bytes": request.max_bytes, "max_bytes_per_s": pace.max_bytes_per_s,
                  "min_fetch_period_s": pace.min_period_s})


def decode_request(data: bytes) -> ReadRequest:
    header = _object(data)
    pace = FetchPace(_number(header, "max_bytes_per_s"), _number(header, "min_fetch_period_s"))
    return ReadRequest(
        _field(header, "stream", str), _field(header, "shard", str),
        _position(header.get("start"), "start"), _number(header, "timestamp", optional=True),
        _field(header, "max_records", int), _number(header, "time_budget_s"),
        _field(header, "max_bytes", int), pace if pace.paces else None)


def _object(data: bytes) -> dict[str, Any]:
    try:
        header = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedMessage(f"not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise MalformedMessage("not a JSON object")
    return header


# A Reading's scalar fields and their types (its records and ``lost`` are encoded apart).
_READING_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "millis_behind_latest": (int, True), "calls": (int, False), "served": (int, False),
    "seconds": ((int, float), False), "shard_end": (bool, False),
    "iterator": (str, True), "iterator_time": ((int, float), False),
    "shard_iterator_calls": (int, False), "throttled": (int, False),
    "faults": (int, False), "more_left": (bool, False), "bytes_read": (int, False),
    "waited_s": ((int, float), False), "first_seen": (str, True),
    "ready_at": ((int, float), False), "ahead": (bool, False)}


def encode_reply(reading: Reading) -> tuple[bytes, list[bytes]]:
    """A reading as its framed header and the records' data (sent after it)."""
    header: dict[str, Any] = {name: getattr(reading, name) for name in _READING_FIELDS}
    header["status"] = "ok"
    header["child_shard_ids"] = list(reading.child_shard_ids)
    header["lost"] = None if reading.lost is None else {
        "after": _encode_position(reading.lost.after), "first": reading.lost.first}
    header["records"] = [[len(r.binary_data), r.partition_key, r.sequence_number,
                          r.sub_sequence_number, r.approximate_arrival_timestamp,
                          r.explicit_hash_key, r.aggregated] for r in reading.records]
    return frame(header), [r.binary_data for r in reading.records]


def encode_failure(reason: str) -> bytes:
    return frame({"status": "failed", "reason": reason[:500]})


def decode_reply_header(data: bytes) -> tuple[dict[str, Any], int]:
    """A reply's header and how many bytes of record data follow it (refused above
    ``MAX_REPLY_BYTES`` before any is read)."""
    header = _object(data)
    if header.get("status") != "ok":
        raise MalformedMessage(f"the peer could not read it: {header.get('reason')!r}")
    records = _field(header, "records", list)
    body = 0
    for entry in records:
        if not (isinstance(entry, list) and len(entry) == 7 and isinstance(entry[0], int)
                and not isinstance(entry[0], bool) and entry[0] >= 0):
            raise MalformedMessage("field 'records': not a record")
        body += entry[0]
    if body > MAX_REPLY_BYTES:
        raise MalformedMessage(f"{body} bytes of records (at most {MAX_REPLY_BYTES})")
    return header, body


def decode_reading(header: dict[str, Any], body: bytes, shard_id: str) -> Reading:
    """The reading a checked header and its body describe (records of ``shard_id``)."""
    fields = {name: _field(header, name, kind, optional)
              for name, (kind, optional) in _READING_FIELDS.items()}
    children = _field(header, "child_shard_ids", list)
    if not all(isinstance(c, str) for c in children):
        raise MalformedMessage("field 'child_shard_ids': not shard ids")
    lost_field = _field(header, "lost", dict, optional=True)
    lost = None
    if lost_field is not None:
        lost = TrimmedRange(shard_id, _position(lost_field.get("after"), "lost.after"),
                            _field(lost_field, "first", str, optional=True))
    records, offset = [], 0
    for length, key, sequence, sub, arrival, hash_key, aggregated in header["records"]:
        if not (isinstance(key, str) and isinstance(sequence, str) and isinstance(sub, int)
                and isinstance(arrival, int) and isinstance(hash_key, (str, type(None)))
                and isinstance(aggregated, bool)):
            raise MalformedMessage("field 'records': not a record")
        records.append(Record(body[offset:offset + length], key, sequence, sub, arrival,
                              shard_id, hash_key, aggregated))
        offset += length
    return Reading(records=records, child_shard_ids=tuple(children), lost=lost, **fields)
