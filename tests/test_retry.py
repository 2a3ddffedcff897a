"""The retry module: classification, RetryPolicy, Backoff, poll_until, FaultLog, RetryCounts.

Tier 1, no sleeping: clock, sleep and random source are injected.
"""
from __future__ import annotations

import logging

import pytest

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import (
    CheckpointError,
    ConfigurationError,
    CredentialsError,
    EndpointUnreachableError,
    ExpiredIteratorError,
    KinesisDStreamError,
    LeaseLostError,
    PutRecordsFailedError,
    RetriesExhaustedError,
    StreamNotFoundError,
    ThrottlingError,
    TransientServiceError,
    UnreachableAfterRetriesError,
)
from kinesis_dstream.retry import (
    RETRIES,
    Backoff,
    Deadline,
    FaultLog,
    RetryCounts,
    RetryPolicy,
    classify,
    is_transient,
    poll_until,
    wait_out,
)

pytestmark = pytest.mark.unit


class Flaky:
    """Fails with the given errors in turn, then returns 'ok'."""

    def __init__(self, *errors: BaseException):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_backoff_doubles_from_the_wait_time_and_is_capped():
    policy = RetryPolicy(wait_time_ms=100, max_attempts=10, max_wait_ms=1000)
    assert [policy.backoff_ms(n) for n in range(1, 7)] == [100, 200, 400, 800, 1000, 1000]


def test_from_config_uses_the_spark_settings():
    config = ConsumerConfig(application_name="a", stream_name="s", region_name="r",
                            retry_wait_time_ms=250, retry_max_attempts=7)
    policy = RetryPolicy.from_config(config)
    assert (policy.wait_time_ms, policy.max_attempts) == (250, 7)


def test_success_first_time_does_not_sleep():
    sleeps: list[float] = []
    assert RetryPolicy().call(lambda: 42, "answering", sleep=sleeps.append) == 42
    assert sleeps == []


def test_retryable_errors_are_retried_with_doubling_sleeps():
    sleeps: list[float] = []
    fn = Flaky(ThrottlingError("slow down"), TransientServiceError("503"))
    policy = RetryPolicy(wait_time_ms=100, max_attempts=3)
    assert policy.call(fn, "reading", sleep=sleeps.append, rand=lambda: 1.0) == "ok"
    assert fn.calls == 3
    assert sleeps == pytest.approx([0.1, 0.2])


def test_gives_up_after_max_attempts_with_the_last_error():
    sleeps: list[float] = []
    first, last = ThrottlingError("first"), ThrottlingError("the last one")
    fn = Flaky(first, ThrottlingError("second"), last, ThrottlingError("never reached"))
    policy = RetryPolicy(wait_time_ms=50, max_attempts=3)
    with pytest.raises(RetriesExhaustedError) as info:
        policy.call(fn, "reading shard-1", sleep=sleeps.append, rand=lambda: 1.0)
    assert fn.calls == 3
    assert str(info.value).startswith("Gave up after 3 attempts while reading shard-1")
    assert info.value.last_error is last
    assert info.value.__cause__ is last
    assert sleeps == pytest.approx([0.05, 0.1])  # no sleep after the final attempt


def test_one_attempt_means_no_retry():
    sleeps: list[float] = []
    fn = Flaky(ThrottlingError("x"))
    with pytest.raises(RetriesExhaustedError, match="Gave up after 1 attempts while doing"):
        RetryPolicy(max_attempts=1).call(fn, "doing", sleep=sleeps.append)
    assert fn.calls == 1 and sleeps == []


@pytest.mark.parametrize("error", [StreamNotFoundError("no such stream"),
                                   ConfigurationError("bad"), KeyError("bug"),
                                   RetriesExhaustedError("nested")])
def test_non_retryable_errors_are_raised_at_once(error):
    sleeps: list[float] = []
    fn = Flaky(error)
    with pytest.raises(type(error)) as info:
        RetryPolicy(max_attempts=5).call(fn, "doing", sleep=sleeps.append)
    assert info.value is error
    assert fn.calls == 1 and sleeps == []


