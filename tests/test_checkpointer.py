"""ShardCheckpointer: which positions may be checkpointed and when (tier 1, fake writer)."""
from __future__ import annotations

import threading

import pytest

from kinesis_dstream.errors import (
    CheckpointError,
    EndpointUnreachableError,
    LeaseLostError,
    RetriesExhaustedError,
    ThrottlingError,
    TransientServiceError,
    UnreachableAfterRetriesError,
)
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.records import Record
from kinesis_dstream.worker.checkpoint import ShardCheckpointer

pytestmark = pytest.mark.unit

BASE = 49590338271490256608559692538361571095921575989136588898


def seq(n: int) -> str:
    return str(BASE + n)


def rec(n: int, sub: int = 0, aggregated: bool = False) -> Record:
    return Record(binary_data=b"x", partition_key="k", sequence_number=seq(n),
                  sub_sequence_number=sub, aggregated=aggregated)


class Writer:
    def __init__(self):
        self.writes: list[tuple[str, ESN]] = []
        self.fail_with: BaseException | None = None

    def __call__(self, shard_id: str, position: ESN) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.writes.append((shard_id, position))


@pytest.fixture
def writer() -> Writer:
    return Writer()


def make(writer: Writer, last: ESN = ESN.TRIM_HORIZON) -> ShardCheckpointer:
    return ShardCheckpointer("shard-1", writer, last)


def error_value(fn, *args) -> str:
    with pytest.raises(CheckpointError) as info:
        fn(*args)
    return info.value.value


def test_none_means_last_delivered(writer):
    cp = make(writer)
    cp.delivered([rec(1), rec(2), rec(3)])
    cp.checkpoint()
    assert writer.writes == [("shard-1", ESN(seq(3)))]
    assert cp.last_checkpoint == ESN(seq(3))


def test_none_before_anything_delivered_writes_nothing(writer):
    cp = make(writer)
    cp.checkpoint()
    assert writer.writes == []
    assert cp.last_checkpoint == ESN.TRIM_HORIZON


def test_same_position_twice_is_written_once(writer):
    cp = make(writer)
    cp.delivered([rec(1)])
    cp.checkpoint()
    cp.checkpoint()
    cp.checkpoint(seq(1))
    assert len(writer.writes) == 1


def test_explicit_position_within_the_delivered_range(writer):
    cp = make(writer)
    cp.delivered([rec(1), rec(2), rec(3)])
    cp.checkpoint(seq(2))
    cp.checkpoint(seq(3), 0)
    assert [w[1] for w in writer.writes] == [ESN(seq(2)), ESN(seq(3))]


def test_beyond_last_delivered_is_illegal(writer):
    cp = make(writer)
    assert error_value(cp.checkpoint, seq(1)) == "IllegalArgumentException"  # nothing delivered
    cp.delivered([rec(1), rec(2)])
    assert error_value(cp.checkpoint, seq(3)) == "IllegalArgumentException"
    assert error_value(cp.checkpoint, seq(2), 1) == "IllegalArgumentException"
    assert writer.writes == []


def test_below_last_checkpoint_is_illegal(writer):
    cp = make(writer, last=ESN(seq(5)))
    cp.delivered([rec(6), rec(7)])
    assert error_value(cp.checkpoint, seq(4)) == "IllegalArgumentException"
    cp.checkpoint(seq(7))
    assert error_value(cp.checkpoint, seq(6)) == "IllegalArgumentException"
    assert cp.last_checkpoint == ESN(seq(7))
    assert [w[1] for w in writer.writes] == [ESN(seq(7))]


@pytest.mark.parametrize("bad", ["abc", "", "-5", "1.5", " 12", "TRIM_HORIZON", "LATEST",
                                 "\u00b2", 12345])
def test_malformed_sequence_numbers_are_illegal(writer, bad):
    cp = make(writer)
    cp.delivered([rec(1)])
    assert error_value(cp.checkpoint, bad) == "IllegalArgumentException"
    assert writer.writes == []


