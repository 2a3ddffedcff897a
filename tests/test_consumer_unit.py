"""ShardConsumer with a fake fetcher, processor and checkpoint store (tier 1, no AWS).

Each test runs one consumer thread with millisecond timings; waits poll a condition with a
deadline instead of sleeping a fixed time.
"""
from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable

import pytest

from waiting import wait_for

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import (
    CheckpointError,
    CredentialsError,
    LeaseLostError,
    RetriesExhaustedError,
    ThrottlingError,
)
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.records import GetRecordsResult, Record
from kinesis_dstream.worker.consumer import ConsumerState, ShardConsumer, ShutdownReason

pytestmark = pytest.mark.unit

SHARD = "shardId-000000000001"
BASE = 49590338271490256608559692538361571095921575989136588898


def seq(n: int) -> str:
    return str(BASE + n)


def wait_until(condition: Callable[[], Any], timeout: float = 5.0, what: str = "") -> None:
    wait_for(condition, timeout, what or str(condition), interval=0.002)


class Shard:
    """The data of one shard, shared by every fetcher the consumer makes."""

    def __init__(self, n_records: int, batch: int = 3, closed: bool = False,
                 children: list[str] | None = None):
        self.records = [Record(binary_data=f"r{i}".encode(), partition_key="k",
                               sequence_number=seq(i)) for i in range(1, n_records + 1)]
        self.batch = batch
        self.closed = closed
        self.children = children or []
        self.errors: list[BaseException] = []   # raised by the next get_records calls
        self.init_errors: list[BaseException] = []  # raised by the next initialize calls
        self.initialized_at: list[ESN] = []
        self.get_records_calls = 0
        self.lock = threading.Lock()


class FakeFetcher:
    pushes = False

    def __init__(self, shard: Shard):
        self.shard = shard
        self.position = 0

    def close(self) -> None:
        pass

    def initialize(self, checkpoint: ESN) -> None:
        with self.shard.lock:
            if self.shard.init_errors:
                raise self.shard.init_errors.pop(0)
        self.shard.initialized_at.append(checkpoint)
        if checkpoint.is_shard_end:
            self.position = len(self.shard.records)
        else:
            self.position = sum(1 for r in self.shard.records
                                if r.extended_sequence_number <= checkpoint)

    def get_records(self) -> GetRecordsResult:
        with self.shard.lock:
            self.shard.get_records_calls += 1
            if self.shard.errors:
                raise self.shard.errors.pop(0)
        batch = self.shard.records[self.position:self.position + self.shard.batch]
        self.position += len(batch)
        behind = (len(self.shard.records) - self.position) * 1000
        end = self.shard.closed and self.position >= len(self.shard.records)
        return GetRecordsResult(records=batch, millis_behind_latest=behind, shard_end=end,
                                child_shard_ids=list(self.shard.children) if end else [],
                                kinesis_records=len(batch))


class Store:
    """The lease's checkpoint, as the coordinator would keep it."""

    def __init__(self, start: ESN = ESN.TRIM_HORIZON):
        self.checkpoint = start
        self.writes: list[ESN] = []
        self.lost = False

    def read(self, shard_id: str) -> ESN:
        return self.checkpoint

    def write(self, shard_id: str, position: ESN) -> None:
        if self.lost:
            raise LeaseLostError(f"{shard_id} stolen")
        self.checkpoint = position
        self.writes.append(position)