def test_waits_are_jittered_between_half_and_all_of_the_doubled_wait():
    policy = RetryPolicy(wait_time_ms=100, max_attempts=10, max_wait_ms=1000)
    assert [policy.jittered_backoff_ms(n, lambda: 0.0) for n in (1, 2, 5, 9)] == [50, 100, 500, 500]
    assert [policy.jittered_backoff_ms(n, lambda: 0.5) for n in (1, 2, 5)] == [75, 150, 750]
    sleeps: list[float] = []
    draws = iter([0.0, 0.5])
    fn = Flaky(ThrottlingError("a"), ThrottlingError("b"))
    assert policy.call(fn, "x", sleep=sleeps.append, rand=lambda: next(draws)) == "ok"
    assert sleeps == pytest.approx([0.05, 0.15])


def test_a_zero_wait_time_is_rejected_by_name():
    with pytest.raises(ConfigurationError, match="retry_wait_time_ms"):
        ConsumerConfig(application_name="a", stream_name="s", region_name="r",
                       retry_wait_time_ms=0)


def test_backoff_grows_capped_and_resets():
    backoff = Backoff(base_ms=100, cap_ms=400, rand=lambda: 1.0)
    assert [backoff.next_wait_s() for _ in range(5)] == pytest.approx([0.1, 0.2, 0.4, 0.4, 0.4])
    backoff.reset()
    assert backoff.next_wait_s() == pytest.approx(0.1)


class FakeTime:
    """A clock that only moves when slept on."""

    def __init__(self, now: float = 1000.0):
        self.now = now
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# -- classification ---------------------------------------------------------------------------
def reader_rule(exc: BaseException) -> bool:
    """The Spark reader's rule when retry.is_transient was written (shard_reader._transient)."""
    if isinstance(exc, RetriesExhaustedError) and exc.last_error is not None:
        exc = exc.last_error
    return isinstance(exc, (ThrottlingError, EndpointUnreachableError, TransientServiceError))


CLASSIFIED = [
    (ThrottlingError("PTE"), "throttling"),
    (TransientServiceError("503"), "transient"),
    (EndpointUnreachableError("no answer"), "transient"),
    (RetriesExhaustedError("gave up", ThrottlingError("PTE")), "throttling"),
    (RetriesExhaustedError("gave up", TransientServiceError("503")), "transient"),
    (RetriesExhaustedError("gave up", StreamNotFoundError("gone")), "permanent"),
    (RetriesExhaustedError("gave up"), "permanent"),
    (UnreachableAfterRetriesError("dead", EndpointUnreachableError("no answer")), "transient"),
    (UnreachableAfterRetriesError("dead"), "transient"),
    (RetriesExhaustedError("twice", RetriesExhaustedError("once", ThrottlingError("x"))),
     "permanent"),  # one level is unwrapped, as the reader did
    (StreamNotFoundError("gone"), "permanent"),
    (CredentialsError("denied"), "permanent"),
    (ConfigurationError("bad"), "permanent"),
    (ExpiredIteratorError("old"), "permanent"),
    (LeaseLostError("stolen"), "permanent"),
    (CheckpointError("ThrottlingException"), "permanent"),
    (PutRecordsFailedError("3 not written", 3), "permanent"),
    (KinesisDStreamError("other"), "permanent"),
    (KeyError("bug"), "permanent"),
    (OSError("not translated"), "permanent"),
]


@pytest.mark.parametrize("error,kind", CLASSIFIED, ids=[f"{type(e).__name__}-{k}" for e, k in CLASSIFIED])
def test_classify_reads_the_kind_of_the_error_or_of_what_the_retries_gave_up_on(error, kind):
    assert classify(error) == kind
    assert is_transient(error) == (kind != "permanent")


@pytest.mark.parametrize("error", [e for e, _ in CLASSIFIED])
def test_is_transient_is_the_readers_rule(error):
    assert is_transient(error) == reader_rule(error)


# -- RetryPolicy ------------------------------------------------------------------------------
def test_a_deadline_ends_the_retries_before_a_wait_that_would_pass_it():
    time = FakeTime()
    policy = RetryPolicy(wait_time_ms=1000, max_attempts=10, max_wait_ms=5000, deadline_ms=4000)
    fn = Flaky(*[ThrottlingError(f"t{n}") for n in range(10)])
    with pytest.raises(RetriesExhaustedError) as info:
        policy.call(fn, "putting records", sleep=time.sleep, rand=lambda: 1.0, clock=time.clock)
    assert time.sleeps == [1.0, 2.0]          # a third wait (4 s) would end past 4 s
    assert fn.calls == 3
    assert str(info.value) == "Gave up after 3 attempts within 4 s while putting records: t2"