@pytest.mark.parametrize("bad_sub", [-1, "3", 1.5])
def test_malformed_sub_sequence_numbers_are_illegal(writer, bad_sub):
    cp = make(writer)
    cp.delivered([rec(1, 5, aggregated=True)])
    assert error_value(cp.checkpoint, seq(1), bad_sub) == "IllegalArgumentException"


def test_shard_end_only_after_the_shard_ended(writer):
    cp = make(writer)
    cp.delivered([rec(1)])
    assert error_value(cp.checkpoint, "SHARD_END") == "IllegalArgumentException"
    cp.reached_shard_end()
    cp.checkpoint()  # None at shard end means SHARD_END
    assert writer.writes == [("shard-1", ESN.SHARD_END)]
    assert cp.last_checkpoint.is_shard_end


def test_explicit_shard_end_after_the_shard_ended(writer):
    cp = make(writer)
    cp.reached_shard_end()
    cp.checkpoint("SHARD_END")
    assert writer.writes == [("shard-1", ESN.SHARD_END)]


def test_nothing_goes_back_from_shard_end(writer):
    cp = make(writer)
    cp.delivered([rec(1), rec(2)])
    cp.reached_shard_end()
    cp.checkpoint()
    assert error_value(cp.checkpoint, seq(2)) == "IllegalArgumentException"
    assert cp.last_checkpoint.is_shard_end
    assert writer.writes == [("shard-1", ESN.SHARD_END)]


def test_aggregated_sequence_without_sub_means_its_last_delivered_sub(writer):
    cp = make(writer)
    cp.delivered([rec(1, 0, True), rec(1, 1, True), rec(1, 2, True), rec(2, 0, True),
                  rec(2, 1, True)])
    cp.checkpoint(seq(1))
    assert writer.writes[-1][1] == ESN(seq(1), 2)
    cp.checkpoint(seq(2))
    assert writer.writes[-1][1] == ESN(seq(2), 1)


def test_aggregate_delivered_in_parts_uses_the_latest_part(writer):
    cp = make(writer)
    cp.delivered([rec(1, 0, True), rec(1, 1, True)])
    cp.checkpoint(seq(1))
    assert writer.writes[-1][1] == ESN(seq(1), 1)
    cp.delivered([rec(1, 2, True), rec(1, 3, True)])
    cp.checkpoint(seq(1))
    assert writer.writes[-1][1] == ESN(seq(1), 3)


def test_explicit_sub_inside_an_aggregate(writer):
    cp = make(writer)
    cp.delivered([rec(1, s, True) for s in range(5)])
    cp.checkpoint(seq(1), 2)
    assert writer.writes[-1][1] == ESN(seq(1), 2)
    assert error_value(cp.checkpoint, seq(1), 1) == "IllegalArgumentException"
    assert error_value(cp.checkpoint, seq(1), 5) == "IllegalArgumentException"


def test_plain_record_without_sub_is_sub_zero(writer):
    cp = make(writer)
    cp.delivered([rec(1), rec(2)])
    cp.checkpoint(seq(1))
    assert writer.writes[-1][1] == ESN(seq(1), 0)


def test_after_close_every_checkpoint_is_a_shutdown_exception(writer):
    cp = make(writer)
    cp.delivered([rec(1)])
    cp.close("lease lost")
    assert error_value(cp.checkpoint) == "ShutdownException"
    assert error_value(cp.checkpoint, seq(1)) == "ShutdownException"
    assert writer.writes == []


def test_writer_lease_lost_becomes_shutdown_and_later_calls_are_refused(writer):
    cp = make(writer)
    cp.delivered([rec(1), rec(2)])
    writer.fail_with = LeaseLostError("stolen")
    assert error_value(cp.checkpoint, seq(1)) == "ShutdownException"
    writer.fail_with = None
    assert error_value(cp.checkpoint) == "ShutdownException"
    assert writer.writes == []
    assert cp.last_checkpoint == ESN.TRIM_HORIZON


