"""The worker's scheduler loop (the KCL's Scheduler), without the KCL's start-up sleeps.

At start it checks the stream, creates the lease table if needed, syncs shards and takes
leases in its first pass, so the first lease is read at once. Then it loops: shard sync
on its interval or at a shard end, lease taking on its interval, one ShardConsumer per held
lease. On a graceful shutdown each processor gets shutdown_requested, then every lease is
released for the next worker to take at once.

With fan-out (``retrieval_mode`` FANOUT) the start also registers the application's consumer
(or checks the one named by ``consumer_arn``), once, and never deregisters it, as the KCL;
each shard consumer then reads through its own subscription. Leases and checkpoints are the
same either way: a lease taken from another worker subscribes at its checkpoint, which takes
the shard's subscription over (Kinesis' 5 s rule), and the old owner closes its own when it
sees the lease lost.

Given ``streams`` (a ``MultiStreamTracker``, a list of streams, or a callable returning
one) the scheduler runs in the KCL's multi-stream mode: leases are keyed
``account:stream:creationEpoch:shardId`` in one table for all streams, the list is checked
again on its interval (``streams.StreamSync``), and each lease is read through its own
stream's client, config and fan-out consumer. A processor factory is then called with the
lease key (the KCL hands its factory the stream); ``InitializeInput`` carries the shard id
and the stream identifier.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from ..aws.lease_table import Lease, LeaseTable
from ..aws.stream_identifier import StreamIdentifier
from ..config import ConsumerConfig
from ..errors import LeaseLostError
from ..records import ExtendedSequenceNumber
from ..retrieval.source import RecordSource, open_source
from .consumer import ConsumerState, ShardConsumer, ShutdownReason
from .lease_loop import lease_loop_backoff, run_lease_loop
from .lease_manager import LeaseManager
from .leases import LeaseCoordinator, parents_done
from .metrics import MetricsPublisher
from .processor import ProcessorFactory
from .shard_sync import ShardSyncer
from .stall import ShardsView, StallWatch, largest_lag
from .streams import MultiStreamTracker, StreamEntry, StreamSync, fan_out_consumer

if TYPE_CHECKING:
    from ..aws.kinesis import KinesisClient

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, config: ConsumerConfig, processor_factory: ProcessorFactory, *,
                 kinesis: KinesisClient | None = None, lease_table: LeaseTable | None = None,
                 metrics: MetricsPublisher | None = None,
                 streams: MultiStreamTracker | Sequence[StreamEntry]
                 | Callable[[], Iterable[StreamEntry]] | None = None):
        from ..aws.kinesis import KinesisClient  # the AWS layer, built when we start

        self.config = config
        self._processor_factory = processor_factory
        self.table = lease_table if lease_table is not None else LeaseTable(config)
        # Multi-stream mode sees only multi-stream leases, single-stream mode only the others:
        # an application cannot switch between the two and keep its checkpoints (KCL FAQ).
        self.multi_stream = streams is not None
        self.coordinator = LeaseCoordinator(config, self.table, on_lease_lost=self._lease_lost,
                                            accepts=self._accepts)
        self.streams: StreamSync | None = None
        if streams is None:
            self.kinesis = kinesis if kinesis is not None else KinesisClient(config)
            self.syncer: ShardSyncer | StreamSync = ShardSyncer(config, self.kinesis, self.table)
        else:
            tracker = streams if isinstance(streams, MultiStreamTracker) else MultiStreamTracker(streams)
            self.streams = StreamSync(config, tracker, self.table)
            self.syncer = self.streams
        self.lease_manager = LeaseManager(config, self.coordinator, self.syncer)
        self._consumers: dict[str, ShardConsumer] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.started_at: float | None = None
        self.consumer_arn: str | None = None  # the fan-out consumer, once registered
        # Built in start(): CloudWatch is only contacted by a worker that runs.
        self._metrics = metrics
        self._owns_metrics = metrics is None
        self.stalls = StallWatch.of(config, f"worker {config.worker_id}")

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Check the stream and the table, then run the loop on a background thread.

        A wrong stream name, missing credentials or a dead endpoint raise here, within the
        retry policy's bounded time, before any thread is started.
        """
        self.started_at = time.monotonic()
        if self.streams is None:
            self.kinesis.describe_stream_summary()
            if self.config.retrieval_mode == "FANOUT":
                self.consumer_arn = fan_out_consumer(self.kinesis, self.config)
            self.table.create_table_if_not_exists()
        else:
            self.table.create_table_if_not_exists()
            self.streams.start()
        self.syncer.sync()
        self.coordinator.start_renewer()
        if self._metrics is None:
            self._metrics = MetricsPublisher(self.config)
        self.lease_manager.metrics = self._metrics
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._thread.start()
        log.info("worker %s started on %s (application %s)", self.config.worker_id,
                 f"stream {self.config.stream_name}" if self.streams is None else
                 f"streams {', '.join(map(str, sorted(self.streams.listed)))}",
                 self.config.application_name)

    def run(self) -> None:
        if self._thread is None:
            self.start()
        self._stopped.wait()

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Graceful stop; True if every processor finished within the time allowed."""
        timeout = self.config.shutdown_grace_ms / 1000.0 if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            consumers = list(self._consumers.values())
        for consumer in consumers:
            consumer.request_shutdown()
        finished = [consumer.join(max(deadline - time.monotonic(), 0.1)) for consumer in consumers]
        clean = all(finished)
        if not clean:
            log.warning("some record processors did not finish within %.1f s", timeout)
        for shard_id in self.coordinator.owned_shard_ids():
            self.coordinator.release(shard_id)
        self.coordinator.stop()
        if self._metrics is not None and self._owns_metrics:
            self._metrics.close()
        self._stopped.set()
        log.info("worker %s stopped", self.config.worker_id)
        return clean

    def _accepts(self, lease: Lease) -> bool:
        return (lease.stream_identifier is not None) == self.multi_stream

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        run_lease_loop(self.lease_manager, self._reconcile,
                       what=f"worker {self.config.worker_id}: scheduler pass", stop=self._stop,
                       waiting_on_parents=self._any_waiting_on_parents,
                       backoff=lease_loop_backoff(self.config))

    def _any_waiting_on_parents(self) -> bool:
        with self._lock:
            return any(c.state is ConsumerState.WAITING_ON_PARENTS for c in self._consumers.values())

    def _reconcile(self) -> None:
        """Start a consumer for each new lease; clean up after finished ones."""
        if self.streams is not None and self.streams.check_due():
            self.lease_manager.sync_soon()
        owned = set(self.coordinator.owned_shard_ids())
        with self._lock:
            for shard_id, consumer in list(self._consumers.items()):
                if consumer.done:
                    del self._consumers[shard_id]
                    if consumer.shutdown_reason is ShutdownReason.FAILED:
                        # Unreadable here (AccessDenied, ...): released, and left to other
                        # workers for two failover times before this one tries it again.
                        self.coordinator.hold_off(shard_id, 2 * self.config.failover_time_ms / 1000)
                    if consumer.shutdown_reason is not ShutdownReason.LEASE_LOST:
                        # Finished (SHARD_END), failed or crashed: give it back.
                        self.coordinator.release(shard_id)
                    owned.discard(shard_id)
            for shard_id in sorted(owned - set(self._consumers)):
                lease = self.coordinator.owned_lease(shard_id)
                if lease is None:
                    continue
                if lease.is_finished:
                    self.coordinator.release(shard_id)
                    continue
                stream = (None if lease.stream_identifier is None
                          else StreamIdentifier.parse(lease.stream_identifier))
                consumer = ShardConsumer(
                    self.config, shard_id, self._processor_factory,
                    stream_identifier=stream,
                    make_fetcher=self._make_fetcher,
                    read_checkpoint=self._read_checkpoint,
                    write_checkpoint=self.coordinator.checkpoint,
                    parents_done=self._parents_done,
                    on_shard_end=self._shard_ended,
                    metrics=self._metrics)
                self._consumers[shard_id] = consumer
                consumer.start()
            self._watch_stalls()

    def _watch_stalls(self) -> None:
        """Each pass: every consumer's lag and last delivered position to the stall rule."""
        self.stalls.retain(self._consumers)
        for shard_id, consumer in self._consumers.items():
            view = consumer.metrics(None)
            self.stalls.observe(shard_id, view.millis_behind_latest, view.last_delivered)

    # -- callbacks from consumers and the renewer ------------------------------------------------
    def _make_fetcher(self, shard_id: str) -> RecordSource:
        if self.streams is None:
            return open_source(self.kinesis, self.config, shard_id, reports_data_loss=True,
                               consumer_arn=self.consumer_arn)
        lease = self.coordinator.owned_lease(shard_id)
        if lease is None:
            raise LeaseLostError(f"lease {shard_id} is no longer held")
        stream = self.streams.stream_for(StreamIdentifier.parse(lease.stream_identifier or ""))
        return open_source(stream.kinesis, stream.config, lease.shard_id, reports_data_loss=True,
                           consumer_arn=stream.consumer_arn)

    def _read_checkpoint(self, shard_id: str) -> ExtendedSequenceNumber:
        lease = self.coordinator.owned_lease(shard_id)
        if lease is None:
            raise LeaseLostError(f"lease {shard_id} is no longer held")
        return lease.checkpoint

    def _parents_done(self, shard_id: str) -> bool:
        leases = self.coordinator.known_leases()
        lease = leases.get(shard_id)
        return lease is None or parents_done(lease, leases)

    def _shard_ended(self, shard_id: str, child_shard_ids: list[str]) -> None:
        log.info("shard %s ended; children %s", shard_id, child_shard_ids or "unknown yet")
        self.coordinator.record_children(shard_id, child_shard_ids)
        self.lease_manager.sync_soon()

    def _lease_lost(self, shard_id: str) -> None:
        with self._lock:
            consumer = self._consumers.get(shard_id)
        if consumer is not None:
            consumer.lease_lost()

    # -- visibility ---------------------------------------------------------------------------
    def metrics(self) -> ShardsView:
        """Per shard this worker processes: records, lag, owner and last checkpoint; and as
        attributes the largest lag, the stalled shards and the stall count (``ShardsView``)."""
        with self._lock:
            consumers = dict(self._consumers)
        shards = {shard_id: consumer.metrics(self.config.worker_id
                                             if self.coordinator.owned_lease(shard_id) else None)
                  for shard_id, consumer in consumers.items()}
        return ShardsView(shards, largest_lag(m.millis_behind_latest for m in shards.values()),
                          self.stalls.stalled, self.stalls.stalls)
