"""boto3 clients with bounded time, and one table from AWS error codes to our errors.

botocore's own retries are switched off: every retry goes through ``retry.RetryPolicy`` so
the Spark retry settings mean what they say. The tables below are the only place AWS error
codes are read; ``retry.classify`` reads the kind of the error they become. Connect and read
timeouts are short so a dead endpoint fails in seconds, naming its URL.

boto3 and the heavy parts of botocore are imported by the first client made, not with this
module: each of Spark's Python processes for a SQL source imports the package, and most of
them make no client (``botocore_parts`` holds what a client is built from). What is imported
here, ``botocore.exceptions``, costs a few milliseconds.
"""
from __future__ import annotations

import logging
import os
import platform
import random
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, overload

import botocore  # its version only, for USER_AGENT
import botocore.exceptions

from ..config import ConsumerConfig, default_sts_session_name
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
from .protocols import CloudWatchAPI, DynamoDBAPI, KinesisAPI

if TYPE_CHECKING:
    import boto3
    import botocore.config
    import botocore.credentials

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
    """A session whose credentials are the configured ones, or an assumed role's.

    An assumed role's credentials expire (``sts_duration_s``); they are botocore
    ``RefreshableCredentials``, re-assumed before expiry without the worker noticing,
    instead of failing with ExpiredToken an hour after start; the process's clients share
    them (``role_credentials``), so STS sees one AssumeRole per process and role.
    """
    import boto3.session
    import botocore.session

    from .botocore_parts import FixedProvider, shared_models

    try:
        session = boto3.session.Session(
            aws_access_key_id=config.aws_access_key_id,
            aws_secret_access_key=config.aws_secret_key,
            aws_session_token=config.aws_session_token,
            region_name=config.region_name,
            profile_name=config.aws_profile,
        )
    except botocore.exceptions.ProfileNotFound:
        raise ConfigurationError(f"profile {config.aws_profile!r} is in none of the shared "
                                 "config and credentials files") from None
    session._session.register_component("data_loader", shared_models())
    if config.sts_assume_role_arn is None:
        return session
    botocore_session = botocore.session.get_session()
    botocore_session.register_component("data_loader", shared_models())
    botocore_session.get_component("credential_provider").insert_before(
        "env", FixedProvider(role_credentials(config, session)))
    return boto3.session.Session(botocore_session=botocore_session,
                                 region_name=config.region_name)


# A role's credentials, shared by every client of the process that assumes it with the same
# identity and STS settings: its Kinesis, DynamoDB and CloudWatch clients, every stream's and
# reader's. Each client assuming on its own would send STS an AssumeRole per client (a Spark
# driver makes several; an executor's Python worker two per stream), where the docs promise
# one per process and role, again only before expiry. Bounded: a process that meets more
# roles than this assumes the least recently used again when it needs it.
MAX_SHARED_ROLES = 32
_roles: "OrderedDict[tuple[Any, ...], botocore.credentials.RefreshableCredentials]" = \
    OrderedDict()
_roles_lock = threading.Lock()


def _role_key(config: ConsumerConfig, base: boto3.session.Session) -> tuple[Any, ...]:
    """What makes two configs' assumed roles the same session: the role, its session name
    and external id, STS's endpoint and region, the duration, and the identity assuming it
    (the base session's key id and token; the endpoint boto3 would take from the
    environment, which a test may change between configs)."""
    base_credentials = base.get_credentials()
    identity = (None, None) if base_credentials is None else \
        (base_credentials.access_key, base_credentials.token)
    return (config.sts_assume_role_arn, config.sts_session_name, config.sts_external_id,
            config.sts_endpoint or os.environ.get("AWS_ENDPOINT_URL_STS"),
            config.sts_region or config.region_name, config.sts_duration_s,
            config.sts_refresh_margin_s, config.aws_profile, *identity)


def role_credentials(config: ConsumerConfig, base: boto3.session.Session
                     ) -> botocore.credentials.RefreshableCredentials:
    """``config``'s role, assumed once per process (``assumed_role_credentials``) and shared
    by every client that asks for it; refreshed before expiry by whichever client uses it."""
    key = _role_key(config, base)
    with _roles_lock:  # held while STS answers: concurrent first clients wait for one call
        credentials = _roles.get(key)
        if credentials is None:
            credentials = _roles[key] = assumed_role_credentials(config, base)
            while len(_roles) > MAX_SHARED_ROLES:
                _roles.popitem(last=False)
        else:
            _roles.move_to_end(key)
        return credentials


