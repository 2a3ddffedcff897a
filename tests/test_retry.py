"""RetryPolicy: doubling backoff, bounded attempts, only retryable errors (tier 1, no sleeping)."""
from __future__ import annotations

import logging

import pytest

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import (
    ConfigurationError,
    RetriesExhaustedError,
    StreamNotFoundError,
    ThrottlingError,
    TransientServiceError,
)
from kinesis_dstream.retry import Backoff, FaultLog, RetryPolicy


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


def test_a_lasting_fault_is_logged_once_a_minute_with_a_count_and_when_it_clears(caplog):
    now = [0.0]
    fault = FaultLog(logging.getLogger("t.fault"), "shard s GetRecords", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.fault"):
        for _ in range(120):            # one failure a second for two minutes
            fault.failed(TransientServiceError("503"), 1.0)
            now[0] += 1.0
        fault.succeeded()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines       # the first failure, one a minute later, the clear line
    assert "1 failure(s)" in lines[0] and "61 failure(s)" in lines[1] and "60 since" in lines[1]
    assert lines[-1].startswith("shard s GetRecords works again after 120 failure(s)")
