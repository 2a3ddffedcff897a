"""What a Kinesis DStream's RDDs hold, made in the task that reads the records.

The read task turns each record into its value (``messageHandler``, the decoder, or the
bytes) before Spark caches the batch: the cache and every output operation then handle
the values, never a record object per value (pickling a ``KinesisRecord`` and loading it
again costs far more than a decoded string does).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, NamedTuple

from ..records import Record

RecordValues = Callable[[list[Record]], Iterable[Any]]


class KinesisRecord(NamedTuple):
    """What a ``messageHandler`` receives: the whole Kinesis record, as Scala's handlers do."""

    data: bytes
    partition_key: str
    sequence_number: str
    sub_sequence_number: int
    approximate_arrival_timestamp: int  # epoch milliseconds
    shard_id: str


def record_values(decoder: Callable[[bytes], Any] | None,
                  message_handler: Callable[[KinesisRecord], Any] | None) -> RecordValues:
    """The values of a read range's records, as ``createStream``'s arguments ask."""
    if message_handler is not None:
        def handled(records: list[Record]) -> Iterator[Any]:
            for r in records:
                yield message_handler(KinesisRecord(
                    r.binary_data, r.partition_key, r.sequence_number, r.sub_sequence_number,
                    r.approximate_arrival_timestamp, r.shard_id))
        return handled
    if decoder is None:
        return lambda records: (r.binary_data for r in records)
    return naming_decoder(decoder)


def naming_decoder(decoder: Callable[[bytes], Any]) -> RecordValues:
    """Decode each record; an undecodable one fails its batch naming shard and position.

    The batch then fails, so nothing in it is checkpointed and the record is read again after
    a fix and restart; without the wrapper Spark would report a bare UnicodeDecodeError.
    """
    name = getattr(decoder, "__name__", repr(decoder))

    def decode(records: list[Record]) -> Iterator[Any]:
        for record in records:
            try:
                value = decoder(record.binary_data)
            except Exception as exc:
                raise ValueError(
                    f"{name} cannot decode the record at {record.sequence_number}/"
                    f"{record.sub_sequence_number} of shard {record.shard_id} "
                    f"({record.binary_data[:32]!r}...): {type(exc).__name__}: {exc}; the batch "
                    f"failed, so this shard is not checkpointed past it") from exc
            yield value

    return decode
