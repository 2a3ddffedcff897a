"""Records trimmed by retention before they were read, and what ``failOnDataLoss`` makes of it.

A record source finds the loss (its first record comes after where the read was to start);
the caller that may hand records out reports it, once its range is recorded.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ..config import ConsumerConfig
from ..errors import DataLossError
from ..records import ExtendedSequenceNumber

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrimmedRange:
    """Records lost to retention: those after ``after`` (where the read was to start) and
    before ``first`` (the oldest record Kinesis still held; None when it held none)."""

    shard_id: str
    after: ExtendedSequenceNumber
    first: str | None


_reported: set[tuple[str, str, ExtendedSequenceNumber]] = set()  # (stream, shard, after)


def report_data_loss(config: ConsumerConfig, lost: TrimmedRange) -> None:
    """``failOnDataLoss`` decides: raise ``DataLossError``, or log the lost range once per
    process (a task retry reads the same start again) and go on."""
    upto = f"before {lost.first}" if lost.first is not None else "(the shard holds none now)"
    message = (f"stream {config.stream_name!r} shard {lost.shard_id}: the records after "
               f"{lost.after} {upto} were trimmed by the stream's retention before they were "
               "read")
    if config.fail_on_data_loss:
        raise DataLossError(f"{message} (failOnDataLoss is true)")
    key = (config.stream_name, lost.shard_id, lost.after)
    if key not in _reported:
        _reported.add(key)
        log.warning("%s; going on from the oldest record left (failOnDataLoss is false)", message)
