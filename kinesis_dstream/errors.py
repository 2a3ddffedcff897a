"""Errors raised by kinesis_dstream.

The split follows the KCL's: throttling, transient (network or server trouble) and
permanent (wrong stream, bad credentials, bad argument). Each class says which in ``kind``;
``retry.classify`` is the one reader of it, so a new error kind only has to say which it is.
"""
from __future__ import annotations

THROTTLING = "throttling"
TRANSIENT = "transient"
PERMANENT = "permanent"


class KinesisDStreamError(Exception):
    """Base of every error this package raises on purpose.

    ``code`` is the AWS error code the error was made from (None for our own), so that a
    caller that must tell two answers of one kind apart reads the code, never the message.
    """

    kind: str = PERMANENT
    code: str | None = None


class ConfigurationError(KinesisDStreamError, ValueError):
    """A setting is missing, unknown or invalid; the message names it."""


class StreamNotFoundError(KinesisDStreamError):
    """The stream does not exist (or is not visible with these credentials)."""


class CredentialsError(KinesisDStreamError):
    """No credentials were found, or AWS rejected them."""


class EndpointUnreachableError(KinesisDStreamError):
    """The service endpoint did not answer; retried, then raised with its URL."""

    kind = TRANSIENT


class ThrottlingError(KinesisDStreamError):
    """ProvisionedThroughputExceeded, LimitExceeded or a DynamoDB throttle."""

    kind = THROTTLING


class TransientServiceError(KinesisDStreamError):
    """A 5xx answer or a dropped connection: worth another try."""

    kind = TRANSIENT


class ExpiredIteratorError(KinesisDStreamError):
    """A shard iterator aged out; the fetcher re-creates it from the last position."""


class DataLossError(KinesisDStreamError):
    """Records a reader had not read are gone (trimmed by the stream's retention, or a shard
    no longer listed) and the user chose to fail rather than go on (``failOnDataLoss``)."""


class RetriesExhaustedError(KinesisDStreamError):
    """Gave up after the configured attempts; ``last_error`` says why."""

    def __init__(self, message: str, last_error: BaseException | None = None):
        super().__init__(message)
        self.last_error = last_error


class UnreachableAfterRetriesError(EndpointUnreachableError, RetriesExhaustedError):
    """The endpoint stayed unreachable through every retry.

    It is both kinds on purpose: start-up code that asks "is the endpoint dead?" and a shard
    consumer that waits after ``RetriesExhaustedError`` both recognise it. A retry policy
    does not retry it (the retries already happened); a loop that waits faults out does.
    """


class ConsumerRegistrationError(KinesisDStreamError):
    """An enhanced fan-out consumer could not be registered or is not usable (the stream's
    limit of 20 consumers, missing permissions, no such stream); names consumer and stream."""


class LeaseLostError(KinesisDStreamError):
    """Another worker holds the lease now (our conditional write failed)."""


class CheckpointError(KinesisDStreamError):
    """A checkpoint was refused.

    ``value`` carries the KCL's exception name (``InvalidStateException``,
    ``ShutdownException``, ``IllegalArgumentException``, ...), the same field that
    amazon-kclpy's ``CheckpointError`` has, so processors written for kclpy can
    inspect it unchanged.
    """

    def __init__(self, value: str, message: str = ""):
        super().__init__(f"{value}: {message}" if message else value)
        self.value = value


class AggregationError(KinesisDStreamError):
    """A KPL aggregate could not be split (bad magic, checksum or truncated)."""


class PutRecordsFailedError(KinesisDStreamError):
    """Records were not written after every retry; the message names the stream and count.

    ``not_written`` is the number of user records (not Kinesis records) that did not make it;
    records of the same flush that did are in the stream (at-least-once: a caller that
    retries the whole batch writes those again).
    """

    def __init__(self, message: str, not_written: int,
                 last_error: BaseException | None = None) -> None:
        super().__init__(message)
        self.not_written = not_written
        self.last_error = last_error


class ExecutorEnvironmentError(ConfigurationError):
    """Spark's Python workers cannot import what our executor code needs.

    The message names the interpreter the workers run, the module missing there, and the
    fix (``PYSPARK_PYTHON``, ``spark.pyspark.python`` or a packed virtualenv).
    """