class Processor:
    """Records every callback; behaviour switches are set by each test."""

    def __init__(self, log: list[tuple[int, str, Any]], number: int):
        self.log = log
        self.number = number
        self.records: list[Record] = []
        self.checkpointer: Any = None
        self.fail_on_batch: int | None = None
        self.checkpoint_each_batch = False
        self.checkpoint_at_shard_end_on_call = 1
        self.shard_end_calls = 0
        self.block: threading.Event | None = None
        self.lease_lost_checkpoint_error: str | None = None
        self.checkpoint_in_shutdown = True
        self.batches = 0
        self.millis: list[int | None] = []

    def initialize(self, i):
        self.log.append((self.number, "initialize", (i.shard_id, i.sequence_number,
                                                      i.sub_sequence_number)))

    def process_records(self, i):
        self.batches += 1
        self.checkpointer = i.checkpointer
        self.millis.append(i.millis_behind_latest)
        if self.block is not None:
            self.block.wait(5)
        if self.fail_on_batch is not None and self.batches >= self.fail_on_batch:
            raise RuntimeError("processor bug")
        self.records.extend(i.records)
        self.log.append((self.number, "process_records", len(i.records)))
        if self.checkpoint_each_batch and i.records:
            i.checkpointer.checkpoint()

    def lease_lost(self, i):
        self.log.append((self.number, "lease_lost", None))
        try:
            self.checkpointer.checkpoint()
        except CheckpointError as exc:
            self.lease_lost_checkpoint_error = exc.value

    def shard_ended(self, i):
        self.shard_end_calls += 1
        self.log.append((self.number, "shard_ended", None))
        if self.shard_end_calls >= self.checkpoint_at_shard_end_on_call:
            i.checkpointer.checkpoint()

    def shutdown_requested(self, i):
        self.log.append((self.number, "shutdown_requested", None))
        if self.checkpoint_in_shutdown:
            i.checkpointer.checkpoint()


class Harness:
    def __init__(self, shard: Shard, store: Store | None = None,
                 configure: Callable[[Processor], None] = lambda p: None, **config: Any):
        settings: dict[str, Any] = dict(application_name="a", stream_name="s", region_name="r",
                                        worker_id="w", idle_time_between_reads_ms=1,
                                        retry_wait_time_ms=1, parent_shard_poll_interval_ms=2)
        settings.update(config)
        self.config = ConsumerConfig(**settings)
        self.shard = shard
        self.store = store or Store()
        self.log: list[tuple[int, str, Any]] = []
        self.processors: list[Processor] = []
        self.configure = configure
        self.parents_ready = threading.Event()
        self.parents_ready.set()
        self.shard_ends: list[tuple[str, list[str], ESN]] = []
        self.consumer = ShardConsumer(
            self.config, SHARD, self.factory,
            make_fetcher=lambda shard_id: FakeFetcher(shard),
            read_checkpoint=self.store.read,
            write_checkpoint=self.store.write,
            parents_done=lambda shard_id: self.parents_ready.is_set(),
            on_shard_end=lambda shard_id, children: self.shard_ends.append(
                (shard_id, children, self.store.checkpoint)))

    def factory(self, shard_id: str) -> Processor:
        assert shard_id == SHARD
        processor = Processor(self.log, len(self.processors))
        self.configure(processor)
        self.processors.append(processor)
        return processor

    def delivered(self) -> list[str]:
        return [r.sequence_number for p in self.processors for r in p.records]

    def __enter__(self) -> "Harness":
        self.consumer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.consumer.request_shutdown()
        assert self.consumer.join(5), "consumer thread did not stop"


def test_records_are_delivered_in_order_then_shutdown_checkpoints():
    shard = Shard(10, batch=3)
    with Harness(shard) as h:
        wait_until(lambda: len(h.delivered()) == 10, what="10 records")
        assert h.consumer.state is ConsumerState.PROCESSING
        h.consumer.request_shutdown()
        assert h.consumer.join(5)
    assert h.delivered() == [seq(i) for i in range(1, 11)]
    (p,) = h.processors
    assert h.log[0] == (0, "initialize", (SHARD, "TRIM_HORIZON", 0))
    assert h.log[-1] == (0, "shutdown_requested", None)
    assert [e for _, e, _ in h.log].count("process_records") == 4  # 3 + 3 + 3 + 1
    # shutdown_requested got a working checkpointer: None = last delivered.
    assert h.store.checkpoint == ESN(seq(10))
    assert h.consumer.shutdown_reason is ShutdownReason.REQUESTED
    assert h.consumer.done
    assert h.consumer.records_delivered == 10
    # ... which is closed once shutdown is over.
    with pytest.raises(CheckpointError) as info:
        p.checkpointer.checkpoint()
    assert info.value.value == "ShutdownException"
    assert shard.initialized_at == [ESN.TRIM_HORIZON]