def assumed_role_credentials(config: ConsumerConfig, base: boto3.session.Session
                             ) -> botocore.credentials.RefreshableCredentials:
    """Credentials of ``config.sts_assume_role_arn``, assumed again before they expire.

    botocore refreshes them when less than ``sts_refresh_margin_s`` is left (default: a
    quarter of the session, at most botocore's 15 minutes), and blocks callers only when
    less than half that is left.
    """
    import botocore.credentials

    sts = base.client("sts", endpoint_url=config.sts_endpoint or None,
                      region_name=config.sts_region or None, config=_botocore_config(config))
    arn = config.sts_assume_role_arn
    assert arn is not None  # the caller assumes only a configured role
    # A role given without a session name (Databricks makes it optional): one of ours.
    session_name = config.sts_session_name or default_sts_session_name()

    # ExternalId is optional in AssumeRole: sent only when the config has one, since STS
    # refuses an empty one and a role whose trust policy names none needs none.
    extra: dict[str, Any] = ({} if config.sts_external_id is None
                             else {"ExternalId": config.sts_external_id})

    def assume() -> Mapping[str, Any]:
        try:
            reply = sts.assume_role(RoleArn=arn, RoleSessionName=session_name,
                                    DurationSeconds=config.sts_duration_s, **extra)
        except Exception as exc:  # noqa: BLE001 - translated
            raise translate_error(exc, f"assuming role {arn}") from exc
        creds = reply["Credentials"]
        log.info("assumed role %s (session %s); credentials expire at %s", arn,
                 session_name, creds["Expiration"].isoformat())
        return creds

    def refresh() -> dict[str, str]:
        creds = assume()
        return {"access_key": creds["AccessKeyId"], "secret_key": creds["SecretAccessKey"],
                "token": creds["SessionToken"], "expiry_time": creds["Expiration"].isoformat()}

    margin = (config.sts_refresh_margin_s if config.sts_refresh_margin_s is not None
              else min(900, config.sts_duration_s // 4))
    first = assume()
    return botocore.credentials.RefreshableCredentials(
        access_key=first["AccessKeyId"], secret_key=first["SecretAccessKey"],
        token=first["SessionToken"], expiry_time=first["Expiration"],
        refresh_using=refresh, method="assume-role",
        advisory_timeout=margin, mandatory_timeout=margin // 2)


# A fixed User-Agent. botocore otherwise assembles its structured one anew for every
# request, a sizeable share of the CPU of an empty GetRecords, which every idle shard pays
# once a batch.
USER_AGENT = (f"kinesis-dstream botocore/{botocore.__version__} "
              f"Python/{platform.python_version()}")


def _botocore_config(config: ConsumerConfig, *, read_timeout_s: float | None = None,
                     pool_size: int = 50, proxies: Mapping[str, str] | None = None
                     ) -> botocore.config.Config:
    import botocore.config

    return botocore.config.Config(
        proxies=dict(proxies) if proxies else None,
        connect_timeout=config.connect_timeout_s,
        read_timeout=config.read_timeout_s if read_timeout_s is None else read_timeout_s,
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=pool_size,
        user_agent=USER_AGENT,
    )


@overload
def make_client(config: ConsumerConfig, service: Literal["kinesis"], *,
                read_timeout_s: float | None = None, pool_size: int = 50,
                proxies: Mapping[str, str] | None = None) -> KinesisAPI: ...
@overload
def make_client(config: ConsumerConfig, service: Literal["dynamodb"]) -> DynamoDBAPI: ...
@overload
def make_client(config: ConsumerConfig, service: Literal["cloudwatch"]) -> CloudWatchAPI: ...
@overload
def make_client(config: ConsumerConfig, service: Literal["s3"]) -> Any: ...
def make_client(config: ConsumerConfig, service: str, *, read_timeout_s: float | None = None,
                pool_size: int = 50, proxies: Mapping[str, str] | None = None) -> Any:
    """A boto3 client for ``kinesis``, ``dynamodb``, ``cloudwatch`` or ``s3`` (the file
    range store's, ``range_blobs``).

    An explicit endpoint in the config wins; otherwise boto3 resolves it, honouring
    ``AWS_ENDPOINT_URL_<SERVICE>`` as the local harness prints them, in the service's
    region (``ConsumerConfig.kinesis_region`` for Kinesis). ``read_timeout_s`` and
    ``pool_size`` are for a client of long-lived subscriptions (one connection each);
    ``proxies`` (botocore's, scheme -> proxy URL) for the sink's proxy options.
    """
    endpoint = {
        "kinesis": config.kinesis_endpoint,
        "dynamodb": config.dynamodb_endpoint,
        "cloudwatch": config.cloudwatch_endpoint,
        "s3": config.s3_endpoint,
    }.get(service)
    session = _session(config.credentials_for(service))
    # Kinesis may sign in another region than DynamoDB, CloudWatch and STS (the stream's ARN,
    # kinesis_region_name); the session's credentials are the same.
    region = config.kinesis_region if service == "kinesis" else config.region_name
    if service == "kinesis":
        # Keep ApproximateArrivalTimestamp as the epoch seconds on the wire: botocore would
        # build a tz-aware datetime per record only for us to turn it back into epoch
        # milliseconds.
        from .botocore_parts import KinesisParserFactory

        factory = KinesisParserFactory()
        factory.set_parser_defaults(timestamp_parser=lambda value: value)
        session._session.register_component("response_parser_factory", factory)
    if session.get_credentials() is None:
        raise CredentialsError(
            f"no AWS credentials found for {service}: pass awsAccessKeyId/awsSecretKey, or set "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or an instance role"
        )
    try:
        # boto3-stubs types session.client per literal service name; the overloads above do
        return session.client(service, endpoint_url=endpoint or None,  # type: ignore[call-overload]
                              region_name=region,
                              config=_botocore_config(config, read_timeout_s=read_timeout_s,
                                                      pool_size=pool_size, proxies=proxies))
    except ValueError as exc:
        raise ConfigurationError(f"bad {service} endpoint {endpoint!r}: {exc}") from exc


def _endpoint_of(exc: BaseException) -> str:
    return str(getattr(exc, "kwargs", {}).get("endpoint_url", "") or "")


def error_for_code(code: str, text: str, status: int = 0) -> KinesisDStreamError:
    """Our error for an AWS error code: of a whole call, or of one PutRecords entry. The
    error keeps the code (``code``)."""
    error = _error_class(code, status)(text)
    error.code = code or None
    return error


def _error_class(code: str, status: int) -> type[KinesisDStreamError]:
    if code == "ResourceNotFoundException":
        return StreamNotFoundError
    if code == "ExpiredIteratorException":
        return ExpiredIteratorError
    if code in _THROTTLING:
        return ThrottlingError
    if code in _CREDENTIALS:
        return CredentialsError
    if code in _TRANSIENT or status >= 500:
        return TransientServiceError
    if code in ("ValidationException", "InvalidArgumentException"):
        return ConfigurationError
    return KinesisDStreamError


def translate_error(exc: BaseException, what: str) -> KinesisDStreamError:
    """Map a botocore/boto3 exception to ours; ``what`` says what we were doing."""
    if isinstance(exc, KinesisDStreamError):
        return exc
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        message = error.get("Message", "") or str(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return error_for_code(code, f"{what}: {code}: {message}", status)
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
         rand: Callable[[], float] = random.random, **kwargs: Any) -> Any:
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
        return policy.call(attempt, what, sleep=sleep, rand=rand)
    except RetriesExhaustedError as exc:
        if isinstance(exc.last_error, EndpointUnreachableError):
            service = getattr(getattr(method, "__self__", None), "meta", None)
            name = service.service_model.service_name if service is not None else "service"
            raise UnreachableAfterRetriesError(
                f"{exc.last_error} (no answer in {policy.max_attempts} attempts; check the "
                f"{name} endpoint setting or AWS_ENDPOINT_URL_{name.upper()})",
                exc.last_error) from exc
        raise
