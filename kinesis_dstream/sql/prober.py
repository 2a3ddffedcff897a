"""The SQL source's prober: is there anything to read on a shard, asked off the trigger's path.

A shard whose last reading brought records is read again unasked. Any other readable shard
is read only where a probe found something: one GetRecords from the driver, with the
NextShardIterator the last read or probe at that position kept (no GetShardIterator, of which
the account gets 5 a second per shard). A background thread probes each quiet shard at most
every ``PROBE_INTERVAL_S`` (the KCL's idle poll), so the trigger waits for no per-shard call.
A probe is tried once: a throttled or failed one says "read it", and the reading's task waits
the fault out, so probes never spend the budget the readers need. The quiet mark is in the
offset (see ``offsets``): a probe decides when a shard is read, never what a reading returns.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence, TypeVar

from ..aws.kinesis import KinesisClient
from ..config import ConsumerConfig
from ..errors import KinesisDStreamError
from ..retrieval import ITERATOR_TTL_S, KinesisDataFetcher
from ..retry import FaultLog, is_transient
from .offsets import position_of

log = logging.getLogger(__name__)

# A quiet shard is probed at most this often (the KCL's idleTimeBetweenReadsInMillis).
PROBE_INTERVAL_S = 1.0
# A probe older than this (the background prober fell behind) is made again by latestOffset.
PROBE_STALE_S = 3 * PROBE_INTERVAL_S

T = TypeVar("T")


def each_shard(pool: ThreadPoolExecutor, fn: Callable[[str], T],
               shard_ids: Sequence[str]) -> dict[str, T]:
    """``fn(shard id)`` for each shard, concurrently: the driver's wait per trigger is one
    round trip, not one per shard."""
    if len(shard_ids) <= 1:
        return {s: fn(s) for s in shard_ids}
    futures = {s: pool.submit(fn, s) for s in shard_ids}
    return {s: f.result() for s, f in futures.items()}


@dataclass
class Probe:
    """What the driver learnt about a shard's next reading before planning it."""

    has_data: bool
    millis_behind_latest: int | None = None


@dataclass
class ShardWatch:
    """The driver's view of one shard between its readings: the position it stands at, an
    iterator valid there (a read's or a probe's NextShardIterator), and the last probe there."""

    entry: dict[str, Any]
    iterator: str | None = None
    iterator_time: float = 0.0  # epoch s, when Kinesis handed ``iterator`` out
    ready_at: float = 0.0  # epoch s until which the read that ended here spent the shard's budget
    probe: Probe | None = None
    probed_at: float = 0.0  # monotonic s

    def probe_due(self, now: float) -> bool:
        """No probe yet, or a quiet one older than the probe interval."""
        return self.probe is None or (not self.probe.has_data
                                      and now - self.probed_at >= PROBE_INTERVAL_S)


