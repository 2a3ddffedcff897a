"""Positions an operator types (``--to``) and lease keys, parsed without any I/O.

A checkpoint says which record was processed last: reading resumes at the first record after
it, sub-records of a KPL aggregate included (``SEQ/SUB``). ``--to SEQ`` and ``--to SEQ/SUB``
write exactly that, so a value copied from ``leases status`` puts a shard back where it was.
The grammar is ``position_text``'s, the SQL options' too. ``AT_TIMESTAMP:<time>`` is
resolved against the shard when the reset runs (see ``reset``): the table's AT_TIMESTAMP
sentinel carries no time, and each worker would read it with its own configured timestamp.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from ..aws.stream_identifier import parse_lease_key
from ..position_text import SEQUENCE, parse_position_text
from ..records import AT_TIMESTAMP, ExtendedSequenceNumber
from .connection import BadInput


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
    """``position_text``'s grammar, sequence numbers included, or BadInput saying why."""
    try:
        parsed = parse_position_text(text, sequences=True)
    except ValueError as exc:
        raise BadInput(f"--to: {exc}") from None
    return Target(parsed.kind, position=parsed.position, timestamp=parsed.timestamp)


def split_lease_key(lease_key: str) -> tuple[str | None, str]:
    """(stream, shard id) of a lease key: the KCL's multi-stream keys are
    ``account:stream:creationEpoch:shardId``; a single-stream key is the shard id alone."""
    parsed = parse_lease_key(lease_key)
    return (None, lease_key) if parsed is None else (parsed[0].stream_name, parsed[1])
