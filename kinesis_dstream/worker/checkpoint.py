"""The checkpointer handed to record processors (RecordProcessorCheckpointer in the KCL).

It accepts a position only between the last checkpoint and the last record delivered, so a
processor can never checkpoint what it has not seen. Unlike the KCL, a sequence number
given without a sub-sequence number that names a KPL aggregate means the whole aggregate
as far as it was delivered, so that restarting does not replay an aggregate the processor
said it had finished (SPARK-26866).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from ..errors import CheckpointError, KinesisDStreamError, LeaseLostError
from ..records import SHARD_END, ExtendedSequenceNumber, Record, is_valid_sequence_number
from ..retry import THROTTLING, classify

log = logging.getLogger(__name__)

# Write function: (shard_id, position) -> None, raising LeaseLostError when not ours.
CheckpointWriter = Callable[[str, ExtendedSequenceNumber], object]


def kcl_exception_name(exc: KinesisDStreamError) -> str:
    """The KCL's name for why a checkpoint failed: what kclpy processors test ``value`` for.

    As the KCL's DynamoDB checkpointer: a lost lease is ShutdownException; a throttle, also
    one the retries gave up on, is ThrottlingException (processors wait and try again); any
    other failure of the table, an outage included, is KinesisClientLibDependencyException.
    """
    if isinstance(exc, CheckpointError):
        return exc.value
    if isinstance(exc, LeaseLostError):
        return "ShutdownException"
    if classify(exc) == THROTTLING:
        return "ThrottlingException"
    return "KinesisClientLibDependencyException"


class ShardCheckpointer:
    def __init__(self, shard_id: str, writer: CheckpointWriter,
                 last_checkpoint: ExtendedSequenceNumber):
        self.shard_id = shard_id
        self._writer = writer
        # Re-entrant: a failed write reports the lease loss, which closes this checkpointer
        # from inside checkpoint() on the same thread.
        self._lock = threading.RLock()
        self._last_checkpoint = last_checkpoint
        self._largest_permitted: ExtendedSequenceNumber | None = None
        self._last_sub_of: dict[str, int] = {}
        self._shard_ended = False
        self._closed_reason: str | None = None

    @property
    def last_checkpoint(self) -> ExtendedSequenceNumber:
        return self._last_checkpoint

    @property
    def largest_permitted(self) -> ExtendedSequenceNumber | None:
        return self._largest_permitted

    # -- called by the shard consumer -------------------------------------------------------
    def delivered(self, records: list[Record]) -> None:
        """Widen what may be checkpointed to the end of this batch."""
        if not records:
            return
        with self._lock:
            for record in records:
                if record.aggregated:
                    self._last_sub_of[record.sequence_number] = record.sub_sequence_number
            self._largest_permitted = records[-1].extended_sequence_number
            if len(self._last_sub_of) > 4096:
                last = self._last_checkpoint
                floor = int(last.sequence_number) if not last.is_sentinel else -1
                self._last_sub_of = {k: v for k, v in self._last_sub_of.items() if int(k) > floor}

    def reached_shard_end(self) -> None:
        with self._lock:
            self._shard_ended = True

    def close(self, reason: str) -> None:
        """After a lease loss or shutdown nothing more is written for this shard."""
        with self._lock:
            self._closed_reason = reason

    # -- called by the processor -------------------------------------------------------------
    def checkpoint(self, sequence_number: str | None = None,
                   sub_sequence_number: int | None = None) -> None:
        with self._lock:
            if self._closed_reason is not None:
                raise CheckpointError("ShutdownException",
                                      f"shard {self.shard_id}: {self._closed_reason}")
            target = self._target(sequence_number, sub_sequence_number)
            if target == self._last_checkpoint:
                return
            try:
                self._writer(self.shard_id, target)
            except KinesisDStreamError as exc:
                if isinstance(exc, LeaseLostError):
                    self._closed_reason = "lease lost"
                raise CheckpointError(kcl_exception_name(exc), str(exc)) from exc
            self._last_checkpoint = target
            log.debug("checkpointed %s at %s", self.shard_id, target)

    def _target(self, sequence_number: str | None,
                sub_sequence_number: int | None) -> ExtendedSequenceNumber:
        if sequence_number is None:
            if self._shard_ended:
                return SHARD_END
            if self._largest_permitted is None:
                return self._last_checkpoint
            return self._largest_permitted
        if sequence_number == SHARD_END.sequence_number:
            if not self._shard_ended:
                raise CheckpointError("IllegalArgumentException",
                                      f"shard {self.shard_id} has not ended")
            return SHARD_END
        if not is_valid_sequence_number(sequence_number):
            raise CheckpointError("IllegalArgumentException",
                                  f"not a sequence number: {sequence_number!r}")
        if sub_sequence_number is None:
            sub = self._last_sub_of.get(sequence_number, 0)
        else:
            if not isinstance(sub_sequence_number, int) or sub_sequence_number < 0:
                raise CheckpointError("IllegalArgumentException",
                                      f"not a sub-sequence number: {sub_sequence_number!r}")
            sub = sub_sequence_number
        target = ExtendedSequenceNumber(sequence_number, sub)
        # TRIM_HORIZON/LATEST/AT_TIMESTAMP sort below every real position and SHARD_END
        # above: no sentinel exemption, or a finished shard could be moved back from SHARD_END.
        if target < self._last_checkpoint:
            raise CheckpointError("IllegalArgumentException",
                                  f"{target} is before the last checkpoint {self._last_checkpoint}")
        if self._largest_permitted is None or self._largest_permitted < target:
            raise CheckpointError("IllegalArgumentException",
                                  f"{target} is beyond the last record delivered "
                                  f"({self._largest_permitted})")
        return target