def test_writer_throttled_past_its_retries_is_a_throttling_error_and_may_be_retried(writer):
    cp = make(writer)
    cp.delivered([rec(1)])
    writer.fail_with = RetriesExhaustedError("Gave up after 3 attempts while checkpointing",
                                             ThrottlingError("ProvisionedThroughputExceeded"))
    value = error_value(cp.checkpoint)
    assert value == "ThrottlingException"
    assert cp.last_checkpoint == ESN.TRIM_HORIZON
    writer.fail_with = None
    cp.checkpoint()
    assert cp.last_checkpoint == ESN(seq(1))


@pytest.mark.parametrize("error", [
    TransientServiceError("500"),
    RetriesExhaustedError("Gave up after 3 attempts", TransientServiceError("500")),
    UnreachableAfterRetriesError("DynamoDB endpoint unreachable",
                                 EndpointUnreachableError("no answer")),
    RetriesExhaustedError("Gave up after 3 attempts"),
])
def test_other_writer_errors_are_dependency_errors(writer, error):
    """As the KCL: only a throttle is ThrottlingException; an outage is a dependency failure."""
    cp = make(writer)
    cp.delivered([rec(1)])
    writer.fail_with = error
    assert error_value(cp.checkpoint) == "KinesisClientLibDependencyException"


def test_checkpoint_error_message_names_the_kcl_exception(writer):
    cp = make(writer)
    with pytest.raises(CheckpointError, match="IllegalArgumentException"):
        cp.checkpoint("nope")


def test_resuming_from_a_checkpoint_inside_an_aggregate(writer):
    cp = make(writer, last=ESN(seq(1), 2))
    cp.delivered([rec(1, 3, True), rec(1, 4, True)])
    assert error_value(cp.checkpoint, seq(1), 1) == "IllegalArgumentException"
    cp.checkpoint()
    assert writer.writes[-1][1] == ESN(seq(1), 4)


class BlockingWriter:
    """A lease-table stand-in whose first write blocks until released, counting overlaps."""

    def __init__(self):
        self.first_entered = threading.Event()
        self.second_entered = threading.Event()
        self.release = threading.Event()
        self.inside = 0
        self.max_inside = 0
        self.writes: list[ESN] = []
        self._count_lock = threading.Lock()

    def __call__(self, shard_id: str, position: ESN) -> None:
        with self._count_lock:
            self.inside += 1
            self.max_inside = max(self.max_inside, self.inside)
            first = not self.first_entered.is_set()
        (self.first_entered if first else self.second_entered).set()
        if first:
            assert self.release.wait(10), "the test never released the first write"
        with self._count_lock:
            self.writes.append(position)
            self.inside -= 1


def test_checkpoint_from_another_thread_is_serialised():
    """A second checkpoint must not reach the table while the first write is in flight.

    Without the checkpointer's lock the second thread enters the write at once (seen within
    the wait below); with it, it waits until the first write finished, then writes after it.
    """
    writer = BlockingWriter()
    cp = ShardCheckpointer("shard-1", writer, ESN.TRIM_HORIZON)
    cp.delivered([rec(n) for n in range(1, 11)])
    errors: list[BaseException] = []

    def checkpoint(n: int) -> None:
        try:
            cp.checkpoint(seq(n))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    first = threading.Thread(target=checkpoint, args=(5,))
    first.start()
    assert writer.first_entered.wait(10)
    second = threading.Thread(target=checkpoint, args=(10,))
    second.start()
    entered_concurrently = writer.second_entered.wait(2.0)
    writer.release.set()
    first.join(10)
    second.join(10)
    assert not entered_concurrently and writer.max_inside == 1
    assert errors == []
    assert writer.writes == [ESN(seq(5)), ESN(seq(10))]
    assert cp.last_checkpoint == ESN(seq(10))
