"""boto3 clients with bounded time, and one table from AWS error codes to our errors.

botocore's own retries are switched off: every retry goes through ``RetryPolicy`` so the
Spark retry settings mean what they say. Connect and read timeouts are short so a dead
endpoint fails in seconds, naming its URL.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

import boto3
import botocore.config
import botocore.exceptions

from ..config import ConsumerConfig
from ..errors import (
    ConfigurationError,
    CredentialsError,
    EndpointUnreachableError,
    ExpiredIteratorError,
    KinesisDStreamError,
    RetriesExhaustedError,
    StreamNotFoundError,
    ThrottlingError,
    TransientServiceError,
    UnreachableAfterRetriesError,
)
from ..retry import RetryPolicy

log = logging.getLogger(__name__)

_THROTTLING = {
    "ProvisionedThroughputExceededException",
    "LimitExceededException",
    "ThrottlingException",
    "Throttling",
    "RequestLimitExceeded",
    "TooManyRequestsException",
}
_CREDENTIALS = {
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "AccessDeniedException",
    "ExpiredTokenException",
    "MissingAuthenticationTokenException",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
}
_TRANSIENT = {"InternalFailure", "InternalServerError", "ServiceUnavailable",
              "KMSThrottlingException", "RequestTimeout"}


def _session(config: ConsumerConfig) -> boto3.session.Session:
    session = boto3.session.Session(
        aws_access_key_id=config.aws_access_key_id,
        aws_secret_access_key=config.aws_secret_key,
        region_name=config.region_name,
    )
    if config.sts_assume_role_arn is None:
        return session
    sts = session.client("sts", config=_botocore_config(config))
    try:
        creds = sts.assume_role(
            RoleArn=config.sts_assume_role_arn,
            RoleSessionName=config.sts_session_name,
            ExternalId=config.sts_external_id,
        )["Credentials"]
    except Exception as exc:  # noqa: BLE001 - translated
        raise translate_error(exc, f"assuming role {config.sts_assume_role_arn}") from exc
    return boto3.session.Session(
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
        region_name=config.region_name,
    )


def _botocore_config(config: ConsumerConfig) -> botocore.config.Config:
    return botocore.config.Config(
        connect_timeout=config.connect_timeout_s,
        read_timeout=config.read_timeout_s,
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=50,
    )


def make_client(config: ConsumerConfig, service: str) -> Any:
    """A boto3 client for ``kinesis``, ``dynamodb`` or ``cloudwatch``.

    An explicit endpoint in the config wins; otherwise boto3 resolves it, honouring
    ``AWS_ENDPOINT_URL_<SERVICE>`` as the local harness prints them.
    """
    endpoint = {
        "kinesis": config.kinesis_endpoint,
        "dynamodb": config.dynamodb_endpoint,
        "cloudwatch": config.cloudwatch_endpoint,
    }.get(service)
    session = _session(config)
    if service == "kinesis":
        # Keep ApproximateArrivalTimestamp as the epoch seconds on the wire: botocore would
        # build a tz-aware datetime per record (~10 us each, the largest CPU cost of a
        # drain) only for us to turn it back into epoch milliseconds.
        session._session.get_component("response_parser_factory").set_parser_defaults(
            timestamp_parser=lambda value: value)
    if session.get_credentials() is None:
        raise CredentialsError(
            f"no AWS credentials found for {service}: pass awsAccessKeyId/awsSecretKey, or set "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or an instance role"
        )
    try:
        return session.client(service, endpoint_url=endpoint or None,
                              config=_botocore_config(config))
    except ValueError as exc:
        raise ConfigurationError(f"bad {service} endpoint {endpoint!r}: {exc}") from exc


def _endpoint_of(exc: BaseException) -> str:
    return str(getattr(exc, "kwargs", {}).get("endpoint_url", "") or "")


def translate_error(exc: BaseException, what: str) -> KinesisDStreamError:
    """Map a botocore/boto3 exception to ours; ``what`` says what we were doing."""
    if isinstance(exc, KinesisDStreamError):
        return exc
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        message = error.get("Message", "") or str(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        text = f"{what}: {code}: {message}"
        if code == "ResourceNotFoundException":
            return StreamNotFoundError(text)
        if code == "ExpiredIteratorException":
            return ExpiredIteratorError(text)
        if code in _THROTTLING:
            return ThrottlingError(text)
        if code in _CREDENTIALS:
            return CredentialsError(text)
        if code in _TRANSIENT or status >= 500:
            return TransientServiceError(text)
        if code in ("ValidationException", "InvalidArgumentException"):
            return ConfigurationError(text)
        return KinesisDStreamError(text)
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return CredentialsError(f"{what}: no AWS credentials found")
    if isinstance(exc, (botocore.exceptions.EndpointConnectionError,
                        botocore.exceptions.ConnectTimeoutError)):
        return EndpointUnreachableError(f"{what}: endpoint unreachable: {_endpoint_of(exc) or exc}")
    if isinstance(exc, (botocore.exceptions.ReadTimeoutError,
                        botocore.exceptions.ConnectionClosedError,
                        botocore.exceptions.HTTPClientError)):
        return TransientServiceError(f"{what}: {exc}")
    return KinesisDStreamError(f"{what}: {type(exc).__name__}: {exc}")


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ClientError, else None."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return exc.response.get("Error", {}).get("Code")
    return None


def call(policy: RetryPolicy, method: Callable[..., Any], what: str, *,
         expected: tuple[str, ...] = (), sleep: Callable[[float], None] = time.sleep,
         **kwargs: Any) -> Any:
    """One AWS call under the retry policy, its errors translated to ours.

    Error codes in ``expected`` are answers the caller handles (a conditional write that
    lost, a table that does not exist yet), so they come back as the raw ClientError. An
    endpoint that stays unreachable through every retry raises UnreachableAfterRetriesError
    naming it and the setting to check.
    """
    def attempt() -> Any:
        try:
            return method(**kwargs)
        except Exception as exc:  # noqa: BLE001 - every botocore error is classified here
            if error_code(exc) in expected:
                raise
            raise translate_error(exc, what) from exc

    try:
        return policy.call(attempt, what, sleep=sleep)
    except RetriesExhaustedError as exc:
        if isinstance(exc.last_error, EndpointUnreachableError):
            service = getattr(getattr(method, "__self__", None), "meta", None)
            name = service.service_model.service_name if service is not None else "service"
            raise UnreachableAfterRetriesError(
                f"{exc.last_error} (no answer in {policy.max_attempts} attempts; check the "
                f"{name} endpoint setting or AWS_ENDPOINT_URL_{name.upper()})",
                exc.last_error) from exc
        raise
