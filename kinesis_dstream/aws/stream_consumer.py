"""An application's enhanced fan-out consumer: registered once, never deregistered by a worker.

As the KCL's FanOutConsumerRegistration: DescribeStreamConsumer; RegisterStreamConsumer if it
is missing (ResourceInUse there means another worker registered it first: describe again);
then wait until it is ACTIVE, because Kinesis refuses subscriptions before. A worker never
deregisters (the KCL never does: other workers and the next start use the same consumer);
``deregister_stream_consumer`` is for a source whose lifecycle asks for it (the SQL source's
graceful stop). What waiting cannot cure (the stream's 20 consumers, missing permissions, no
stream, a consumer that never becomes ACTIVE) is a ``ConsumerRegistrationError`` naming the
consumer and the stream, within a bounded time.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import botocore.exceptions

from ..errors import ConsumerRegistrationError, KinesisDStreamError
from ..retry import Backoff, FaultLog, is_throttling, poll_until, wait_out
from .kinesis import KinesisClient

log = logging.getLogger(__name__)

# Throttles of the registration calls (5 a second per account; at most 5 consumers CREATING)
# are waited out this long; a LimitExceeded that lasts is the stream's limit of 20 consumers.
REGISTER_PATIENCE_S = 10.0
# CREATING -> ACTIVE: AWS states no bound; the KCL waits about 10 s, the awslabs connector
# 30 s, and users report first registrations that outlasted 10 s.
ACTIVE_TIMEOUT_S = 60.0
ACTIVE = "ACTIVE"
# What the SQL source names a consumer after its query (consumerMode efo without a name):
# this prefix and the query id; the operator's ``consumers list`` recognises it.
QUERY_CONSUMER_PREFIX = "kinesis-dstream-sql-"


def register_stream_consumer(kinesis: KinesisClient, consumer_name: str, *,
                             patience_s: float = REGISTER_PATIENCE_S,
                             active_timeout_s: float = ACTIVE_TIMEOUT_S,
                             sleep: Callable[[float], None] = time.sleep) -> str:
    """The ARN of the ACTIVE consumer ``consumer_name`` of ``kinesis``' stream, registering
    it if it does not exist yet."""
    where = f"fan-out consumer {consumer_name!r} of stream {kinesis.stream_name!r}"
    try:
        stream_arn = kinesis.describe_stream_summary()["StreamARN"]
        described = _patiently(lambda: _describe(kinesis, where, StreamARN=stream_arn,
                                                 ConsumerName=consumer_name),
                               where, patience_s, sleep)
        if described is None:
            described = _patiently(lambda: _register(kinesis, where, stream_arn, consumer_name),
                                   where, patience_s, sleep)
        assert described is not None  # _register returns a description or raises
        arn = described["ConsumerARN"]
        _wait_until_active(kinesis, where, described, arn, active_timeout_s, sleep)
        return arn
    except ConsumerRegistrationError:
        raise
    except KinesisDStreamError as exc:
        raise ConsumerRegistrationError(f"{where} could not be registered: {exc}"
                                        f"{_hint(exc)}") from exc


def check_stream_consumer(kinesis: KinesisClient, consumer_arn: str, *,
                          active_timeout_s: float = ACTIVE_TIMEOUT_S,
                          sleep: Callable[[float], None] = time.sleep) -> str:
    """A consumer named by its ARN (registered by the user): it must exist and be ACTIVE.

    A wrong ARN found here fails the start; found by a subscription, it would read as the
    end of every shard (ResourceNotFound, as the KCL reads it)."""
    where = f"fan-out consumer {consumer_arn} of stream {kinesis.stream_name!r}"
    try:
        described = _describe(kinesis, where, ConsumerARN=consumer_arn)
        if described is None:
            raise ConsumerRegistrationError(f"{where} does not exist (consumerArn)")
        _wait_until_active(kinesis, where, described, consumer_arn, active_timeout_s, sleep)
        return consumer_arn
    except ConsumerRegistrationError:
        raise
    except KinesisDStreamError as exc:
        raise ConsumerRegistrationError(f"{where} is not usable: {exc}{_hint(exc)}") from exc


def consumer_status(kinesis: KinesisClient, consumer_arn: str) -> str | None:
    """CREATING, ACTIVE or DELETING; None once the consumer is gone."""
    described = _describe(kinesis, f"fan-out consumer {consumer_arn}", ConsumerARN=consumer_arn)
    return None if described is None else described.get("ConsumerStatus")


def consumer_arn_named(kinesis: KinesisClient, consumer_name: str) -> str | None:
    """The ARN of ``kinesis``' stream's consumer ``consumer_name``; None if there is none."""
    stream_arn = kinesis.describe_stream_summary()["StreamARN"]
    described = _describe(kinesis, f"fan-out consumer {consumer_name!r}",
                          StreamARN=stream_arn, ConsumerName=consumer_name)
    return None if described is None else described["ConsumerARN"]


def list_stream_consumers(kinesis: KinesisClient) -> list[dict]:
    """Every consumer registered on the stream (ConsumerName, ConsumerARN, ConsumerStatus,
    ConsumerCreationTimestamp), following NextToken: what an operator looks at for one that
    outlived its application."""
    stream_arn = kinesis.describe_stream_summary()["StreamARN"]
    what = f"listing the fan-out consumers of stream {kinesis.stream_name!r}"
    answer = kinesis.call_consumers("list_stream_consumers", what, StreamARN=stream_arn)
    found = list(answer.get("Consumers", []))
    while answer.get("NextToken"):
        answer = kinesis.call_consumers("list_stream_consumers", what, StreamARN=stream_arn,
                                        NextToken=answer["NextToken"])
        found.extend(answer.get("Consumers", []))
    return found


def deregister_stream_consumer(kinesis: KinesisClient, consumer_arn: str) -> bool:
    """Deregister a consumer; False if it was gone already. Never called by a worker."""
    try:
        kinesis.call_consumers("deregister_stream_consumer",
                               f"deregistering fan-out consumer {consumer_arn}",
                               expected=("ResourceNotFoundException",), ConsumerARN=consumer_arn)
    except botocore.exceptions.ClientError:
        return False
    log.info("deregistered fan-out consumer %s", consumer_arn)
    return True


def _describe(kinesis: KinesisClient, where: str, **identity: str) -> dict | None:
    try:
        answer = kinesis.call_consumers("describe_stream_consumer", f"describing {where}",
                                        expected=("ResourceNotFoundException",), **identity)
    except botocore.exceptions.ClientError:
        return None
    return answer["ConsumerDescription"]


def _register(kinesis: KinesisClient, where: str, stream_arn: str, name: str) -> dict:
    try:
        answer = kinesis.call_consumers("register_stream_consumer", f"registering {where}",
                                        expected=("ResourceInUseException",),
                                        StreamARN=stream_arn, ConsumerName=name)
    except botocore.exceptions.ClientError:
        log.info("%s was registered by another worker meanwhile", where)
        described = _describe(kinesis, where, StreamARN=stream_arn, ConsumerName=name)
        if described is None:  # registered, then deregistered again at once
            raise ConsumerRegistrationError(f"{where} vanished while being registered") from None
        return described
    log.info("registered %s", where)
    return answer["Consumer"]


def _patiently(fn: Callable[[], dict | None], where: str, patience_s: float,
               sleep: Callable[[float], None]) -> dict | None:
    return wait_out(fn, patience_s=patience_s, fault=FaultLog(log, where),
                    backoff=Backoff(base_ms=500, cap_ms=2000), sleep=sleep)


def _wait_until_active(kinesis: KinesisClient, where: str, described: dict, arn: str,
                       timeout_s: float, sleep: Callable[[float], None]) -> None:
    status = {"now": described.get("ConsumerStatus")}
    if status["now"] == ACTIVE:
        return

    def active() -> bool:
        again = _describe(kinesis, where, ConsumerARN=arn)
        status["now"] = None if again is None else again.get("ConsumerStatus")
        if status["now"] in (None, "DELETING"):
            raise ConsumerRegistrationError(
                f"{where} is {status['now'] or 'gone'} while waiting for it to be ACTIVE "
                "(deregistered by someone else?)")
        return status["now"] == ACTIVE

    try:
        poll_until(active, f"{where} not ACTIVE", timeout_s=timeout_s, interval_s=0.25,
                   sleep=sleep)
    except TimeoutError as exc:
        raise ConsumerRegistrationError(f"{exc} (still {status['now']})") from None


def _hint(exc: KinesisDStreamError) -> str:
    cause = getattr(exc, "last_error", None) or exc
    if is_throttling(cause):
        return ("; Kinesis kept refusing with LimitExceeded: a stream has at most 20 consumers "
                "(ListStreamConsumers lists them) and at most 5 may be CREATING at once")
    if getattr(cause, "code", None) in ("AccessDeniedException", "UnrecognizedClientException"):
        return ("; the credentials need kinesis:DescribeStreamConsumer, "
                "kinesis:RegisterStreamConsumer and kinesis:SubscribeToShard")
    return ""