def test_starts_from_the_stored_checkpoint():
    shard = Shard(6, batch=10)
    with Harness(shard, Store(ESN(seq(4)))) as h:
        wait_until(lambda: len(h.delivered()) == 2)
    assert h.delivered() == [seq(5), seq(6)]
    assert h.log[0] == (0, "initialize", (SHARD, seq(4), 0))


def test_processor_failure_restarts_from_the_last_checkpoint():
    shard = Shard(9, batch=3)

    def configure(p: Processor) -> None:
        p.checkpoint_each_batch = True
        if p.number == 0:
            p.fail_on_batch = 2  # checkpoints batch 1 (seq 3), then raises on batch 2

    with Harness(shard, configure=configure) as h:
        wait_until(lambda: len(h.processors) == 2 and len(h.processors[1].records) == 6,
                   what="the replacement processor to read the rest")
    first, second = h.processors
    assert [r.sequence_number for r in first.records] == [seq(1), seq(2), seq(3)]
    # The failed batch (4..6) is delivered again: nothing after the checkpoint is lost.
    assert [r.sequence_number for r in second.records] == [seq(i) for i in range(4, 10)]
    assert shard.initialized_at == [ESN.TRIM_HORIZON, ESN(seq(3))]
    assert (1, "initialize", (SHARD, seq(3), 0)) in h.log
    # The failed processor's checkpointer was replaced: the new one starts at the checkpoint.
    assert h.consumer.checkpointer is not None
    assert h.consumer.checkpointer.last_checkpoint >= ESN(seq(3))


def test_a_processor_that_keeps_failing_is_restarted_after_growing_waits(caplog):
    """Equal jitter on 100 ms doubling: the waits' ranges do not overlap, so their order shows
    the growth; a batch processed without failing starts the waits again from 100 ms."""
    shard = Shard(6, batch=1)

    def configure(p: Processor) -> None:
        p.fail_on_batch = {0: 1, 1: 1, 2: 1, 3: 2}.get(p.number)

    with caplog.at_level("ERROR", logger="kinesis_dstream.worker.consumer"):
        with Harness(shard, configure=configure, retry_wait_time_ms=100) as h:
            wait_until(lambda: len(h.processors) == 5 and h.processors[4].records,
                       what="the fifth processor to read")
    waits = [float(m.group(1)) for m in (re.search(r"restarting it from checkpoint .* in (\S+) s$",
                                                   r.getMessage()) for r in caplog.records) if m]
    assert len(waits) == 4, waits
    assert 0.05 <= waits[0] <= 0.1 and 0.1 <= waits[1] <= 0.2 and 0.2 <= waits[2] <= 0.4
    assert 0.05 <= waits[3] <= 0.1   # processor 3 processed a batch before failing


def test_processor_failing_without_a_checkpoint_gets_everything_again():
    shard = Shard(4, batch=2)

    def configure(p: Processor) -> None:
        if p.number == 0:
            p.fail_on_batch = 2

    with Harness(shard, configure=configure) as h:
        wait_until(lambda: len(h.processors) == 2 and len(h.processors[1].records) == 4)
    assert [r.sequence_number for r in h.processors[1].records] == [seq(i) for i in range(1, 5)]
    assert shard.initialized_at == [ESN.TRIM_HORIZON, ESN.TRIM_HORIZON]


