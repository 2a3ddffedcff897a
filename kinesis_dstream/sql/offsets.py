"""The SQL source's offsets: where each shard's reading of a micro-batch starts, not ends.

Kinesis cannot say in advance where a shard's records stop. So the executor task that reads
first decides where a reading ends and records that range (``aws.range_table``) before it hands
out a record; a task retry or a re-run after a restart reads exactly that range.
``latestOffset(O_n)`` builds ``O_n+1`` from ``O_n`` and the ranges reading n recorded (its batch
completed): a pure function of committed facts, logged by Spark before reading n+1 happens. The
query id, born in ``initialOffset()``, travels in every offset, so it lives in the query's
checkpointLocation without the source knowing that location.

An offset of a query that reads one stream: ``{"v": 1, "query": id, "batch": n, "limit": cap,
"shards": {shard: position}}``, keys in that order, shards sorted (the layout every version
wrote). A query of several streams (``streamName`` a list) writes ``{"v": 2, ..., "streams":
{stream: {shard: position}}}``: positions, ranges and range keys are per stream and shard.
A position: ``{"after": "<seq>", "sub": k}``, ``{"at": "TRIM_HORIZON"}``, ``{"at":
"AT_TIMESTAMP", "ts": s}`` or ``{"ended": true}``; a shard marked ``"wait": [parents]``
(parents not ended) or ``"quiet": true`` (see ``prober``) is not read.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..aws.kinesis import Shard
from ..aws.range_table import BatchRange, start_after
from ..errors import ConfigurationError, DataLossError, KinesisDStreamError
from ..records import AT_TIMESTAMP, TRIM_HORIZON, ExtendedSequenceNumber

log = logging.getLogger(__name__)

OFFSET_VERSION = 1
STREAMS_OFFSET_VERSION = 2  # several streams: {"streams": {stream: {shard: position}}}


def position_json(start: ExtendedSequenceNumber, timestamp: float | None) -> dict[str, Any]:
    """A reader position as offset JSON (sequence numbers as strings, fixed key order)."""
    if start.sequence_number == TRIM_HORIZON:
        return {"at": TRIM_HORIZON}
    if start.sequence_number == AT_TIMESTAMP:
        return {"at": AT_TIMESTAMP, "ts": float(timestamp) if timestamp is not None else 0.0}
    if start.is_sentinel:
        raise KinesisDStreamError(f"position {start} cannot be an offset")
    return {"after": start.sequence_number, "sub": int(start.sub_sequence_number)}


def position_of(entry: dict[str, Any]) -> tuple[ExtendedSequenceNumber, float | None]:
    if "after" in entry:
        return ExtendedSequenceNumber(str(entry["after"]), int(entry.get("sub", 0))), None
    if entry.get("at") == AT_TIMESTAMP:
        return ExtendedSequenceNumber(AT_TIMESTAMP), float(entry["ts"])
    if entry.get("at") == TRIM_HORIZON:
        return ExtendedSequenceNumber(TRIM_HORIZON), None
    raise KinesisDStreamError(f"not a readable position: {entry}")


def is_readable(entry: dict[str, Any]) -> bool:
    return not entry.get("ended") and not entry.get("wait")


def is_read(entry: dict[str, Any]) -> bool:
    """Read in the reading this offset starts: readable, and not found quiet by the probe."""
    return is_readable(entry) and not entry.get("quiet")


def without_quiet(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "quiet"}


def stream_key(stream_name: str, query_id: str) -> str:
    """The range table's key of one query of one stream."""
    return f"sql/{stream_name}/{query_id}"


def advance(entry: dict[str, Any], stored: BatchRange | None) -> dict[str, Any]:
    """A shard's position after the reading whose recorded range is ``stored`` (the readers'
    one rule, ``start_after``)."""
    if stored is None:
        return entry
    if stored.shard_end:
        return {"ended": True}
    return position_json(*start_after(stored, *position_of(entry)))


