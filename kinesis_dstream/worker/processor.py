"""The record-processor interface: amazon-kclpy's v3 shape.

A processor written for amazon-kclpy (``amazon_kclpy.v3.processor.RecordProcessorBase``)
runs under our workers unchanged, and one written against this class runs under the Java
MultiLangDaemon through amazon-kclpy: the method names and the input objects' attribute
names are the same. Python does not enforce the base class; subclassing it only gives the
defaults below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from ..aws.stream_identifier import StreamIdentifier
    from ..records import Record


class Checkpointer(Protocol):
    def checkpoint(self, sequence_number: str | None = None,
                   sub_sequence_number: int | None = None) -> None:
        """Record progress; ``None`` means 'the last record handed to the processor'.

        Raises ``CheckpointError`` whose ``value`` names the KCL exception.
        """


@dataclass(frozen=True)
class InitializeInput:
    """``shard_id`` is the Kinesis shard id. In multi-stream mode ``stream_identifier``
    names its stream (account, name, creation epoch); None in single-stream mode."""

    shard_id: str
    sequence_number: str | None
    sub_sequence_number: int | None
    stream_identifier: "StreamIdentifier | None" = None


@dataclass(frozen=True)
class ProcessRecordsInput:
    records: list["Record"]
    checkpointer: Checkpointer
    millis_behind_latest: int | None


@dataclass(frozen=True)
class LeaseLostInput:
    pass


@dataclass(frozen=True)
class ShardEndedInput:
    checkpointer: Checkpointer


@dataclass(frozen=True)
class ShutdownRequestedInput:
    checkpointer: Checkpointer


class RecordProcessor:
    """One instance per shard lease, called from one thread.

    Lifecycle (the KCL's): ``initialize`` once, ``process_records`` for each batch, then
    exactly one of ``lease_lost`` (another worker owns the shard: do not checkpoint),
    ``shard_ended`` (must checkpoint to finish the shard, so its children can start) or
    ``shutdown_requested`` (the worker is stopping: checkpoint what is done).
    """

    def initialize(self, initialize_input: InitializeInput) -> None:
        pass

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        raise NotImplementedError

    def lease_lost(self, lease_lost_input: LeaseLostInput) -> None:
        pass

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        pass


class ShardRecordProcessor(Protocol):
    """What a worker calls on a processor: ``RecordProcessor``'s methods, subclassed or not."""

    def initialize(self, initialize_input: InitializeInput) -> None: ...
    def process_records(self, process_records_input: ProcessRecordsInput) -> None: ...
    def lease_lost(self, lease_lost_input: LeaseLostInput) -> None: ...
    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None: ...
    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None: ...


# Called once per shard lease, with the lease key, to make that shard's processor: the shard
# id, or in multi-stream mode ``account:stream:creationEpoch:shardId``.
ProcessorFactory = Callable[[str], ShardRecordProcessor]