class ShardProber:
    """The driver's watches over each shard's position, and the thread probing quiet shards.

    ``target_ms`` is Trigger.AvailableNow's (None otherwise): records that arrived after it
    are not work, and every trigger probes afresh, with no background thread. Shards are
    known by the reader's keys; ``locate`` turns a key into its stream's config and the shard
    id (by default: ``config``'s stream, the key the shard id), so one thread probes the
    quiet shards of every stream a query reads.
    """

    def __init__(self, config: ConsumerConfig, pool: ThreadPoolExecutor,
                 locate: Callable[[str], tuple[ConsumerConfig, str]] | None = None,
                 label: str | None = None) -> None:
        self.config = config
        self.label = label or config.stream_name
        self._locate = locate or (lambda key: (config, key))
        self._clients: dict[ConsumerConfig, KinesisClient] = {}
        self._pool = pool
        self._watch: dict[str, ShardWatch] = {}
        self._lock = threading.Lock()
        self._quiet: dict[str, dict[str, Any]] = {}  # shards sitting out: the thread's work
        # Probes sent ahead (probe_soon), by shard: the position each asks at, and its answer.
        self._sent: dict[str, tuple[dict[str, Any], Future[Probe]]] = {}
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self._faults = FaultLog(log, f"probing stream {self.label}")

    def kinesis(self, config: ConsumerConfig) -> KinesisClient:
        """The probes' client of ``config``'s stream: one try per call. A probe that fails
        says "read it" and the reading's task waits the fault out; a probe that retried would
        spend the budget the task needs, and hold the trigger up."""
        with self._lock:
            client = self._clients.get(config)
            if client is None:
                client = self._clients[config] = KinesisClient(
                    replace(config, retry_max_attempts=1))
            return client

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def watched(self, shard_id: str, entry: dict[str, Any], iterator: str | None = None,
                iterator_time: float = 0.0, read_empty: bool = False,
                ready_at: float = 0.0) -> ShardWatch:
        """The shard's watch at ``entry``: a new one when the shard moved, with ``iterator``
        and the ``ready_at`` of the read that ended there.
        ``read_empty``: a read that found nothing at the shard's tip (millisBehindLatest 0;
        not a read refused by throttling, which knows nothing) ended there when Kinesis
        handed ``iterator`` out, which tells what a probe would: no probe is due before
        PROBE_INTERVAL_S from then."""
        with self._lock:
            watch = self._watch.get(shard_id)
            if watch is None or watch.entry != entry:
                watch = self._watch[shard_id] = ShardWatch(dict(entry))
            if ready_at:
                watch.ready_at = ready_at
            if iterator is not None:
                watch.iterator, watch.iterator_time = iterator, iterator_time
                if read_empty:
                    age = max(0.0, time.time() - iterator_time)
                    watch.probe, watch.probed_at = Probe(False, 0), time.monotonic() - age
            return watch

    def probe_soon(self, shards: dict[str, dict[str, Any]]) -> None:
        """Probe these shards at these positions now, in the pool, for a ``probed`` that
        comes soon after (the query's start sends its first reading's probes while Spark
        logs the initial offset)."""
        with self._lock:
            for shard_id, entry in shards.items():
                self._sent[shard_id] = (dict(entry), self._pool.submit(
                    self._probe, shard_id, dict(entry), None))

    def _take_sent(self, shards: dict[str, dict[str, Any]]) -> None:
        """Wait for the probes sent ahead: an answer at a shard's position is kept in its
        watch, so no shard is probed twice at once or again at once."""
        with self._lock:
            sent, self._sent = self._sent, {}
        for shard_id, (entry, future) in sent.items():
            if shard_id in shards and shards[shard_id] == entry:
                try:
                    future.result()
                except Exception as exc:  # noqa: BLE001 - probed again below, which raises
                    log.debug("probe sent ahead of shard %s failed: %s", shard_id, exc)

    def probed(self, shards: dict[str, dict[str, Any]], target_ms: int | None) -> dict[str, Probe]:
        """What the probes found at each shard's position: the background prober's finding
        while it is fresh, else a probe made now (a shard newly quiet, or the first trigger)."""
        self._take_sent(shards)
        now = time.monotonic()
        found: dict[str, Probe] = {}
        for shard_id, entry in shards.items():
            watch = self.watched(shard_id, entry)
            if watch.probe is not None and (watch.probe.has_data
                                            or now - watch.probed_at < PROBE_STALE_S):
                found[shard_id] = watch.probe
        if target_ms is not None:  # Trigger.AvailableNow asks afresh at every trigger
            found = {}
        missing = [s for s in shards if s not in found]
        found.update(each_shard(self._pool, lambda s: self._probe(s, shards[s], target_ms),
                                missing))
        return found

    def watch_quiet(self, quiet: dict[str, dict[str, Any]], target_ms: int | None) -> None:
        """Hand the shards that sit this reading out to the background thread."""
        with self._lock:
            self._quiet = dict(quiet)
            for shard_id in [s for s in self._watch if s not in quiet]:
                if self._watch[shard_id].probe is not None:  # read next: a new position
                    self._watch[shard_id].probe = None
        if quiet and self._thread is None and target_ms is None:
            self._thread = threading.Thread(target=self._probe_quiet_shards, daemon=True,
                                            name=f"kinesis-source-prober-{self.label}")
            self._thread.start()

    def ready_at(self, shard_id: str, entry: dict[str, Any]) -> float:
        """When the shard at ``entry`` is expected to serve a read again (epoch s; 0.0: at
        once): the read that ended there spent its 2 MiB/s ahead until then."""
        with self._lock:
            watch = self._watch.get(shard_id)
            return watch.ready_at if watch is not None and watch.entry == entry else 0.0

    def iterator(self, shard_id: str, entry: dict[str, Any]) -> str | None:
        """An iterator at the shard's position in ``entry`` while it is valid: from an earlier
        probe that found nothing there, or recorded by the read that ended there."""
        with self._lock:
            watch = self._watch.get(shard_id)
            if watch is None or watch.entry != entry or watch.iterator is None or \
                    time.time() - watch.iterator_time > ITERATOR_TTL_S:
                return None
            return watch.iterator

    def _probe_at(self, positions: dict[str, dict[str, Any]], shard_id: str) -> Probe:
        return self._probe(shard_id, positions[shard_id], None)

    def _probe_quiet_shards(self) -> None:
        """The background thread: each quiet shard once every PROBE_INTERVAL_S, until stop()."""
        while not self._halt.wait(PROBE_INTERVAL_S / 4):
            with self._lock:
                quiet = dict(self._quiet)
                now = time.monotonic()
                due = [s for s, e in quiet.items() if s in self._watch
                       and self._watch[s].entry == e and self._watch[s].probe_due(now)]
            try:
                each_shard(self._pool, functools.partial(self._probe_at, quiet), due)
            except Exception as exc:  # noqa: BLE001 - latestOffset probes again, and raises
                log.debug("background probe of %s failed: %s", self.label, exc)

    def _probe(self, shard_id: str, entry: dict[str, Any], target_ms: int | None) -> Probe:
        """One GetRecords from the shard's position: a record (before ``target_ms``), the
        shard's end, or a positive lag means the next reading has work. Kept in the watch.

        A probe that found nothing keeps Kinesis' NextShardIterator, which still points at
        the position: the next probe of a quiet shard, or the task that reads it, starts
        from it without a GetShardIterator. A probe that meets throttling or an outage is not
        retried: it says "read it", and the reading's task waits the fault out.
        """
        position, timestamp = position_of(entry)
        stream_config, shard = self._locate(shard_id)
        config = replace(stream_config, max_records=2, initial_position_timestamp=timestamp
                         or stream_config.initial_position_timestamp)
        fetcher = KinesisDataFetcher(self.kinesis(stream_config), config, shard)
        iterator = self.iterator(shard_id, entry)
        try:
            if iterator is not None:
                fetcher.resume(position, iterator)
            else:
                fetcher.initialize(position)
            result = fetcher.get_records()
        except KinesisDStreamError as exc:
            if not is_transient(exc):
                raise
            self._faults.failed(exc)
            return self._found(shard_id, entry, Probe(True))
        if self._faults.failing:
            self._faults.succeeded()
        lag = result.millis_behind_latest
        if result.shard_end:
            probe = Probe(True, lag)
        elif result.records:
            arrived = result.records[0].approximate_arrival_timestamp
            probe = Probe(target_ms is None or arrived <= target_ms, lag)
        else:
            probe = Probe(bool(lag) and target_ms is None, lag)
        # An empty page's NextShardIterator still points at the position.
        empty = not result.records and not result.shard_end
        return self._found(shard_id, entry, probe, fetcher.iterator if empty else None)

    def _found(self, shard_id: str, entry: dict[str, Any], probe: Probe,
               iterator: str | None = None) -> Probe:
        """Keep what a probe at ``entry`` found, unless the shard has moved on since."""
        with self._lock:
            watch = self._watch.setdefault(shard_id, ShardWatch(dict(entry)))
            if watch.entry == entry:
                watch.probe, watch.probed_at = probe, time.monotonic()
                if iterator is not None:
                    watch.iterator, watch.iterator_time = iterator, time.time()
        return probe
