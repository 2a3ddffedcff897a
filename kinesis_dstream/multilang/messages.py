"""The multilang protocol's messages: one class per action, decoded through one table.

Names and fields are the Java MultiLangDaemon's (``software.amazon.kinesis.multilang.messages``),
which is what amazon-kclpy's ``messages.py`` decodes on the child's side. Both directions
are here so a fake child in the tests speaks through the same code.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from ..errors import KinesisDStreamError


class ProtocolError(KinesisDStreamError):
    """The child broke the protocol: it exited, hung, or said something we cannot use."""


class MalformedMessageError(ProtocolError):
    """A line from the child is not a protocol message (bad JSON, unknown action, bad field)."""


@dataclass(frozen=True)
class Message:
    action: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action}

    def to_line(self) -> str:
        """One JSON object and a newline: kclpy reads with readline() and parses every
        line it gets, so no blank lines may be written to the child."""
        return json.dumps(self.to_dict(), separators=(",", ":")) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Message":
        return cls()


def _field(data: Mapping[str, Any], name: str, types: tuple, action: str,
           required: bool = True) -> Any:
    if name not in data:
        if required:
            raise MalformedMessageError(f"{action} message lacks field {name!r}: {dict(data)}")
        return None
    value = data[name]
    if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
        raise MalformedMessageError(
            f"{action} message: field {name!r} has a bad value {value!r}")
    return value


# ---------------------------------------------------------------- daemon -> child

@dataclass(frozen=True)
class InitializeMessage(Message):
    action: ClassVar[str] = "initialize"
    shard_id: str = ""
    sequence_number: str | None = None
    sub_sequence_number: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "shardId": self.shard_id,
                "sequenceNumber": self.sequence_number,
                "subSequenceNumber": self.sub_sequence_number}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "InitializeMessage":
        return cls(_field(data, "shardId", (str,), cls.action),
                   _field(data, "sequenceNumber", (str,), cls.action, required=False),
                   _field(data, "subSequenceNumber", (int,), cls.action, required=False))


@dataclass(frozen=True)
class ProcessRecordsMessage(Message):
    action: ClassVar[str] = "processRecords"
    # Record dicts in the protocol's shape (Record.to_json_dict()).
    records: Sequence[Mapping[str, Any]] = field(default=())
    millis_behind_latest: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "records": list(self.records),
                "millisBehindLatest": self.millis_behind_latest}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProcessRecordsMessage":
        records = _field(data, "records", (list,), cls.action)
        return cls(tuple(records),
                   _field(data, "millisBehindLatest", (int,), cls.action, required=False))


@dataclass(frozen=True)
class LeaseLostMessage(Message):
    action: ClassVar[str] = "leaseLost"


@dataclass(frozen=True)
class ShardEndedMessage(Message):
    action: ClassVar[str] = "shardEnded"


@dataclass(frozen=True)
class ShutdownRequestedMessage(Message):
    action: ClassVar[str] = "shutdownRequested"


# ---------------------------------------------------------------- both ways

@dataclass(frozen=True)
class CheckpointMessage(Message):
    """From the child: a request (``sequence_number`` None = last delivered record).
    To the child: the reply, with ``error`` the KCL exception name or None."""

    action: ClassVar[str] = "checkpoint"
    sequence_number: str | None = None
    sub_sequence_number: int | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "sequenceNumber": self.sequence_number,
                "subSequenceNumber": self.sub_sequence_number, "error": self.error}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CheckpointMessage":
        # Jackson turns a numeric sequence number into its string; so do we. A value of
        # a wrong type is left for the checkpointer to refuse (IllegalArgumentException).
        seq: Any = data.get("sequenceNumber")
        if isinstance(seq, int) and not isinstance(seq, bool):
            seq = str(seq)
        error = data.get("error")
        return cls(seq, data.get("subSequenceNumber"), error if isinstance(error, str) else None)


# ---------------------------------------------------------------- child -> daemon

@dataclass(frozen=True)
class StatusMessage(Message):
    action: ClassVar[str] = "status"
    response_for: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "responseFor": self.response_for}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StatusMessage":
        return cls(_field(data, "responseFor", (str,), cls.action))


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.action: cls for cls in (
        InitializeMessage, ProcessRecordsMessage, LeaseLostMessage, ShardEndedMessage,
        ShutdownRequestedMessage, CheckpointMessage, StatusMessage)
}


def decode_message(line: str) -> Message:
    """Parse one line; raises MalformedMessageError saying what is wrong with it."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise MalformedMessageError(f"not JSON ({exc}): {line.strip()[:200]!r}") from None
    if not isinstance(data, dict):
        raise MalformedMessageError(f"not a JSON object: {line.strip()[:200]!r}")
    action = data.get("action")
    message_type = MESSAGE_TYPES.get(action) if isinstance(action, str) else None
    if message_type is None:
        raise MalformedMessageError(
            f"unknown action {action!r} (known: {', '.join(MESSAGE_TYPES)}): {line.strip()[:200]!r}")
    return message_type.from_dict(data)