def next_shards(current: dict[str, dict[str, Any]], listing: Sequence[Shard] | None,
                child_start: dict[str, Any], fail_on_data_loss: bool,
                key: Callable[[str], str] = str) -> dict[str, dict[str, Any]]:
    """Shard positions of the next offset: new shards added, waits re-checked, gone shards dropped.

    Pure (no I/O) so that parents-before-children is tested on its own. ``listing`` None means
    "not listed this time": only the waits are re-checked. ``key`` names a shard in log lines
    and errors as the query knows it (``StreamSet.key``: with its stream, of several).
    """
    shards = dict(current)
    if listing is not None:
        listed = {s.shard_id: s for s in listing}
        for shard_id in sorted(listed):
            if shard_id not in shards:
                parents = [p for p in listed[shard_id].parent_shard_ids if p in shards]
                entry = dict(child_start)
                if parents:
                    entry["wait"] = parents
                shards[shard_id] = entry
                log.info("new shard %s (parents %s) joins the query", key(shard_id),
                         listed[shard_id].parent_shard_ids or "-")
        for shard_id in sorted(set(shards) - set(listed)):
            if shards[shard_id].get("ended"):
                del shards[shard_id]  # gone by retention after we read it all
                continue
            message = (f"shard {key(shard_id)} is no longer listed by Kinesis (expired by "
                       f"retention?) before the query read it to its end: records may be lost")
            if fail_on_data_loss:
                raise DataLossError(message + " (kinesis.failOnDataLoss is true)")
            log.warning("%s; going on (kinesis.failOnDataLoss is false)", message)
            shards[shard_id] = {"ended": True}
    for shard_id, entry in list(shards.items()):
        if entry.get("wait"):
            waiting = [p for p in entry["wait"] if p in shards and not shards[p].get("ended")]
            entry = {k: v for k, v in entry.items() if k != "wait"}
            if waiting:
                entry["wait"] = waiting
            shards[shard_id] = entry
    return {k: shards[k] for k in sorted(shards)}


def is_first_reading_again(start: dict[str, Any], end: dict[str, Any]) -> bool:
    """Spark re-runs a query's first micro-batch, planned but not committed before a stop.

    Spark then asks ``initialOffset()`` again for the start, and a restarted source process
    makes a new query id. The logged ``end`` alone says what reading 1 reads (its query id,
    its positions, LATEST's pinned time): ``start`` only bounds it. ``end`` is an initial
    offset itself (reading 0) where Spark ran an empty first batch (nothing had arrived at
    the first trigger). Either way that checkpoint resumes under the id it was born with,
    whatever moment the query was stopped at.
    """
    return int(start.get("batch", -1)) == 0 and int(end.get("batch", -1)) in (0, 1)


def make_offset(query_id: str, batch: int, limit: int,
                shards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"v": OFFSET_VERSION, "query": query_id, "batch": batch, "limit": limit,
            "shards": {k: shards[k] for k in sorted(shards)}}


def make_streams_offset(query_id: str, batch: int, limit: int,
                        streams: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    return {"v": STREAMS_OFFSET_VERSION, "query": query_id, "batch": batch, "limit": limit,
            "streams": {name: {k: streams[name][k] for k in sorted(streams[name])}
                        for name in sorted(streams)}}


@dataclass(frozen=True)
class StreamSet:
    """The streams a query reads, and each shard's key in the reader's per-shard maps: the
    shard id alone when the query reads one stream (so its offsets, reports and logs read as
    they always did), else ``stream/shardId`` (a stream name holds no ``/``)."""

    names: tuple[str, ...]

    @property
    def single(self) -> bool:
        return len(self.names) == 1

    def key(self, stream: str, shard_id: str) -> str:
        return shard_id if self.single else f"{stream}/{shard_id}"

    def split(self, key: str) -> tuple[str, str]:
        if self.single:
            return self.names[0], key
        stream, _, shard_id = key.partition("/")
        return stream, shard_id

    def flatten(self, offset: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """An offset's shard positions by key. An offset of one stream (``v`` 1, as every
        version before several streams wrote) is the query's stream's when it reads one; a
        stream no longer in the list is no longer read."""
        if "streams" not in offset:
            if not self.single:
                raise ConfigurationError(
                    f"the checkpointLocation holds offsets of a query that read one stream, "
                    f"which they do not name: it cannot go on reading the streams "
                    f"{', '.join(self.names)}. Give it that one stream again, or start the "
                    f"query of several streams with a new checkpointLocation")
            return dict(offset["shards"])
        flat: dict[str, dict[str, Any]] = {}
        for stream, shards in offset["streams"].items():
            if stream not in self.names:
                log.warning("stream %s is no longer in the query's list: no longer read", stream)
                continue
            flat.update({self.key(stream, s): e for s, e in shards.items()})
        return flat

    def by_stream(self, flat: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
        """Per-key positions grouped by stream (every stream of the query, if empty)."""
        grouped: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in self.names}
        for key, entry in flat.items():
            stream, shard_id = self.split(key)
            grouped.setdefault(stream, {})[shard_id] = entry
        return grouped

    def offset(self, query_id: str, batch: int, limit: int,
               flat: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The offset of per-key positions: one stream's layout (v1), or several's (v2)."""
        if self.single:
            return make_offset(query_id, batch, limit, flat)
        return make_streams_offset(query_id, batch, limit, self.by_stream(flat))
