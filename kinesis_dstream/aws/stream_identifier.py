"""The KCL's multi-stream identity of a stream, and the lease keys built from it.

In multi-stream mode the KCL (2.3+, 3.x; kcl-rs too) keys a shard's lease
``<accountId>:<streamName>:<creationEpoch>:<shardId>`` and stores the first three parts,
the serialized stream identifier, in the item's ``streamName`` attribute and the shard id in
``shardId``. A single-stream application keys leases by the shard id alone. The two formats
do not mix: an application that switches modality no longer sees its checkpoints (the KCL's
FAQ), so which one a worker uses is fixed by how it is configured, never guessed.

Stream names cannot hold a colon (Kinesis allows ``[a-zA-Z0-9_.-]``); an identifier whose
name part has one is refused, as the KCL's parser refuses it. The creation epoch is whatever
the application says it is (the KCL trusts it); two streams of one name whose epochs are the
same, a stream deleted and made again with the epoch reused, share their leases.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..config import StreamArn, parse_stream_arn
from ..errors import ConfigurationError

__all__ = ["StreamArn", "StreamIdentifier", "parse_lease_key", "parse_stream_arn"]

# account:stream:epoch, as the KCL's StreamIdentifier accepts it.
_SERIALIZED = re.compile(r"(?P<account>[0-9]+):(?P<name>[^:]+):(?P<epoch>[0-9]+)")
# What Kinesis accepts as a stream name.
_STREAM_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}")


@dataclass(frozen=True, order=True)
class StreamIdentifier:
    """One stream in multi-stream mode: its account, name and creation epoch."""

    account_id: str
    stream_name: str
    creation_epoch: int

    def __post_init__(self) -> None:
        if not self.account_id.isdigit():
            raise ConfigurationError(f"account id {self.account_id!r} is not a number")
        if not _STREAM_NAME.fullmatch(self.stream_name):
            raise ConfigurationError(
                f"stream name {self.stream_name!r} is not a Kinesis stream name "
                "(1-128 of a-z A-Z 0-9 _ . -; a colon would break the KCL's lease keys)")
        if self.creation_epoch <= 0:
            raise ConfigurationError(f"creation epoch must be > 0, got {self.creation_epoch}")

    def serialize(self) -> str:
        """``account:stream:epoch``: the item's ``streamName`` and the lease key's prefix."""
        return f"{self.account_id}:{self.stream_name}:{self.creation_epoch}"

    def __str__(self) -> str:
        return self.serialize()

    def lease_key(self, shard_id: str) -> str:
        """The KCL's multi-stream lease key of one of this stream's shards."""
        return f"{self.serialize()}:{shard_id}"

    @classmethod
    def parse(cls, text: str) -> "StreamIdentifier":
        """A serialized identifier; ConfigurationError when ``text`` is not one."""
        match = _SERIALIZED.fullmatch(text)
        if match is None:
            raise ConfigurationError(
                f"{text!r} is not a serialized stream identifier (account:streamName:creationEpoch)")
        return cls(match["account"], match["name"], int(match["epoch"]))


def parse_lease_key(lease_key: str) -> tuple[StreamIdentifier, str] | None:
    """(stream, shard id) of a multi-stream lease key; None for a single-stream one."""
    prefix, colon, shard_id = lease_key.rpartition(":")
    if not colon or not shard_id:
        return None
    try:
        return StreamIdentifier.parse(prefix), shard_id
    except ConfigurationError:
        return None
