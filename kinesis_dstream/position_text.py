"""Position text, one grammar wherever a user types a position.

``TRIM_HORIZON`` | ``EARLIEST`` (qubole's word for it) | ``LATEST`` |
``AT_TIMESTAMP <ISO 8601 time>`` (or ``AT_TIMESTAMP:<time>``) | ``SEQ`` | ``SEQ/SUB``, in any
case. A time without a zone is UTC, as Kinesis reads it. The SQL options' starting position,
the command line's ``--to`` and the properties files' timestamps all read here, so a value
copied from one place means the same in another; each caller says whether a sequence number
is a position it can start from, and puts its own option name into the error.
"""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass

from .records import AT_TIMESTAMP, LATEST, TRIM_HORIZON, ExtendedSequenceNumber, is_valid_sequence_number

SEQUENCE = "SEQUENCE"
EARLIEST = "EARLIEST"
_AT_TIMESTAMP = re.compile(rf"{AT_TIMESTAMP}(?::|\s+)(?P<time>.+)", re.IGNORECASE | re.DOTALL)


class TimeTextError(ValueError):
    """An ``AT_TIMESTAMP`` whose time cannot be read: said as such, not as an unknown word."""


@dataclass(frozen=True)
class PositionText:
    """A parsed position: ``kind`` is TRIM_HORIZON, LATEST, AT_TIMESTAMP or SEQUENCE."""

    kind: str
    timestamp: _dt.datetime | None = None          # AT_TIMESTAMP only (aware, UTC)
    position: ExtendedSequenceNumber | None = None  # SEQUENCE only


def iso_time(text: str) -> _dt.datetime:
    """An ISO 8601 time as an aware UTC datetime (no zone: UTC; ``Z`` accepted);
    TimeTextError naming the text otherwise."""
    raw = text.strip()
    try:
        moment = _dt.datetime.fromisoformat(re.sub(r"[Zz]$", "+00:00", raw))
    except ValueError:
        raise TimeTextError(f"{raw!r} is not an ISO 8601 time (e.g. 2026-11-25T18:00:00Z)") \
            from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.timezone.utc)
    return moment.astimezone(_dt.timezone.utc)


def parse_position_text(text: str, *, sequences: bool) -> PositionText:
    """``text`` in the grammar above; ValueError saying what is wrong. ``sequences``: whether
    ``SEQ`` and ``SEQ/SUB`` are accepted (a checkpoint's position, not a query's start)."""
    value = str(text).strip()
    word = value.upper()
    if word in (TRIM_HORIZON, LATEST, EARLIEST):
        return PositionText(TRIM_HORIZON if word == EARLIEST else word)
    timed = _AT_TIMESTAMP.fullmatch(value)
    if timed:
        return PositionText(AT_TIMESTAMP, timestamp=iso_time(timed.group("time")))
    if sequences:
        sequence, _, sub = value.partition("/")
        if is_valid_sequence_number(sequence) and (not sub or (sub.isascii() and sub.isdigit())):
            return PositionText(SEQUENCE, position=ExtendedSequenceNumber(sequence, int(sub or 0)))
    allowed = "TRIM_HORIZON, EARLIEST, LATEST, 'AT_TIMESTAMP <ISO 8601 time>'"
    if sequences:
        allowed += ", a sequence number or SEQUENCE/SUBSEQUENCE"
    raise ValueError(f"{text!r} is not a position: use {allowed}")
