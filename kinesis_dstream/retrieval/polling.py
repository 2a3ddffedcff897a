"""KinesisDataFetcher: the polling record source (the KCL's role): one shard's iterator,
GetRecords and de-aggregation.

A checkpoint inside a KPL aggregate is no shard iterator, so, as the KCL does, we read AT its
sequence number and drop the user records at or before it; an expired iterator is re-made the
same way. The fetcher never sleeps and never swallows an error: the caller waits and retries.

A start older than the retention is either refused by GetShardIterator or silently moved to
the oldest record held; either way the first record is later than the start. A refusal is told
from others by its error code and what TRIM_HORIZON holds, never by the message. With
``reports_data_loss`` a trimmed range goes to ``report_data_loss``; others read ``data_lost``.
"""
from __future__ import annotations

import logging

from ..aws.kinesis import KinesisClient
from ..aws.kpl import deaggregate
from ..config import ConsumerConfig
from ..errors import ConfigurationError, ExpiredIteratorError
from ..records import (
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    GetRecordsResult,
)
from .data_loss import TrimmedRange, report_data_loss
from .model import StartingPosition, records_after, shard_name

log = logging.getLogger(__name__)

# Expired iterators re-created within one get_records before the expiry is raised.
MAX_EXPIRIES_IN_A_ROW = 3


