"""Records and positions in a shard.

``Record`` has amazon-kclpy's attribute names (``binary_data``, ``data`` as base64,
``partition_key``, ``sequence_number``, ``sub_sequence_number``,
``approximate_arrival_timestamp`` in epoch milliseconds), so a kclpy record processor reads
our records unchanged. ``ExtendedSequenceNumber`` orders positions the way the KCL does:
sequence number first, then the sub-sequence inside a KPL aggregate; the sentinels
(TRIM_HORIZON, LATEST, AT_TIMESTAMP, SHARD_END) are checkpoint values too. ``SHARD_END`` is
the one position a finished shard is checkpointed at (``ExtendedSequenceNumber.SHARD_END``).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from functools import total_ordering

TRIM_HORIZON = "TRIM_HORIZON"
LATEST = "LATEST"
AT_TIMESTAMP = "AT_TIMESTAMP"
_SHARD_END = "SHARD_END"  # its text in the lease table; SHARD_END below is the position
SENTINELS = (TRIM_HORIZON, LATEST, AT_TIMESTAMP, _SHARD_END)


@dataclass(frozen=True)
class Record:
    binary_data: bytes
    partition_key: str
    sequence_number: str
    sub_sequence_number: int = 0
    approximate_arrival_timestamp: int = 0  # epoch milliseconds, as kclpy
    shard_id: str = ""
    explicit_hash_key: str | None = None
    aggregated: bool = False

    @property
    def data(self) -> str:
        """Base64 text, as amazon-kclpy's ``Record.data``."""
        return base64.b64encode(self.binary_data).decode("ascii")

    @property
    def extended_sequence_number(self) -> "ExtendedSequenceNumber":
        return ExtendedSequenceNumber(self.sequence_number, self.sub_sequence_number)

    def to_json_dict(self) -> dict:
        """The multilang protocol's record shape."""
        return {
            "action": "record",
            "data": self.data,
            "partitionKey": self.partition_key,
            "sequenceNumber": self.sequence_number,
            "subSequenceNumber": self.sub_sequence_number,
            "approximateArrivalTimestamp": self.approximate_arrival_timestamp,
        }


@total_ordering
@dataclass(frozen=True)
class ExtendedSequenceNumber:
    sequence_number: str
    sub_sequence_number: int = 0

    # Sentinels sort before every real position except SHARD_END, which sorts after.
    _ORDER = {TRIM_HORIZON: -3, AT_TIMESTAMP: -2, LATEST: -1}

    @property
    def is_sentinel(self) -> bool:
        return self.sequence_number in SENTINELS

    @property
    def is_shard_end(self) -> bool:
        return self.sequence_number == _SHARD_END

    def _key(self) -> tuple:
        if self.sequence_number == _SHARD_END:
            return (1, 0, 0)
        if self.sequence_number in self._ORDER:
            return (-1, self._ORDER[self.sequence_number], 0)
        return (0, int(self.sequence_number), self.sub_sequence_number)

    def __lt__(self, other: "ExtendedSequenceNumber") -> bool:
        return self._key() < other._key()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExtendedSequenceNumber):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        if self.is_sentinel:
            return self.sequence_number
        return f"{self.sequence_number}/{self.sub_sequence_number}"


ExtendedSequenceNumber.TRIM_HORIZON = ExtendedSequenceNumber(TRIM_HORIZON)  # type: ignore[attr-defined]
ExtendedSequenceNumber.LATEST = ExtendedSequenceNumber(LATEST)  # type: ignore[attr-defined]
ExtendedSequenceNumber.AT_TIMESTAMP = ExtendedSequenceNumber(AT_TIMESTAMP)  # type: ignore[attr-defined]
SHARD_END = ExtendedSequenceNumber(_SHARD_END)
ExtendedSequenceNumber.SHARD_END = SHARD_END  # type: ignore[attr-defined]


def is_valid_sequence_number(value: object) -> bool:
    """Kinesis sequence numbers are decimal strings of up to 128 ASCII digits.

    ``str.isdigit`` alone accepts "²" or Arabic-Indic digits, which ``int()`` rejects or
    which no Kinesis API accepts.
    """
    return (isinstance(value, str) and value.isascii() and value.isdigit()
            and 0 < len(value) <= 128)


@dataclass
class GetRecordsResult:
    """One GetRecords answer, de-aggregated; ``shard_end`` when the iterator ran out."""

    records: list[Record] = field(default_factory=list)
    millis_behind_latest: int | None = None
    shard_end: bool = False
    child_shard_ids: list[str] = field(default_factory=list)
    kinesis_records: int = 0  # in the answer, before de-aggregation and the dropped start

    def is_full_page(self, limit: int) -> bool:
        """Kinesis sent as many records as asked for, so more are waiting: counted in Kinesis
        records, since de-aggregation adds user records and the first page after an
        AT_SEQUENCE_NUMBER start drops the record it starts at."""
        return self.kinesis_records >= limit

    def at_tip(self, limit: int) -> bool:
        """Nothing more to read now: a short page and no lag. The one paging rule of the
        worker's shard consumer (idle until the next read) and the executors' readers (stop
        the batch's read here)."""
        return not self.is_full_page(limit) and not self.millis_behind_latest
