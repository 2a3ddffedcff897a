"""What the SQL source's reader keeps in the driver process only (``DriverState``).

Clients (made on first use, one per stream read), the thread pool for per-shard calls, the
prober, the fan-out consumers registered for the query (one per stream), and what the
planned readings left to the next ones: their recorded ranges (looked up, where a shard's
subscription is held, deleted once old). Pickling the reader for the executors leaves all of
it behind. Shards are known by the ``StreamSet``'s keys (see ``offsets``), so the maps here
are flat whatever the number of streams.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..aws.kinesis import KinesisClient, Shard
from ..aws.range_store import RangeStore, open_range_store
from ..aws.range_table import BatchRange
from ..aws.stream_consumer import register_stream_consumer
from ..config import ConsumerConfig
from ..errors import KinesisDStreamError, StreamNotFoundError
from ..retrieval import waiting_out_dynamodb
from ..retrieval.peer_tls import PeerKey, new_peer_key
from ..worker.stall import StallWatch
from .offsets import StreamSet, stream_key
from .prober import ShardProber, each_shard

log = logging.getLogger(__name__)


class DriverState:
    """What the reader holds in the driver process only: clients (created on first use),
    threads, the prober, and what the planned readings left to the next ones."""

    def __init__(self, config: ConsumerConfig,
                 stream_configs: Mapping[str, ConsumerConfig] | None = None) -> None:
        self.config = config
        self.configs = dict(stream_configs or {config.stream_name: config})
        self.streams = StreamSet(tuple(self.configs))
        label = ",".join(self.streams.names)
        # The per-shard calls, the probes and the range clean-up.
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kinesis-source")
        self.prober = ShardProber(config, self.pool, self.locate, label)
        self.listing: dict[str, list[Shard]] | None = None  # by stream
        self.listed_at = 0.0  # monotonic s
        self.read_in: dict[int, list[str]] = {}  # reading -> the shard keys it read (clean-up)
        self.lag: dict[str, int | None] = {}
        self.stalls = StallWatch.of(config, f"aws-kinesis {label}")
        self.weight: dict[str, int] = {}  # what each shard of the planned reading read last
        self.planned = 0  # readings planned by this process (its first one is small)
        self.last_reading: dict[str, Any] | None = None  # its costs (``progress``)
        # The ranges of the last completed reading: (query, reading, shard key -> range).
        self.recorded: tuple[str, int, dict[str, BatchRange | None]] | None = None
        # The fan-out consumer registered for the query on each stream: (name, ARN).
        self.consumers: dict[str, tuple[str, str]] = {}
        self._clients: dict[str, KinesisClient] = {}
        self._ranges_made: Future[RangeStore] | None = None
        self._lock = threading.Lock()
        self._peer_key: PeerKey | None = None

    @property
    def peer_key(self) -> PeerKey:
        """Proves a task to the executor process holding its shard's subscription (made
        on the first fan-out plan: a polling query needs none)."""
        with self._lock:
            if self._peer_key is None:
                self._peer_key = new_peer_key()
            return self._peer_key

    def locate(self, key: str) -> tuple[ConsumerConfig, str]:
        """A shard key's stream config and shard id."""
        stream, shard_id = self.streams.split(key)
        return self.configs[stream], shard_id

    def kinesis_of(self, stream: str) -> KinesisClient:
        client = self._clients.get(stream)
        if client is None:
            client = self._clients[stream] = KinesisClient(self.configs[stream])
        return client

    @property
    def kinesis(self) -> KinesisClient:
        return self.kinesis_of(self.streams.names[0])

    def prepare_ranges(self) -> None:
        """Start making the batch-range store (its client; the DynamoDB table unless it
        exists, or nothing for a file store) in the background: the query's start waits for
        it only where a reading first needs it (planning its partitions), not while it
        lists the shards, nor while Spark plans the first batch (a new DynamoDB table takes
        seconds to become ACTIVE)."""
        with self._lock:
            if self._ranges_made is None:
                self._ranges_made = self.pool.submit(self._make_ranges)

    @cached_property
    def ranges(self) -> RangeStore:
        """The batch-range store, prepared (its error, if that failed)."""
        self.prepare_ranges()
        assert self._ranges_made is not None
        return self._ranges_made.result()

    def _make_ranges(self) -> RangeStore:
        store = open_range_store(self.config)
        store.prepare()
        return store

    def list_shards(self) -> dict[str, list[Shard]]:
        """Each stream's shards. A stream that does not exist fails the query, named (and
        said to be one of several, where the query reads more than one)."""
        listing = {}
        for stream in self.streams.names:
            try:
                listing[stream] = self.kinesis_of(stream).list_shards()
            except StreamNotFoundError as exc:
                if self.streams.single:
                    raise
                raise StreamNotFoundError(
                    f"stream {stream!r}, one of the streams the query reads "
                    f"({', '.join(self.streams.names)}), does not exist: {exc}") from exc
        return listing

    def consumer_arn(self, stream: str, name: str, query: str) -> str:
        """The ARN of ``stream``'s fan-out consumer ``name``, registered (and ACTIVE) once
        per process and stream."""
        known = self.consumers.get(stream)
        if known is None or known[0] != name:
            arn = register_stream_consumer(self.kinesis_of(stream), name)
            log.info("aws-kinesis query %s reads stream %s by enhanced fan-out as consumer %s "
                     "(%s)", query, stream, name, arn)
            known = self.consumers[stream] = (name, arn)
        return known[1]

    def recorded_ranges(self, query: str, batch: int,
                        keys: Sequence[str]) -> dict[str, BatchRange | None]:
        """The ranges reading ``batch`` recorded (it completed: they no longer change), by
        shard key, looked up once however many triggers find nothing new to read."""
        known = self._recorded_of(query, batch)
        if known is not None:
            return known
        if not keys:  # nothing to look up (a first reading): the table may still be in making
            self.recorded = (query, batch, {})
            return {}
        ranges = self.ranges  # created once, before the threads share it

        def get(key: str) -> BatchRange | None:
            stream, shard_id = self.streams.split(key)
            return ranges.get(stream_key(stream, query), shard_id, batch)

        # A DynamoDB outage holds the trigger back (the tasks wait it out too), not the query.
        stored = each_shard(self.pool, lambda k: waiting_out_dynamodb(
            self.config, lambda: get(k)), keys)
        self.recorded = (query, batch, stored)
        return stored

    def _recorded_of(self, query: str, batch: int) -> dict[str, BatchRange | None] | None:
        """What ``recorded_ranges`` kept, if it was for this reading."""
        if self.recorded is not None and self.recorded[:2] == (query, batch):
            return self.recorded[2]
        return None

    def subscribers(self, query: str, batch: int) -> Callable[[str], dict[str, Any]]:
        """Where each shard's subscription (fan-out) or next page (polling, ``prefetch``) is
        held after reading ``batch`` (its recorded range says), for the next task to ask
        wherever it runs."""
        recorded = self._recorded_of(query, batch) or {}

        def held_at(key: str) -> dict[str, Any]:
            previous = recorded.get(key)
            return {"peer_key": self.peer_key,
                    "subscriber": previous.subscriber if previous is not None else None}
        return held_at

    def forget_readings(self, query: str, readings: Iterable[int],
                        everyone: list[str]) -> None:
        """Delete the ranges of these readings, each once and only of the shards each read
        (``everyone`` for a reading this process did not plan), off the query's path."""
        doomed = [(stream_key(stream, query), shard_id, t) for t in readings
                  for stream, shard_id in map(self.streams.split,
                                              self.read_in.pop(t, everyone))]

        def delete() -> None:
            try:
                self.ranges.delete(doomed)
            except KinesisDStreamError as exc:
                log.warning("could not delete old batch ranges of query %s (TTL will): %s",
                            query, exc)

        if doomed:
            self.pool.submit(delete)

    def stop(self) -> None:
        self.prober.stop()
        self.pool.shutdown(wait=True)
