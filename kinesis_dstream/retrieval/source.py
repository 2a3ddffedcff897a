"""The record source: where a shard's records come from, whatever brings them.

Every reader of a shard (the executors' read loop, the worker's shard consumer) asks a
``RecordSource`` for the next records and never learns how they came, as the KCL's callers
see only its ``RecordsPublisher``. Polling (``KinesisDataFetcher``: GetShardIterator, then
GetRecords) and push (``fanout``'s ``FanOutRecordsPublisher``: SubscribeToShard) are the two
sources; ``open_source`` is where a caller gets one, so no caller knows which it reads.

How the push source fits:
- ``initialize``/``resume`` subscribe at the start (AT_SEQUENCE_NUMBER and the dropped
  records at or before a checkpoint, as polling does; AT_TIMESTAMP, TRIM_HORIZON, LATEST).
  A polling iterator means nothing to it: ``resume`` subscribes as ``initialize`` does, and
  ``iterator`` stays None, so callers hand no iterator on.
- A subscription thread fills a bounded buffer of events; ``get_records`` takes the next
  one (waiting a little when there is none, and answering with an empty result at the tip),
  so a slow caller stops the reads instead of growing memory.
- A subscription ends after 5 minutes or on an error: the source resubscribes
  AFTER_SEQUENCE_NUMBER the last event's ContinuationSequenceNumber, pacing refusals (the
  5 s takeover rule, throttles) with the same errors polling raises, so the callers' pacer
  waits them out.
- At a shard's end an event carries a null continuation and ChildShards: ``get_records``
  returns ``shard_end`` with ``child_shard_ids``, as a polling page without NextShardIterator.
- ``close`` cancels the subscription (polling holds nothing to close).
- ``pushes`` is true: records come when they are pushed, so a caller never pauses between
  reads as a poller does at the tip.
"""
from __future__ import annotations

from typing import Protocol

from ..aws.kinesis import KinesisClient
from ..config import ConsumerConfig
from ..records import ExtendedSequenceNumber, GetRecordsResult
from .data_loss import TrimmedRange
from .fanout import FanOutRecordsPublisher
from .polling import KinesisDataFetcher


class RecordSource(Protocol):
    """One shard's records from a start position, in order; no sleeping, no swallowed error.

    An error comes back as our error class (throttling, transient, permanent) with the
    position kept: calling ``get_records`` again goes on where the last result ended.
    """

    shard_id: str
    shard_iterator_calls: int  # GetShardIterator calls made (polling only; 0 for push)
    pushes: bool  # records are pushed (a subscription): no pause between reads
    data_lost: TrimmedRange | None  # records found trimmed before the start, if any

    @property
    def iterator(self) -> str | None:
        """A position token the next read can ``resume`` from (polling's NextShardIterator)."""

    def initialize(self, checkpoint: ExtendedSequenceNumber) -> None:
        """Start after ``checkpoint`` (or at an initial-position sentinel)."""

    def resume(self, start: ExtendedSequenceNumber, iterator: str) -> None:
        """Start after ``start`` with a token an earlier read handed back at it."""

    def get_records(self) -> GetRecordsResult:
        """The next records; ``shard_end`` (with ``child_shard_ids``) once the shard is read."""

    def close(self) -> None:
        """Let go of what the source holds (a subscription); reading stops here."""


def open_source(kinesis: KinesisClient, config: ConsumerConfig, shard_id: str, *,
                start_timestamp: float | None = None,
                reports_data_loss: bool = False,
                consumer_arn: str | None = None) -> RecordSource:
    """The record source ``config`` asks for, for one shard: fan-out for a ``FANOUT``
    configuration given its registered consumer (``consumer_arn``), else polling."""
    if config.retrieval_mode == "FANOUT" and consumer_arn is not None:
        return FanOutRecordsPublisher(kinesis, config, shard_id, consumer_arn,
                                      start_timestamp=start_timestamp)
    return KinesisDataFetcher(kinesis, config, shard_id, reports_data_loss=reports_data_loss,
                              start_timestamp=start_timestamp)