def test_shard_end_needs_the_shard_end_checkpoint_before_children_go():
    shard = Shard(5, batch=2, closed=True, children=["shardId-2", "shardId-3"])
    with Harness(shard) as h:
        wait_until(lambda: h.consumer.done, what="the shard to finish")
    (p,) = h.processors
    assert h.delivered() == [seq(i) for i in range(1, 6)]
    assert h.log[-1] == (0, "shard_ended", None)
    assert h.store.checkpoint == ESN.SHARD_END
    # on_shard_end came once, after SHARD_END was stored, with the children.
    assert h.shard_ends == [(SHARD, ["shardId-2", "shardId-3"], ESN.SHARD_END)]
    assert h.consumer.shutdown_reason is ShutdownReason.SHARD_END
    assert "shutdown_requested" not in [e for _, e, _ in h.log]


def test_shard_end_without_checkpoint_keeps_asking_and_children_wait():
    shard = Shard(2, batch=5, closed=True, children=["c"])

    def configure(p: Processor) -> None:
        p.checkpoint_at_shard_end_on_call = 3

    with Harness(shard, configure=configure) as h:
        wait_until(lambda: h.consumer.done, what="the third shard_ended call")
    (p,) = h.processors
    assert p.shard_end_calls == 3
    assert h.shard_ends == [(SHARD, ["c"], ESN.SHARD_END)]
    assert h.store.writes == [ESN.SHARD_END]


def test_shard_end_not_checkpointed_before_shutdown_never_reports_shard_end():
    shard = Shard(1, batch=5, closed=True)

    def configure(p: Processor) -> None:
        p.checkpoint_at_shard_end_on_call = 10**9  # never
        p.checkpoint_in_shutdown = False

    with Harness(shard, configure=configure) as h:
        wait_until(lambda: h.processors and h.processors[0].shard_end_calls >= 1)
        h.consumer.request_shutdown()
        assert h.consumer.join(5)
    assert h.shard_ends == []
    assert h.store.checkpoint != ESN.SHARD_END
    assert h.consumer.shutdown_reason is ShutdownReason.REQUESTED


def test_already_finished_shard_goes_straight_to_shard_end():
    shard = Shard(3, closed=True)
    with Harness(shard, Store(ESN.SHARD_END)) as h:
        wait_until(lambda: h.consumer.done)
    assert h.delivered() == []
    assert h.shard_ends and h.shard_ends[0][2] == ESN.SHARD_END


def test_lease_lost_tells_the_processor_and_refuses_checkpoints():
    shard = Shard(4, batch=2)
    with Harness(shard) as h:
        wait_until(lambda: len(h.delivered()) == 4)
        h.store.lost = True  # another worker holds the lease now
        h.consumer.lease_lost()
        assert h.consumer.join(5)
    (p,) = h.processors
    assert h.log[-1] == (0, "lease_lost", None)
    assert p.lease_lost_checkpoint_error == "ShutdownException"
    assert "shutdown_requested" not in [e for _, e, _ in h.log]
    assert h.store.writes == []
    with pytest.raises(CheckpointError) as info:
        p.checkpointer.checkpoint(seq(2))
    assert info.value.value == "ShutdownException"
    assert h.consumer.shutdown_reason is ShutdownReason.LEASE_LOST


def test_lease_lost_checkpoint_refused_even_if_the_table_would_accept_it():
    # The consumer closes the checkpointer itself: no write reaches the table after lease_lost().
    shard = Shard(2, batch=2)
    with Harness(shard) as h:
        wait_until(lambda: len(h.delivered()) == 2)
        h.consumer.lease_lost()
        assert h.consumer.join(5)
    assert h.store.writes == []
    assert h.processors[0].lease_lost_checkpoint_error == "ShutdownException"


