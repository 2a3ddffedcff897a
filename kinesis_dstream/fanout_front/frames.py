"""The AWS event-stream message format SubscribeToShard answers in, and HTTP/1.1 chunks.

A message is a 12-byte prelude (total length, headers length, CRC32 of those 8 bytes), the
headers (name length u8, name, type 7 = string with a u16 length, value), the payload and a
CRC32 of everything before it. botocore's ``EventStreamBuffer`` decodes it; the tests check
these bytes with it, so the two cannot drift apart.
"""
from __future__ import annotations

import json
import struct
import zlib
from typing import Any

_STRING = 7
_PRELUDE_LENGTH = 12
_CRC_LENGTH = 4
EVENT_STREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with string headers, in the order given."""
    encoded = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode("utf-8"), value.encode("utf-8")
        if len(raw_name) > 255 or len(raw_value) > 0xFFFF:
            raise ValueError(f"header {name!r} too long for an event-stream message")
        encoded += (struct.pack(">B", len(raw_name)) + raw_name
                    + struct.pack(">BH", _STRING, len(raw_value)) + raw_value)
    total = _PRELUDE_LENGTH + len(encoded) + len(payload) + _CRC_LENGTH
    lengths = struct.pack(">II", total, len(encoded))
    prelude = lengths + struct.pack(">I", zlib.crc32(lengths))
    message = prelude + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))


def event(event_type: str, body: dict[str, Any]) -> bytes:
    """An event message (``initial-response``, ``SubscribeToShardEvent``) with a JSON body."""
    return encode_message({":message-type": "event", ":event-type": event_type,
                           ":content-type": "application/json"},
                          json.dumps(body, separators=(",", ":")).encode())


def exception(exception_type: str, message: str) -> bytes:
    """An exception message: botocore raises it as an ``EventStreamError`` mid-iteration."""
    return encode_message({":message-type": "exception", ":exception-type": exception_type,
                           ":content-type": "application/json"},
                          json.dumps({"message": message}).encode())


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk; ``chunk(b"")`` is the last one, which ends the body."""
    return f"{len(data):X}\r\n".encode() + data + b"\r\n"
