"""Multi-stream mode: which streams a worker reads, checked again while it runs.

The KCL's MultiStreamTracker, StreamConfig and FormerStreamsLeasesDeletionStrategy, and the
part of its Scheduler that acts on them (checkAndSyncStreamShardsAndLeases):
- every ``stream_check_interval_ms`` (the KCL's 60 s) the list is read again; a new stream
  gets its leases at once, the KCL's multi-stream keys (``aws.stream_identifier``);
- a stream gone from the list, or found in the table but never listed (an orphan, read from
  ``orphaned_stream_initial_position`` meanwhile, as the KCL does), keeps being read until
  its leases are deleted, ``wait_period_to_delete_former_streams_ms`` after it was first
  seen gone (FORMER_STREAMS_AUTO_DETECTION_DEFERRED_DELETION); listed again before that, it
  stays. The wait is what keeps a worker whose list is older than another's from deleting
  the leases of a stream the other just added: make it much longer than the check interval.
- NO_STREAMS_LEASES_DELETION never deletes; PROVIDED_STREAMS_DEFERRED_DELETION deletes the
  streams ``streams_for_lease_cleanup`` names, after the same wait.
Every worker runs the check (we have no leader); deleting a lease twice is harmless.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence, Union

from ..aws.kinesis import KinesisClient
from ..aws.lease_table import Lease, LeaseTable
from ..aws.stream_identifier import StreamIdentifier, parse_stream_arn
from ..config import INITIAL_POSITIONS, ConsumerConfig
from ..errors import ConfigurationError, KinesisDStreamError
from .shard_sync import ShardSyncer

log = logging.getLogger(__name__)

AUTO_DETECTION = "FORMER_STREAMS_AUTO_DETECTION_DEFERRED_DELETION"
NO_DELETION = "NO_STREAMS_LEASES_DELETION"
PROVIDED = "PROVIDED_STREAMS_DEFERRED_DELETION"
DELETION_STRATEGIES = (AUTO_DETECTION, NO_DELETION, PROVIDED)


@dataclass(frozen=True)
class StreamConfig:
    """One stream to read: a name, an ARN or a serialized identifier
    (``account:name:creationEpoch``); its initial position (None: the worker config's) and,
    with fan-out, a consumer registered already (None: the application's, registered)."""

    stream: str
    initial_position: str | None = None
    initial_position_timestamp: float | None = None
    consumer_arn: str | None = None

    def __post_init__(self) -> None:
        if self.initial_position is not None and self.initial_position not in INITIAL_POSITIONS:
            raise ConfigurationError(f"initial_position of stream {self.stream!r} must be one of "
                                     f"{INITIAL_POSITIONS}, got {self.initial_position!r}")


StreamEntry = Union[str, StreamConfig]


@dataclass(frozen=True)
class MultiStreamTracker:
    """The streams to read: a list, or a callable returning the current list."""

    streams: Sequence[StreamEntry] | Callable[[], Iterable[StreamEntry]]
    former_streams_deletion: str = AUTO_DETECTION
    wait_period_to_delete_former_streams_ms: int = 3_600_000
    streams_for_lease_cleanup: Callable[[], Iterable[str]] | None = None
    stream_check_interval_ms: int = 60_000
    orphaned_stream_initial_position: str = "LATEST"

    def __post_init__(self) -> None:
        if self.former_streams_deletion not in DELETION_STRATEGIES:
            raise ConfigurationError(f"former_streams_deletion must be one of "
                                     f"{DELETION_STRATEGIES}, got {self.former_streams_deletion!r}")
        if self.former_streams_deletion == PROVIDED and self.streams_for_lease_cleanup is None:
            raise ConfigurationError(f"{PROVIDED} needs streams_for_lease_cleanup")
        if self.stream_check_interval_ms <= 0 or self.wait_period_to_delete_former_streams_ms < 0:
            raise ConfigurationError("stream_check_interval_ms must be positive and "
                                     "wait_period_to_delete_former_streams_ms not negative")
        if self.orphaned_stream_initial_position not in INITIAL_POSITIONS[:2]:
            raise ConfigurationError("orphaned_stream_initial_position must be LATEST or TRIM_HORIZON")

    def stream_configs(self) -> list[StreamConfig]:
        entries = self.streams() if callable(self.streams) else self.streams
        return [e if isinstance(e, StreamConfig) else StreamConfig(e) for e in entries]


@dataclass
class StreamState:
    """A stream being read: its identity, its config and client, its fan-out consumer."""

    identifier: StreamIdentifier
    config: ConsumerConfig
    kinesis: KinesisClient
    syncer: ShardSyncer
    consumer_arn: str | None = None


def fan_out_consumer(kinesis: KinesisClient, config: ConsumerConfig) -> str:
    """The ARN of the stream's fan-out consumer: the one ``config`` names (checked ACTIVE),
    else the application's, registered if missing. Never deregistered by a worker."""
    from ..aws.stream_consumer import check_stream_consumer, register_stream_consumer

    if config.consumer_arn is not None:
        arn = check_stream_consumer(kinesis, config.consumer_arn)
    else:
        arn = register_stream_consumer(kinesis, config.fan_out_consumer_name)
    log.info("worker %s reads by enhanced fan-out as consumer %s (stream %s)",
             config.worker_id, arn, config.stream_name)
    return arn


@dataclass
class StreamSync:
    """The worker's streams, checked on their interval; also the shard sync of them all."""

    config: ConsumerConfig
    tracker: MultiStreamTracker
    table: LeaseTable
    make_kinesis: Callable[[ConsumerConfig], KinesisClient] = KinesisClient
    clock: Callable[[], float] = time.monotonic
    streams: dict[StreamIdentifier, StreamState] = field(default_factory=dict)
    listed: set[StreamIdentifier] = field(default_factory=set)
    stale_since: dict[StreamIdentifier, float] = field(default_factory=dict)
    _resolved: dict[StreamConfig, StreamIdentifier] = field(default_factory=dict)
    _next_check: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the list ------------------------------------------------------------------------------
    def start(self) -> None:
        """The first check: every listed stream must exist (a wrong name fails the start)."""
        self.check(strict=True)

    def check_due(self) -> bool:
        """Check the list if its interval has passed; True if a check ran."""
        if self.clock() < self._next_check:
            return False
        self.check()
        return True

    def check(self, strict: bool = False) -> None:
        now = self.clock()
        self._next_check = now + self.tracker.stream_check_interval_ms / 1000.0
        wanted: dict[StreamIdentifier, StreamConfig] = {}
        for stream_config in self.tracker.stream_configs():
            try:
                wanted[self._identify(stream_config)] = stream_config
            except KinesisDStreamError as exc:
                if strict:
                    raise
                log.error("stream %s is listed but cannot be read (will try again): %s",
                          stream_config.stream, exc)
        leases = self.table.list_leases()
        for identifier, stream_config in wanted.items():
            if identifier not in self.streams:
                log.info("new stream to read: %s", identifier)
                self._add(identifier, stream_config)
        in_table = {i for i in (self._of(lease) for lease in leases) if i is not None}
        for orphan in in_table - set(wanted) - set(self.streams):
            log.info("stream %s has leases but is not listed: read from %s until they "
                     "are deleted", orphan, self.tracker.orphaned_stream_initial_position)
            self.stream_for(orphan)
        with self._lock:
            self.listed = set(wanted)
        self._enqueue_former(wanted, now)
        self._delete_due(leases, wanted, now)

    def _enqueue_former(self, wanted: dict[StreamIdentifier, StreamConfig], now: float) -> None:
        strategy = self.tracker.former_streams_deletion
        if strategy == AUTO_DETECTION:
            former = set(self.streams) - set(wanted)
        elif strategy == PROVIDED:
            assert self.tracker.streams_for_lease_cleanup is not None
            former = {StreamIdentifier.parse(text) for text in self.tracker.streams_for_lease_cleanup()
                      } - set(wanted)
        else:
            return
        for identifier in former:
            if identifier not in self.stale_since:
                log.warning("stream %s is no longer listed: its leases are deleted in %.0f s "
                            "unless it is listed again", identifier,
                            self.tracker.wait_period_to_delete_former_streams_ms / 1000.0)
                self.stale_since[identifier] = now
        for identifier in set(self.stale_since) & set(wanted):
            log.info("stream %s is listed again: its leases stay", identifier)
            del self.stale_since[identifier]

    def _delete_due(self, leases: list[Lease], wanted: dict, now: float) -> None:
        wait_s = self.tracker.wait_period_to_delete_former_streams_ms / 1000.0
        for identifier, since in list(self.stale_since.items()):
            if identifier in wanted or now - since < wait_s:
                continue
            mine = [lease for lease in leases if lease.stream_identifier == identifier.serialize()]
            try:
                for lease in mine:
                    self.table.delete_lease(lease)
            except KinesisDStreamError as exc:
                log.error("deleting the leases of former stream %s failed (will try again): %s",
                          identifier, exc)
                continue
            log.warning("deleted the %d leases of former stream %s", len(mine), identifier)
            del self.stale_since[identifier]
            with self._lock:
                self.streams.pop(identifier, None)

    # -- streams -------------------------------------------------------------------------------
    def _identify(self, stream_config: StreamConfig) -> StreamIdentifier:
        """A listed stream's identifier: as given, or completed from DescribeStreamSummary
        (account from the ARN, creation epoch in seconds), once per listed entry."""
        known = self._resolved.get(stream_config)
        if known is not None:
            return known
        text = stream_config.stream
        arn = parse_stream_arn(text)
        if arn is not None and arn.region != self.config.region_name:
            raise ConfigurationError(f"stream {text} is in {arn.region}; this worker reads "
                                     f"{self.config.region_name}")
        if arn is None and text.count(":") == 2:
            identifier = StreamIdentifier.parse(text)
        else:
            name = arn.stream_name if arn is not None else text
            summary = self.make_kinesis(self.config.replace(stream_name=name)).describe_stream_summary()
            account = parse_stream_arn(summary["StreamARN"])
            created = summary["StreamCreationTimestamp"]
            epoch = int(created.timestamp() if hasattr(created, "timestamp") else created)
            identifier = StreamIdentifier(account.account_id if account else "0", name,
                                          max(epoch, 1))
        self._resolved[stream_config] = identifier
        return identifier

    def _add(self, identifier: StreamIdentifier, stream_config: StreamConfig) -> StreamState:
        position = stream_config.initial_position or self.config.initial_position
        config = self.config.replace(
            stream_name=identifier.stream_name, initial_position=position,
            initial_position_timestamp=stream_config.initial_position_timestamp
            if stream_config.initial_position is not None else self.config.initial_position_timestamp,
            consumer_arn=stream_config.consumer_arn)
        kinesis = self.make_kinesis(config)
        arn = fan_out_consumer(kinesis, config) if config.retrieval_mode == "FANOUT" else None
        state = StreamState(identifier, config, kinesis,
                            ShardSyncer(config, kinesis, self.table, identifier), arn)
        with self._lock:
            self.streams[identifier] = state
        return state

    def stream_for(self, identifier: StreamIdentifier) -> StreamState:
        """The stream of a lease; one never listed is read as an orphan (the KCL's too)."""
        with self._lock:
            state = self.streams.get(identifier)
        if state is not None:
            return state
        return self._add(identifier, StreamConfig(
            identifier.serialize(), initial_position=self.tracker.orphaned_stream_initial_position))

    @staticmethod
    def _of(lease: Lease) -> StreamIdentifier | None:
        if lease.stream_identifier is None:
            return None
        try:
            return StreamIdentifier.parse(lease.stream_identifier)
        except ConfigurationError:
            return None

    # -- shard sync of every listed stream (the ShardSync the lease manager runs) --------------
    def sync(self) -> int:
        leases = self.table.list_leases()
        with self._lock:
            listed = [self.streams[i] for i in sorted(self.listed) if i in self.streams]
        created = 0
        for state in listed:
            try:
                created += state.syncer.sync(leases)
            except KinesisDStreamError as exc:
                log.error("shard sync of stream %s failed: %s", state.identifier, exc)
        return created