def test_lease_lost_while_process_records_blocks():
    shard = Shard(4, batch=2)
    gate = threading.Event()

    def configure(p: Processor) -> None:
        p.block = gate

    with Harness(shard, configure=configure) as h:
        wait_until(lambda: h.processors and h.processors[0].batches == 1)
        h.consumer.lease_lost()
        gate.set()
        assert h.consumer.join(5)
    (p,) = h.processors
    assert [e for _, e, _ in h.log] == ["initialize", "process_records", "lease_lost"]
    with pytest.raises(CheckpointError) as info:
        p.checkpointer.checkpoint()
    assert info.value.value == "ShutdownException"


def test_checkpoint_that_finds_the_lease_lost_is_a_shutdown_exception():
    shard = Shard(3, batch=3)
    errors: list[str] = []

    def configure(p: Processor) -> None:
        original = p.process_records

        def process_records(i):
            original(i)
            try:
                i.checkpointer.checkpoint()
            except CheckpointError as exc:
                errors.append(exc.value)

        p.process_records = process_records  # type: ignore[method-assign]

    store = Store()
    store.lost = True
    with Harness(shard, store, configure=configure):
        wait_until(lambda: errors)
    assert errors == ["ShutdownException"]


def test_request_shutdown_gives_a_working_checkpointer():
    shard = Shard(5, batch=5)

    def configure(p: Processor) -> None:
        p.checkpoint_in_shutdown = True

    with Harness(shard, configure=configure) as h:
        wait_until(lambda: len(h.delivered()) >= 4)
        assert h.store.writes == []  # the processor did not checkpoint while processing
        h.consumer.request_shutdown()
        assert h.consumer.join(5)
    assert h.store.writes == [ESN(seq(5))]
    assert h.log[-1] == (0, "shutdown_requested", None)


def test_get_records_errors_are_retried_without_losing_records():
    shard = Shard(9, batch=2)
    shard.errors = [ThrottlingError("slow down"),
                    RetriesExhaustedError("Gave up after 3 attempts while reading"),
                    ThrottlingError("again")]
    with Harness(shard) as h:
        wait_until(lambda: len(h.delivered()) >= 4)
        with shard.lock:
            shard.errors.extend([ThrottlingError("mid-stream"),
                                 RetriesExhaustedError("Gave up after 3 attempts")])
        wait_until(lambda: len(h.delivered()) == 9)
    assert h.delivered() == [seq(i) for i in range(1, 10)]  # each once, in order
    assert len(h.processors) == 1                            # no restart for fetch errors
    assert shard.initialized_at == [ESN.TRIM_HORIZON]
    assert shard.errors == []


def test_a_lasting_fetch_fault_is_logged_once_with_a_count_and_when_it_clears(caplog):
    shard = Shard(4, batch=2)
    shard.errors = [RetriesExhaustedError(f"Gave up after 3 attempts ({n})") for n in range(6)]
    with caplog.at_level("WARNING", logger="kinesis_dstream.worker.consumer"):
        with Harness(shard) as h:
            wait_until(lambda: len(h.delivered()) == 4)
    lines = [r.getMessage() for r in caplog.records if "GetRecords" in r.getMessage()]
    assert len(lines) == 2, lines    # six failures within a minute: the first, then "works"
    assert lines[0].startswith(f"shard {SHARD}: GetRecords failing: Gave up after 3 attempts (0); "
                               "trying again in 0.00")
    assert lines[1].startswith(f"shard {SHARD}: GetRecords works again after 6 failures in ")
    assert lines[1].endswith(" s (5 since the last line)")


def test_waits_for_parents_before_making_a_processor():
    shard = Shard(2)
    h = Harness(shard)
    h.parents_ready.clear()
    with h:
        time.sleep(0.05)
        assert h.processors == [] and shard.get_records_calls == 0
        assert h.consumer.state is ConsumerState.WAITING_ON_PARENTS
        h.parents_ready.set()
        wait_until(lambda: len(h.delivered()) == 2)


def test_shutdown_while_waiting_on_parents():
    shard = Shard(2)
    h = Harness(shard)
    h.parents_ready.clear()
    h.consumer.start()
    time.sleep(0.02)
    h.consumer.request_shutdown()
    assert h.consumer.join(5)
    assert h.processors == []
    assert h.consumer.done


