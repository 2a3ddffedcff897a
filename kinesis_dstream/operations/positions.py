"""Positions an operator types (``--to``) and lease keys, parsed without any I/O.

A checkpoint says which record was processed last: reading resumes at the first record after
it, sub-records of a KPL aggregate included (``SEQ/SUB``). ``--to SEQ`` and ``--to SEQ/SUB``
write exactly that, so a value copied from ``leases status`` puts a shard back where it was.
``AT_TIMESTAMP:<time>`` is resolved against the shard when the reset runs (see ``reset``):
the table's AT_TIMESTAMP sentinel carries no time, and each worker would read it with its
own configured timestamp.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from ..aws.stream_identifier import parse_lease_key
from ..records import AT_TIMESTAMP, LATEST, TRIM_HORIZON, ExtendedSequenceNumber, is_valid_sequence_number
from .connection import BadInput

SEQUENCE = "SEQUENCE"


@dataclass(frozen=True)
class Target:
    """Where ``leases reset --to`` sends a shard."""

    kind: str  # TRIM_HORIZON, LATEST, AT_TIMESTAMP or SEQUENCE
    position: ExtendedSequenceNumber | None = None  # SEQUENCE only
    timestamp: _dt.datetime | None = None           # AT_TIMESTAMP only (aware, UTC)

    def __str__(self) -> str:
        if self.kind == AT_TIMESTAMP:
            assert self.timestamp is not None
            return f"AT_TIMESTAMP:{self.timestamp.isoformat()}"
        return str(self.position) if self.kind == SEQUENCE else self.kind


def parse_position(text: str) -> Target:
    """TRIM_HORIZON | LATEST | AT_TIMESTAMP:<ISO 8601> | SEQ | SEQ/SUB, or BadInput saying why."""
    value = text.strip()
    if value.upper() in (TRIM_HORIZON, LATEST):
        return Target(value.upper())
    if value.upper().startswith(AT_TIMESTAMP + ":"):
        moment = value[len(AT_TIMESTAMP) + 1:]
        try:
            when = _dt.datetime.fromisoformat(moment.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise BadInput(f"--to {text!r}: {moment!r} is not an ISO 8601 time "
                           "(e.g. 2026-11-25T18:00:00Z)") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=_dt.timezone.utc)  # no zone given: UTC, as Kinesis
        return Target(AT_TIMESTAMP, timestamp=when.astimezone(_dt.timezone.utc))
    sequence, _, sub = value.partition("/")
    if is_valid_sequence_number(sequence) and (not sub or (sub.isascii() and sub.isdigit())):
        return Target(SEQUENCE, position=ExtendedSequenceNumber(sequence, int(sub or 0)))
    raise BadInput(f"--to {text!r} is not a position: use TRIM_HORIZON, LATEST, "
                   "AT_TIMESTAMP:<ISO 8601 time>, a sequence number or SEQUENCE/SUBSEQUENCE")


def split_lease_key(lease_key: str) -> tuple[str | None, str]:
    """(stream, shard id) of a lease key: the KCL's multi-stream keys are
    ``account:stream:creationEpoch:shardId``; a single-stream key is the shard id alone."""
    parsed = parse_lease_key(lease_key)
    return (None, lease_key) if parsed is None else (parsed[0].stream_name, parsed[1])