def test_each_retry_is_counted_by_kind_and_a_give_up_once():
    counts = RetryCounts()
    fn = Flaky(ThrottlingError("a"), ThrottlingError("b"), TransientServiceError("c"))
    assert RetryPolicy(max_attempts=4).call(fn, "x", sleep=lambda s: None, counts=counts) == "ok"
    assert counts.snapshot() == {"throttled": 2, "transient": 1, "exhausted": 0}
    with pytest.raises(RetriesExhaustedError):
        RetryPolicy(max_attempts=2).call(Flaky(ThrottlingError("a"), ThrottlingError("b")), "x",
                                         sleep=lambda s: None, counts=counts)
    assert counts.snapshot() == {"throttled": 3, "transient": 1, "exhausted": 1}
    with pytest.raises(StreamNotFoundError):  # not retried: not counted
        RetryPolicy().call(Flaky(StreamNotFoundError("x")), "x", sleep=lambda s: None,
                           counts=counts)
    assert counts.snapshot() == {"throttled": 3, "transient": 1, "exhausted": 1}


def test_throttles_that_clear_inside_the_retries_count_in_the_process_wide_counter():
    before = RETRIES.snapshot()["throttled"]
    assert RetryPolicy().call(Flaky(ThrottlingError("a")), "x", sleep=lambda s: None) == "ok"
    assert RETRIES.snapshot()["throttled"] == before + 1


@pytest.mark.parametrize("settings,name", [({"max_attempts": 0}, "max_attempts"),
                                           ({"wait_time_ms": 0}, "wait_time_ms"),
                                           ({"deadline_ms": 0}, "deadline_ms")])
def test_a_policy_that_cannot_work_is_rejected_by_name(settings, name):
    with pytest.raises(ConfigurationError, match=name):
        RetryPolicy(**settings)


# -- Backoff, Deadline, poll_until ------------------------------------------------------------
def test_backoff_after_retries_starts_at_twice_the_wait_time_and_stops_at_ten_seconds():
    config = ConsumerConfig(application_name="a", stream_name="s", region_name="r",
                            retry_wait_time_ms=1000)
    backoff = Backoff.after_retries(config, rand=lambda: 1.0)
    assert [backoff.next_wait_s() for _ in range(5)] == pytest.approx([2, 4, 8, 10, 10])
    low = Backoff.after_retries(config, rand=lambda: 0.0)
    assert low.next_wait_s() == pytest.approx(1.0)  # equal jitter: never below half


def test_a_deadline_counts_down_on_its_clock():
    time = FakeTime()
    deadline = Deadline(5, time.clock)
    assert deadline.remaining_s() == 5 and not deadline.expired
    time.sleep(7)
    assert deadline.remaining_s() == 0 and deadline.expired


def test_poll_until_returns_what_the_check_found_with_growing_bounded_waits():
    time = FakeTime()
    answers = iter(["CREATING"] * 6 + ["ACTIVE"])
    found = poll_until(lambda: (lambda a: a if a == "ACTIVE" else None)(next(answers)),
                       "table t not ACTIVE", timeout_s=60, interval_s=0.1, max_interval_s=1.0,
                       clock=time.clock, sleep=time.sleep, rand=lambda: 1.0)
    assert found == "ACTIVE"
    assert time.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_poll_until_checks_a_last_time_at_the_deadline_then_names_what_was_awaited():
    time = FakeTime()
    checks: list[float] = []

    def check() -> bool:
        checks.append(time.now)
        return False

    with pytest.raises(TimeoutError, match=r"^lease table t not ACTIVE after 2.2 s$"):
        poll_until(check, "lease table t not ACTIVE", timeout_s=2.2, interval_s=0.5,
                   max_interval_s=1.0, clock=time.clock, sleep=time.sleep, rand=lambda: 1.0)
    assert time.sleeps == pytest.approx([0.5, 1.0, 0.7])     # the last wait ends at the deadline
    assert checks[-1] == pytest.approx(1002.2) and len(checks) == 4