def test_a_blocking_process_records_stops_fetching():
    shard = Shard(6, batch=2)
    gate = threading.Event()

    def configure(p: Processor) -> None:
        p.block = gate

    with Harness(shard, configure=configure) as h:
        wait_until(lambda: h.processors and h.processors[0].batches == 1)
        calls = shard.get_records_calls
        time.sleep(0.05)
        assert shard.get_records_calls == calls  # backpressure: no reads meanwhile
        gate.set()
        wait_until(lambda: len(h.delivered()) == 6)


def test_empty_batches_are_skipped_unless_asked_for():
    shard = Shard(0)
    with Harness(shard) as h:
        wait_until(lambda: shard.get_records_calls >= 5)
    assert h.processors[0].batches == 0

    shard = Shard(0)
    with Harness(shard, call_process_records_even_for_empty_record_list=True) as h:
        wait_until(lambda: h.processors and h.processors[0].batches >= 2)


def test_millis_behind_latest_reaches_the_processor_and_metrics():
    shard = Shard(4, batch=2)
    with Harness(shard) as h:
        # records_delivered counts after process_records returns: wait for it, not the processor.
        wait_until(lambda: h.consumer.records_delivered == 4)
        metrics = h.consumer.metrics(owner="w")
    assert h.processors[0].millis[:2] == [2000, 0]
    assert metrics.millis_behind_latest == 0
    assert metrics.records == 4
    assert metrics.owner == "w"
    assert metrics.last_delivered == f"{seq(4)}/0"
    assert metrics.shard_id == SHARD


def test_processor_raising_in_shard_ended_is_replaced_and_the_shard_still_finishes():
    shard = Shard(4, batch=2, closed=True, children=["c"])

    def configure(p: Processor) -> None:
        p.checkpoint_each_batch = True
        if p.number == 0:
            def broken(i):
                raise RuntimeError("bug in shard_ended")
            p.shard_ended = broken  # type: ignore[method-assign]

    with Harness(shard, configure=configure) as h:
        wait_until(lambda: h.consumer.done, what="the replacement to finish the shard")
    assert len(h.processors) == 2
    assert shard.initialized_at == [ESN.TRIM_HORIZON, ESN(seq(4))]
    assert h.processors[1].records == []       # everything was checkpointed: no replay
    assert h.shard_ends == [(SHARD, ["c"], ESN.SHARD_END)]


def test_getting_the_first_iterator_is_retried_through_throttling():
    shard = Shard(3, batch=3)
    shard.init_errors = [ThrottlingError("slow down"),
                         RetriesExhaustedError("Gave up after 3 attempts while getting an iterator")]
    with Harness(shard) as h:
        wait_until(lambda: len(h.delivered()) == 3)
    assert shard.initialized_at == [ESN.TRIM_HORIZON]
    assert len(h.processors) == 1
    assert [e for _, e, _ in h.log][:1] == ["initialize"]


def test_processor_raising_in_initialize_is_replaced():
    shard = Shard(3, batch=3)

    def configure(p: Processor) -> None:
        if p.number == 0:
            def broken(i):
                raise RuntimeError("cannot connect to my database")
            p.initialize = broken  # type: ignore[method-assign]

    with Harness(shard, configure=configure) as h:
        wait_until(lambda: len(h.processors) == 2 and len(h.processors[1].records) == 3)
    assert h.processors[0].records == []
    assert h.processors[0].batches == 0


