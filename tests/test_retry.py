"""RetryPolicy: doubling backoff, bounded attempts, only retryable errors (tier 1, no sleeping)."""
from __future__ import annotations

import pytest

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import (
    ConfigurationError,
    RetriesExhaustedError,
    StreamNotFoundError,
    ThrottlingError,
    TransientServiceError,
)
from kinesis_dstream.retry import RetryPolicy


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
    assert policy.call(fn, "reading", sleep=sleeps.append) == "ok"
    assert fn.calls == 3
    assert sleeps == pytest.approx([0.1, 0.2])


def test_gives_up_after_max_attempts_with_the_last_error():
    sleeps: list[float] = []
    first, last = ThrottlingError("first"), ThrottlingError("the last one")
    fn = Flaky(first, ThrottlingError("second"), last, ThrottlingError("never reached"))
    policy = RetryPolicy(wait_time_ms=50, max_attempts=3)
    with pytest.raises(RetriesExhaustedError) as info:
        policy.call(fn, "reading shard-1", sleep=sleeps.append)
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


def test_a_zero_wait_time_still_retries():
    sleeps: list[float] = []
    fn = Flaky(ThrottlingError("a"), ThrottlingError("b"))
    assert RetryPolicy(wait_time_ms=0, max_attempts=3).call(fn, "x", sleep=sleeps.append) == "ok"
    assert sleeps == [0, 0]
