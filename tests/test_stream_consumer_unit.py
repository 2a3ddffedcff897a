"""Registering an application's fan-out consumer, against a scripted Kinesis client: the
KCL's describe -> register -> wait for ACTIVE, a race lost to another worker, and the
failures waiting cannot cure, each a clear error in bounded time (no emulator)."""
from __future__ import annotations

import time
from typing import Any

import botocore.exceptions
import pytest

from kinesis_dstream.aws.kinesis import KinesisClient
from kinesis_dstream.aws.stream_consumer import (
    check_stream_consumer,
    deregister_stream_consumer,
    register_stream_consumer,
)
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import ConsumerRegistrationError

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

CONFIG = ConsumerConfig(application_name="app", stream_name="orders", region_name="us-east-1",
                        aws_access_key_id="AKIDEXAMPLE", aws_secret_key="secret",
                        kinesis_endpoint="http://127.0.0.1:9", retry_max_attempts=1)
STREAM_ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
ARN = STREAM_ARN + "/consumer/app:1"


def error(code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": code}}, "op")


def description(status: str) -> dict:
    return {"ConsumerDescription": {"ConsumerName": "app", "ConsumerARN": ARN,
                                    "ConsumerStatus": status}}


class Script:
    """A Kinesis client answering each operation from its own list (the last answer repeats)."""

    meta = None

    def __init__(self, **answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict]] = []

    def __getattr__(self, operation: str) -> Any:
        if operation not in self.answers:
            raise AttributeError(operation)

        def call(**kwargs: Any) -> Any:
            self.calls.append((operation, kwargs))
            queue = self.answers[operation]
            answer = queue.pop(0) if len(queue) > 1 else queue[0]
            if isinstance(answer, Exception):
                raise answer
            return answer
        return call

    def operations(self) -> list[str]:
        return [name for name, _ in self.calls]


def kinesis(script: Script) -> KinesisClient:
    return KinesisClient(CONFIG, client=script, sleep=lambda s: None)  # type: ignore[arg-type]


SUMMARY = {"StreamDescriptionSummary": {"StreamARN": STREAM_ARN}}


def test_a_missing_consumer_is_registered_and_waited_for_until_active():
    script = Script(describe_stream_summary=[SUMMARY],
                    describe_stream_consumer=[error("ResourceNotFoundException"),
                                              description("CREATING"), description("ACTIVE")],
                    register_stream_consumer=[{"Consumer": {"ConsumerARN": ARN,
                                                            "ConsumerStatus": "CREATING"}}])
    assert register_stream_consumer(kinesis(script), "app", sleep=lambda s: None) == ARN
    assert script.operations() == ["describe_stream_summary", "describe_stream_consumer",
                                   "register_stream_consumer", "describe_stream_consumer",
                                   "describe_stream_consumer"]
    assert script.calls[2][1] == {"StreamARN": STREAM_ARN, "ConsumerName": "app"}


def test_an_active_consumer_is_used_as_it_is_and_a_lost_register_race_describes_again():
    script = Script(describe_stream_summary=[SUMMARY], describe_stream_consumer=[
        description("ACTIVE")])
    assert register_stream_consumer(kinesis(script), "app") == ARN
    assert "register_stream_consumer" not in script.operations()
    raced = Script(describe_stream_summary=[SUMMARY],
                   describe_stream_consumer=[error("ResourceNotFoundException"),
                                             description("ACTIVE")],
                   register_stream_consumer=[error("ResourceInUseException")])
    assert register_stream_consumer(kinesis(raced), "app") == ARN


def test_the_limit_of_20_consumers_is_a_clear_error_in_bounded_time():
    script = Script(describe_stream_summary=[SUMMARY],
                    describe_stream_consumer=[error("ResourceNotFoundException")],
                    register_stream_consumer=[error("LimitExceededException")])
    started = time.monotonic()
    with pytest.raises(ConsumerRegistrationError) as failed:
        register_stream_consumer(kinesis(script), "app", patience_s=1.0)
    assert time.monotonic() - started < 5
    message = str(failed.value)
    assert "'app'" in message and "'orders'" in message and "20 consumers" in message
    assert script.operations().count("register_stream_consumer") >= 2  # throttles waited out


def test_missing_permissions_fail_at_once_naming_what_is_needed():
    script = Script(describe_stream_summary=[SUMMARY],
                    describe_stream_consumer=[error("AccessDeniedException")])
    with pytest.raises(ConsumerRegistrationError, match="kinesis:RegisterStreamConsumer"):
        register_stream_consumer(kinesis(script), "app")
    assert script.operations().count("describe_stream_consumer") == 1


def test_a_consumer_never_active_and_a_wrong_arn_are_errors():
    creating = Script(describe_stream_summary=[SUMMARY],
                      describe_stream_consumer=[description("CREATING")])
    with pytest.raises(ConsumerRegistrationError, match="not ACTIVE after 0.5 s"):
        register_stream_consumer(kinesis(creating), "app", active_timeout_s=0.5)
    missing = Script(describe_stream_consumer=[error("ResourceNotFoundException")])
    with pytest.raises(ConsumerRegistrationError, match="does not exist"):
        check_stream_consumer(kinesis(missing), ARN)


def test_deregister_is_there_for_a_source_that_asks_and_tolerates_a_gone_consumer():
    script = Script(deregister_stream_consumer=[{}, error("ResourceNotFoundException")])
    assert deregister_stream_consumer(kinesis(script), ARN) is True
    assert deregister_stream_consumer(kinesis(script), ARN) is False
