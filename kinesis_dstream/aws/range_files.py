"""The batch-range store as small JSON files (the awslabs ``metadataCommitterType`` HDFS):
the same facts as the DynamoDB range table (``range_table``), kept where the query's
checkpoint is, so that a SQL query needs no DynamoDB at all.

One object per (stream key, shard, batch)::

    <range path>/kinesis-ranges/<stream key, %-quoted>/<shard id>/<batch time, 20 digits>.json

Batch times are zero-padded so that a listing in name order is in batch order: the shard's
latest batch before another is the last name below it. An object is written once, only if
absent (``range_blobs``: a hard link locally, a conditional PUT on S3), which is the range
table's conditional put; objects are deleted once their batch is committed, so a shard's
directory holds only the batches since its last commit and listings stay short.

What each call costs, per (batch, shard) that read records: one create (one PUT); the
driver's look-up of the ranges of a completed reading, one GET; the clean-up of a committed
reading, one DeleteObjects per 1,000 ranges. ``latest_before`` (a task that does not know
where its batch starts, after a restart) costs a LIST and a GET.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Any, Iterable
from urllib.parse import quote

from ..config import ConsumerConfig
from ..records import ExtendedSequenceNumber
from .range_blobs import Blobs, RangeStoreError, open_blobs
from .range_table import BatchRange

log = logging.getLogger(__name__)

RANGES_DIR = "kinesis-ranges"
BATCH_DIGITS = 20  # epoch ms and Spark batch ids alike fit (2**63 has 19 digits)
FORMAT_VERSION = 1


def _shard_dir(stream_key: str, shard_id: str) -> str:
    return f"{RANGES_DIR}/{quote(stream_key, safe='')}/{quote(shard_id, safe='')}/"


def _name(stream_key: str, shard_id: str, batch_ms: int) -> str:
    if batch_ms < 0:
        raise ValueError(f"batch {batch_ms}: a batch time is not negative")
    return f"{_shard_dir(stream_key, shard_id)}{batch_ms:0{BATCH_DIGITS}d}.json"


def _batch_of(name: str) -> int | None:
    stem = name.rsplit("/", 1)[-1]
    if len(stem) == BATCH_DIGITS + 5 and stem.endswith(".json") and stem[:BATCH_DIGITS].isdigit():
        return int(stem[:BATCH_DIGITS])
    return None


def _position(value: dict[str, Any] | None) -> ExtendedSequenceNumber | None:
    if value is None:
        return None
    return ExtendedSequenceNumber(str(value["sequence_number"]), int(value["sub_sequence_number"]))


def encode(batch_range: BatchRange) -> bytes:
    """A range as the JSON object stored (every field, named as in ``BatchRange``)."""
    fields = asdict(batch_range)
    fields["child_shard_ids"] = list(batch_range.child_shard_ids)
    return json.dumps({"v": FORMAT_VERSION, **fields}, sort_keys=True).encode()


def decode(body: bytes, where: str) -> BatchRange:
    """The range a stored object holds, or ``RangeStoreError`` naming the object."""
    try:
        fields = json.loads(body)
        if not isinstance(fields, dict) or fields.pop("v", None) != FORMAT_VERSION:
            raise ValueError(f"not a version {FORMAT_VERSION} batch range")
        fields["start"] = _position(fields["start"])
        fields["end"] = _position(fields.get("end"))
        fields["child_shard_ids"] = tuple(fields.get("child_shard_ids") or ())
        return BatchRange(**fields)
    except (ValueError, KeyError, TypeError) as exc:
        raise RangeStoreError(f"batch range {where} is not one we wrote ({exc}): delete it "
                              "to read the batch again from where the previous one ended, "
                              "or start the query over with a new checkpointLocation") from exc


class FileRangeStore:
    """The range store's operations (``range_store.RangeStore``) over ``Blobs``."""

    def __init__(self, config: ConsumerConfig, blobs: Blobs | None = None) -> None:
        if blobs is None:
            if config.range_path is None:
                raise ValueError("a file range store needs config.range_path")
            blobs = open_blobs(config, config.range_path)
        self.blobs = blobs
        self.location = f"{blobs.location.rstrip('/')}/{RANGES_DIR}"

    def prepare(self) -> None:
        """Nothing to create: directories (and S3 prefixes) come with the first object."""

    def _load(self, name: str) -> BatchRange | None:
        body = self.blobs.read(name)
        return None if body is None else decode(body, f"{self.blobs.location.rstrip('/')}/{name}")

    def get(self, stream_key: str, shard_id: str, batch_ms: int) -> BatchRange | None:
        return self._load(_name(stream_key, shard_id, batch_ms))

    def latest_before(self, stream_key: str, shard_id: str, batch_ms: int,
                      since_ms: int) -> BatchRange | None:
        """The range of the shard's latest batch in [since_ms, batch_ms), if any."""
        if since_ms >= batch_ms:
            return None
        start_after = _name(stream_key, shard_id, since_ms - 1) if since_ms > 0 else ""
        below = [(t, n) for n in self.blobs.list_names(_shard_dir(stream_key, shard_id),
                                                        start_after)
                 if (t := _batch_of(n)) is not None and since_ms <= t < batch_ms]
        return self._load(max(below)[1]) if below else None

    def put_if_absent(self, batch_range: BatchRange) -> BatchRange:
        """Store the range unless another computation of this partition stored one first;
        returns the stored range (ours or theirs)."""
        name = _name(batch_range.stream_key, batch_range.shard_id, batch_range.batch_ms)
        if self.blobs.create(name, encode(batch_range)):
            return batch_range
        stored = self._load(name)
        return batch_range if stored is None else stored  # deleted since: past a commit

    def delete(self, ranges: Iterable[tuple[str, str, int]]) -> int:
        names = sorted({_name(*r) for r in ranges})
        self.blobs.delete(names)
        return len(names)

    def batch_times(self, stream_key: str, shard_id: str) -> list[int]:
        return [t for n in self.blobs.list_names(_shard_dir(stream_key, shard_id))
                if (t := _batch_of(n)) is not None]