# -- FaultLog ---------------------------------------------------------------------------------
def fault_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "t.fault"]


def test_a_lasting_fault_is_logged_once_a_minute_with_counts_and_when_it_clears(caplog):
    now = [0.0]
    fault = FaultLog(logging.getLogger("t.fault"), "shard s: GetRecords", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.fault"):
        for _ in range(120):            # one failure a second for two minutes
            fault.failed(TransientServiceError("503"), 1.0)
            now[0] += 1.0
        fault.succeeded()
    assert fault_lines(caplog) == [
        "shard s: GetRecords failing: 503; trying again in 1 s",
        "shard s: GetRecords still failing after 60 s: 60 failures since the last line, 61 in "
        "all; last error: 503; trying again in 1 s",
        "shard s: GetRecords works again after 120 failures in 120 s (59 since the last line)",
    ]
    assert not fault.failing


def test_a_flapping_fault_stays_rate_limited_and_successes_do_not_reset_the_limit(caplog):
    now = [0.0]
    fault = FaultLog(logging.getLogger("t.fault"), "reading shard s", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.fault"):
        for second in range(120):      # fails, works, fails, works ... for two minutes
            if second % 2 == 0:
                fault.failed(ThrottlingError("PTE"), 0.0)
            else:
                fault.succeeded()
            now[0] += 1.0
    lines = fault_lines(caplog)
    assert len(lines) == 4, lines      # a "failing" and a "works again" line a minute
    assert lines[0] == "reading shard s failing: PTE"        # a wait of 0: no "trying again"
    assert lines[1] == "reading shard s works again after 1 failure in 1 s"
    assert lines[2] == ("reading shard s still failing after 58 s: 30 failures since the last "
                        "line, 30 in all; last error: PTE")
    assert lines[3] == "reading shard s works again after 30 failures in 59 s"


def test_a_recovery_held_back_by_the_limit_is_logged_by_a_later_success(caplog):
    now = [0.0]
    fault = FaultLog(logging.getLogger("t.fault"), "scheduler pass", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.fault"):
        fault.failed(TransientServiceError("a"))
        fault.succeeded()                    # logged at once
        now[0] = 10.0
        fault.failed(TransientServiceError("b"))
        now[0] = 11.0
        fault.succeeded()                    # held back: a "works" line 11 s ago
        assert fault.failing                 # so callers that report only while failing go on
        now[0] = 70.0
        fault.succeeded()
        assert not fault.failing
        fault.succeeded()                    # nothing open: nothing said
    assert fault_lines(caplog)[1:] == [
        "scheduler pass works again after 1 failure in 0 s",
        "scheduler pass works again after 1 failure in 1 s (1 since the last line); "
        "working for 59 s",
    ]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_out_waits_an_outage_out_even_past_a_policys_give_up_and_logs_it_once(caplog):
    clock = Clock()
    gave_up = UnreachableAfterRetriesError("unreachable", EndpointUnreachableError("gone"))
    call = Flaky(*[gave_up] * 30)
    fault = FaultLog(logging.getLogger("test.outage"), "DynamoDB", clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        assert wait_out(call, patience_s=600, fault=fault, backoff=Backoff(200, 2000),
                        sleep=clock.sleep, clock=clock) == "ok"
    assert call.calls == 31 and 30 < clock.now < 60
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # once when it began, once when it cleared: within a minute
    assert lines[0].startswith("DynamoDB failing") and "works again after 30 failures" in lines[1]


def test_wait_out_raises_a_permanent_error_at_once_and_an_outage_after_its_patience():
    clock = Clock()
    fault = FaultLog(logging.getLogger("test.outage"), "DynamoDB", clock=clock)
    missing = Flaky(StreamNotFoundError("no table"))
    with pytest.raises(StreamNotFoundError):
        wait_out(missing, patience_s=600, fault=fault, backoff=Backoff(200, 2000),
                 sleep=clock.sleep, clock=clock)
    assert missing.calls == 1 and clock.now == 0
    endless = Flaky(*[TransientServiceError("down")] * 1000)
    with pytest.raises(TransientServiceError):
        wait_out(endless, patience_s=20, fault=fault, backoff=Backoff(200, 2000),
                 sleep=clock.sleep, clock=clock)
    assert clock.now == pytest.approx(20)
