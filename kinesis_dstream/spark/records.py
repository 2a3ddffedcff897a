"""What a ``messageHandler`` receives: the whole Kinesis record, as Scala's handlers do."""
from __future__ import annotations

from typing import NamedTuple


class KinesisRecord(NamedTuple):
    data: bytes
    partition_key: str
    sequence_number: str
    sub_sequence_number: int
    approximate_arrival_timestamp: int  # epoch milliseconds
    shard_id: str