class KinesisDataFetcher:
    """Reads one shard from a start position; call ``initialize`` once, then ``get_records``.

    An AT_TIMESTAMP start reads from ``start_timestamp``, else from the configuration's
    ``initial_position_timestamp``.
    """

    pushes = False  # a poller: at the tip, the caller pauses before the next read

    def __init__(self, kinesis: KinesisClient, config: ConsumerConfig, shard_id: str, *,
                 reports_data_loss: bool = False, start_timestamp: float | None = None) -> None:
        self._kinesis = kinesis
        self._timestamp = (start_timestamp if start_timestamp is not None
                           else config.initial_position_timestamp)
        self._reports_data_loss = reports_data_loss
        # The records this fetcher found trimmed, for a caller that reports them itself.
        self.data_lost: TrimmedRange | None = None
        # A start older than the trim horizon: the sequence number an AT iterator was asked
        # for (the first record must be it), or a start refused and replaced by TRIM_HORIZON.
        self._expected_first: ExtendedSequenceNumber | None = None
        self._refused_start: ExtendedSequenceNumber | None = None
        self._refusal: ConfigurationError | None = None
        self._config = config
        self.shard_id = shard_id
        self.name = shard_name(config.stream_name, shard_id)  # as messages name it
        self._start: ExtendedSequenceNumber | None = None
        self._iterator: str | None = None
        # User records at or before this position are dropped (a checkpoint, or what was
        # delivered before an iterator had to be re-created). None once passed.
        self._skip_through: ExtendedSequenceNumber | None = None
        self._last_delivered: ExtendedSequenceNumber | None = None
        self._millis_behind_latest: int | None = None
        self._shard_end = False
        self._child_shard_ids: list[str] = []
        self.shard_iterator_calls = 0  # GetShardIterator: 5 a second per shard for a whole account
        # GetRecords' Limit: the config's, or a reading's smaller record cap while it reads.
        self.limit = config.max_records

    @property
    def iterator(self) -> str | None:
        """The iterator the next ``get_records`` reads with (Kinesis' NextShardIterator)."""
        return self._iterator

    @property
    def last_delivered(self) -> ExtendedSequenceNumber | None:
        return self._last_delivered

    @property
    def millis_behind_latest(self) -> int | None:
        return self._millis_behind_latest

    @property
    def shard_end(self) -> bool:
        return self._shard_end

    @property
    def child_shard_ids(self) -> list[str]:
        return list(self._child_shard_ids)

    def initialize(self, checkpoint: ExtendedSequenceNumber) -> None:
        """Position the fetcher at a lease's checkpoint (or the initial position sentinel)."""
        self._start = checkpoint
        self._last_delivered = None
        self._shard_end = False
        self._child_shard_ids = []
        if checkpoint.is_shard_end:
            self._shard_end = True
            self._iterator = None
            return
        self._iterator = self._iterator_at(checkpoint)
        self._skip_through = None if checkpoint.is_sentinel else checkpoint

    def resume(self, start: ExtendedSequenceNumber, iterator: str) -> None:
        """Position the fetcher at ``start`` with an iterator that already points right after
        it (the NextShardIterator of the read that ended there): no GetShardIterator call.

        An iterator lives 5 minutes and GetShardIterator is limited to 5 calls a second per
        shard for the whole account, so a read that goes on where the last one stopped
        reuses its iterator, as a KCL shard consumer does for the life of its lease. Should
        it have expired, ``get_records`` re-creates it from ``start``.
        """
        self._start = start
        self._last_delivered = None
        self._shard_end = False
        self._child_shard_ids = []
        self._iterator = iterator
        self._skip_through = None
        self._expected_first = self._refused_start = self._refusal = None

    def close(self) -> None:
        """Nothing to let go of: an iterator needs no closing."""

    def _iterator_at(self, position: ExtendedSequenceNumber) -> str:
        self.shard_iterator_calls += 1
        self._expected_first = self._refused_start = self._refusal = None
        start = StartingPosition.at(position, self._timestamp, self.name)
        if start.sequence_number is None:
            return self._kinesis.get_shard_iterator(self.shard_id, start.type,
                                                    timestamp=start.timestamp)
        try:
            iterator = self._kinesis.get_shard_iterator(
                self.shard_id, "AT_SEQUENCE_NUMBER", sequence_number=position.sequence_number)
        except ConfigurationError as exc:
            if exc.code != "InvalidArgumentException":
                raise
            log.info("%s: Kinesis refused %s (%s); reading from TRIM_HORIZON to see "
                     "whether it was trimmed", self.name, position, exc)
            self.shard_iterator_calls += 1
            iterator = self._kinesis.get_shard_iterator(self.shard_id, TRIM_HORIZON)
            self._refused_start, self._refusal = position, exc
            return iterator
        self._expected_first = position
        return iterator

    def _check_trimmed(self, kinesis_records: list, at_tip: bool) -> None:
        """After a fresh iterator at a sequence number: were records trimmed before it?"""
        start = self._expected_first or self._refused_start
        if start is None:
            return
        if kinesis_records:
            first = str(kinesis_records[0]["SequenceNumber"])
            trimmed = int(first) > int(start.sequence_number)
            if self._refusal is not None and not trimmed:
                raise self._refusal  # Kinesis holds the start: refused for another reason
        elif at_tip and self._refused_start is not None:
            first, trimmed = None, True
        else:
            return  # an empty page on the way: the next one tells
        if trimmed:
            self.data_lost = TrimmedRange(self.shard_id, start, first)
            if self._reports_data_loss:
                # Before the fetcher moves on: if it raises, a call again raises again.
                report_data_loss(self._config, self.data_lost)
        self._expected_first = self._refused_start = self._refusal = None

    def _restart_iterator(self) -> None:
        """A fresh iterator right after what was delivered, or at the start if nothing was."""
        assert self._start is not None
        if self._last_delivered is None:
            log.info("%s: iterator expired before any record; re-creating it at %s",
                     self.name, self._start)
            self.initialize(self._start)
            return
        log.info("%s: iterator expired; re-creating it after %s",
                 self.name, self._last_delivered)
        # AT the last delivered sequence number, then skip through it: correct for a plain
        # record and for a partly delivered aggregate alike.
        self._iterator = self._iterator_at(self._last_delivered)
        self._skip_through = self._last_delivered

    def get_records(self) -> GetRecordsResult:
        """The next batch of user records; ``shard_end`` once the shard is closed and read."""
        if self._start is None:
            raise RuntimeError(f"fetcher for {self.name} used before initialize()")
        if self._shard_end:
            return GetRecordsResult(shard_end=True, child_shard_ids=list(self._child_shard_ids),
                                    millis_behind_latest=self._millis_behind_latest)
        assert self._iterator is not None
        expiries = 0
        while True:
            try:
                answer = self._kinesis.get_records(self._iterator, self.limit,
                                                   shard_id=self.shard_id)
                break
            except ExpiredIteratorError:
                # A fresh iterator can expire too (a long stall between GetShardIterator and
                # this call): each expiry gets a new one, up to a bound that stops a loop.
                expiries += 1
                if expiries > MAX_EXPIRIES_IN_A_ROW:
                    raise
                self._restart_iterator()
                if self._shard_end:
                    return GetRecordsResult(shard_end=True)
                assert self._iterator is not None
        kinesis_records = answer.get("Records", ())
        self._check_trimmed(kinesis_records, answer.get("NextShardIterator") is None
                            or not answer.get("MillisBehindLatest"))
        records = deaggregate(kinesis_records, self.shard_id)
        if self._skip_through is not None and records:
            records = records_after(records, self._skip_through)
            if records:
                self._skip_through = None
        if records:
            self._last_delivered = records[-1].extended_sequence_number
        self._millis_behind_latest = answer.get("MillisBehindLatest")
        next_iterator = answer.get("NextShardIterator")
        if next_iterator is None:
            self._shard_end = True
            self._iterator = None
            self._child_shard_ids = [c["ShardId"] for c in answer.get("ChildShards") or ()]
            log.info("%s reached its end; children %s", self.name,
                     self._child_shard_ids or "not reported")
        else:
            self._iterator = next_iterator
        return GetRecordsResult(records=records,
                                millis_behind_latest=self._millis_behind_latest,
                                shard_end=self._shard_end,
                                child_shard_ids=list(self._child_shard_ids),
                                kinesis_records=len(kinesis_records))