def test_lease_loss_reported_from_inside_a_checkpoint_does_not_deadlock():
    """The real writer (LeaseCoordinator.checkpoint) tells the consumer of the loss before it
    raises, so close() runs on the processor's thread while checkpoint() is in progress."""
    shard = Shard(4, batch=2)
    outcome: list[str] = []
    holder: dict[str, Harness] = {}

    class ReportingStore(Store):
        def write(self, shard_id: str, position: ESN) -> None:
            holder["h"].consumer.lease_lost()
            raise LeaseLostError(f"{shard_id} stolen")

    def configure(p: Processor) -> None:
        original = p.process_records

        def process_records(i):
            original(i)
            try:
                i.checkpointer.checkpoint()
                outcome.append("written")
            except CheckpointError as exc:
                outcome.append(exc.value)

        p.process_records = process_records  # type: ignore[method-assign]

    h = Harness(shard, ReportingStore(), configure=configure)
    holder["h"] = h
    with h:
        wait_until(lambda: h.consumer.done, timeout=5, what="the consumer to stop (deadlock?)")
    assert outcome == ["ShutdownException"]
    assert [e for _, e, _ in h.log][-1] == "lease_lost"
    assert h.consumer.shutdown_reason is ShutdownReason.LEASE_LOST


# -- lease loss meets a failing processor: the KCL lifecycle still ends with lease_lost ---------

def _record_close(p: Processor) -> None:
    p.close = lambda: p.log.append((p.number, "close", None))  # type: ignore[attr-defined]


def test_processor_raising_after_its_lease_was_lost_gets_lease_lost_and_no_replacement():
    """The common case: lease lost mid-batch, the processor's checkpoint raises
    ShutdownException and the processor lets it propagate."""
    shard = Shard(6, batch=2)
    holder: dict[str, Harness] = {}

    def configure(p: Processor) -> None:
        _record_close(p)
        original = p.process_records

        def process_records(i):
            original(i)
            holder["h"].store.lost = True
            holder["h"].consumer.lease_lost()   # the renewer found the lease gone meanwhile
            i.checkpointer.checkpoint()         # raises CheckpointError(ShutdownException)

        p.process_records = process_records  # type: ignore[method-assign]

    h = Harness(shard, configure=configure)
    holder["h"] = h
    with h:
        wait_until(lambda: h.consumer.done, what="the consumer to stop")
    assert len(h.processors) == 1, "a processor was restarted after the lease was lost"
    assert [e for _, e, _ in h.log] == ["initialize", "process_records", "lease_lost", "close"]
    assert h.processors[0].lease_lost_checkpoint_error == "ShutdownException"
    assert h.consumer.shutdown_reason is ShutdownReason.LEASE_LOST
    assert h.store.writes == []
    assert shard.initialized_at == [ESN.TRIM_HORIZON]  # no second iterator either


def test_lease_lost_during_the_restart_back_off_ends_the_shard_with_lease_lost():
    shard = Shard(6, batch=2)

    def configure(p: Processor) -> None:
        _record_close(p)
        p.fail_on_batch = 1  # a plain bug, while the lease is still held

    # A long back-off: the lease is lost while the consumer waits to restart the processor.
    with Harness(shard, configure=configure, retry_wait_time_ms=30_000) as h:
        wait_until(lambda: h.processors and h.processors[0].batches == 1, what="the failure")
        time.sleep(0.02)
        h.store.lost = True
        h.consumer.lease_lost()
        assert h.consumer.join(5), "the back-off was not cut short by the lease loss"
    assert len(h.processors) == 1
    assert [e for _, e, _ in h.log] == ["initialize", "lease_lost", "close"]
    assert h.consumer.shutdown_reason is ShutdownReason.LEASE_LOST
    assert shard.initialized_at == [ESN.TRIM_HORIZON]


def test_processor_raising_in_initialize_after_lease_loss_gets_lease_lost():
    shard = Shard(2, batch=2)
    holder: dict[str, Harness] = {}

    def configure(p: Processor) -> None:
        _record_close(p)

        def initialize(i):
            p.log.append((p.number, "initialize", None))
            holder["h"].consumer.lease_lost()
            raise RuntimeError("lost my connection too")

        p.initialize = initialize  # type: ignore[method-assign]

    h = Harness(shard, configure=configure)
    holder["h"] = h
    with h:
        wait_until(lambda: h.consumer.done)
    assert len(h.processors) == 1
    assert [e for _, e, _ in h.log] == ["initialize", "lease_lost", "close"]


def test_shutdown_during_the_restart_back_off_closes_the_failed_processor_without_checkpointing():
    """shutdown_requested would let a processor that failed mid-batch checkpoint the batch."""
    shard = Shard(4, batch=2)

    def configure(p: Processor) -> None:
        _record_close(p)
        p.fail_on_batch = 1

    with Harness(shard, configure=configure, retry_wait_time_ms=30_000) as h:
        wait_until(lambda: h.processors and h.processors[0].batches == 1, what="the failure")
        time.sleep(0.02)
        h.consumer.request_shutdown()
        assert h.consumer.join(5)
    assert len(h.processors) == 1
    assert [e for _, e, _ in h.log] == ["initialize", "close"]
    assert h.store.writes == []
    assert h.consumer.shutdown_reason is ShutdownReason.REQUESTED


def test_no_processor_is_made_when_the_lease_is_lost_before_the_shard_could_start():
    shard = Shard(2)
    shard.init_errors = [ThrottlingError("slow down")] * 1000
    with Harness(shard, retry_wait_time_ms=20) as h:
        wait_until(lambda: len(shard.init_errors) < 1000, what="the first iterator attempt")
        h.consumer.lease_lost()
        assert h.consumer.join(5)
    assert h.processors == []
    assert h.consumer.shutdown_reason is ShutdownReason.LEASE_LOST


def test_lease_found_gone_when_reading_the_checkpoint_is_a_lease_loss():
    shard = Shard(2)

    class GoneStore(Store):
        def read(self, shard_id: str) -> ESN:
            raise LeaseLostError(f"lease {shard_id} is no longer held")

    with Harness(shard, GoneStore()) as h:
        wait_until(lambda: h.consumer.done)
    assert h.processors == []
    assert h.consumer.shutdown_reason is ShutdownReason.LEASE_LOST


def test_a_throttled_read_waits_the_throttle_pause_other_faults_back_off(monkeypatch):
    """A refusal for throughput waits ``throttle_wait_s`` (about a second, as the executors'
    reads), not the exponential backoff that starts at retry.waitTime; other faults back off."""
    import kinesis_dstream.retrieval.pacer as pacer_module

    pauses: list[str] = []
    monkeypatch.setattr(pacer_module, "throttle_wait_s", lambda: pauses.append("t") or 0.01)
    shard = Shard(4, batch=2)
    shard.init_errors = [ThrottlingError("slow down")]
    shard.errors = [ThrottlingError("slow down"), RetriesExhaustedError("Gave up after 3 attempts"),
                    ThrottlingError("again")]
    with Harness(shard) as h:
        wait_until(lambda: len(h.delivered()) == 4)
    assert pauses == ["t", "t", "t"]  # the iterator's refusal and two GetRecords refusals
    assert h.delivered() == [seq(i) for i in range(1, 5)]


def test_a_permanent_read_error_stops_the_consumer_at_once_and_the_processor_gets_lease_lost():
    """AccessDenied is not waited out while the lease is held: FAILED, naming the cause."""
    shard = Shard(6, batch=2)
    shard.errors = [CredentialsError("GetRecords: AccessDeniedException: no"),
                    ThrottlingError("never reached")]
    with Harness(shard) as h:
        assert h.consumer.join(5), "a permanent error must end the consumer"
    assert h.consumer.shutdown_reason is ShutdownReason.FAILED
    assert isinstance(h.consumer.failure, CredentialsError)
    assert h.log[-1] == (0, "lease_lost", None)
    assert len(shard.errors) == 1  # tried once, never again
    assert h.delivered() == []
    assert h.store.writes == []
