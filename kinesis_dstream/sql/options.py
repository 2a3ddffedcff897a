"""The ``format("aws-kinesis")`` options: the awslabs connector's names, one parser for source
and sink.

Why one table of specs: the source and the sink share the connection options (endpoint,
region, stream, credentials), and a user who passes a sink option to the source, or mistypes
one, should hear about it by name instead of having it silently ignored. Each role adds its
own specs (``SINK_OPTIONS``; the source adds ``SOURCE_OPTIONS`` and a ``source`` field) and
``parse_options`` validates them all in one pass: an invalid value raises
``ConfigurationError`` naming the option, an unknown one is logged as a warning by name.

Keys are case-insensitive (Spark hands data sources a lower-cased dict); values are strings.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..config import ConsumerConfig, parse_duration_ms
from ..errors import ConfigurationError

log = logging.getLogger(__name__)

ENDPOINT_URL = "kinesis.endpointUrl"
REGION = "kinesis.region"
STREAM_NAME = "kinesis.streamName"
ACCESS_KEY_ID = "kinesis.awsAccessKeyId"
SECRET_KEY = "kinesis.awsSecretKey"
STS_ROLE_ARN = "kinesis.stsRoleArn"
STS_SESSION_NAME = "kinesis.stsSessionName"
STS_EXTERNAL_ID = "kinesis.stsExternalId"
SINK_FLUSH_WAIT_TIME_MS = "kinesis.sink.flushWaitTimeMs"
SINK_RECORD_MAX_BUFFERED_TIME_MS = "kinesis.sink.recordMaxBufferedTimeMs"
SINK_MAX_CONNECTIONS = "kinesis.sink.maxConnections"
SINK_AGGREGATION_ENABLED = "kinesis.sink.aggregationEnabled"

# Keys Spark itself may put into a data source's options; not ours to warn about.
SPARK_KEYS = frozenset({"path", "checkpointlocation", "queryname"})
# ConsumerConfig needs an application name; the sink has no lease table, so any name does.
SQL_APPLICATION_NAME = "kinesis-dstream-sql"


def _text(key: str, value: str) -> str:
    text = str(value).strip()
    if not text:
        raise ConfigurationError(f"{key}: must not be empty")
    return text


def _boolean(key: str, value: str) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ConfigurationError(f"{key}: expected true or false, got {value!r}")


def _positive_int(key: str, value: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigurationError(f"{key}: not a whole number: {value!r}") from None
    if number < 1:
        raise ConfigurationError(f"{key}: must be at least 1, got {number}")
    return number


def _duration_ms(key: str, value: str) -> int:
    number = parse_duration_ms(value, key)
    if number < 0:
        raise ConfigurationError(f"{key}: must not be negative, got {value!r}")
    return number


@dataclass(frozen=True)
class OptionSpec:
    """One option: its awslabs name, how to read it, and where the value goes.

    ``target`` is ``"config"`` (a ``ConsumerConfig`` field) or the name of a role's options
    object (``"sink"``); ``field`` is the field there.
    """

    name: str
    parse: Callable[[str, str], Any]
    target: str
    field: str


CONNECTION_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(ENDPOINT_URL, _text, "config", "kinesis_endpoint"),
    OptionSpec(REGION, _text, "config", "region_name"),
    OptionSpec(STREAM_NAME, _text, "config", "stream_name"),
    OptionSpec(ACCESS_KEY_ID, _text, "config", "aws_access_key_id"),
    OptionSpec(SECRET_KEY, _text, "config", "aws_secret_key"),
    OptionSpec(STS_ROLE_ARN, _text, "config", "sts_assume_role_arn"),
    OptionSpec(STS_SESSION_NAME, _text, "config", "sts_session_name"),
    OptionSpec(STS_EXTERNAL_ID, _text, "config", "sts_external_id"),
)

SINK_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(SINK_FLUSH_WAIT_TIME_MS, _duration_ms, "sink", "flush_wait_time_ms"),
    OptionSpec(SINK_RECORD_MAX_BUFFERED_TIME_MS, _duration_ms, "sink",
               "record_max_buffered_time_ms"),
    OptionSpec(SINK_MAX_CONNECTIONS, _positive_int, "sink", "max_connections"),
    OptionSpec(SINK_AGGREGATION_ENABLED, _boolean, "sink", "aggregation_enabled"),
)


@dataclass(frozen=True)
class SinkOptions:
    """The awslabs sink options and their defaults.

    ``flush_wait_time_ms`` is the first wait before failed entries are sent again (doubling,
    with jitter): the awslabs connector polls the KPL that often while flushing, and a
    synchronous producer has nothing else to wait for.
    """

    flush_wait_time_ms: int = 100
    record_max_buffered_time_ms: int = 1000
    max_connections: int = 1
    aggregation_enabled: bool = True


@dataclass(frozen=True)
class KinesisOptions:
    """What the options of one ``format("aws-kinesis")`` call mean, validated and typed."""

    config: ConsumerConfig
    sink: SinkOptions = field(default_factory=SinkOptions)
    unknown: tuple[str, ...] = ()

    @property
    def stream_name(self) -> str:
        return self.config.stream_name


_REGION_IN_ENDPOINT = re.compile(r"kinesis(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")


def region_from_endpoint(endpoint: str | None) -> str | None:
    """``https://kinesis.eu-west-1.amazonaws.com`` -> ``eu-west-1`` (the awslabs default)."""
    match = _REGION_IN_ENDPOINT.search(endpoint or "")
    return match.group(1) if match else None


def parse_options(options: Mapping[str, str],
                  roles: Sequence[tuple[OptionSpec, ...]] = (SINK_OPTIONS,),
                  **config_overrides: Any) -> KinesisOptions:
    """The options dict of a data source call -> ``KinesisOptions`` (config + role options).

    ``roles`` lists the spec tables besides the connection options that are known here (an
    option of another role counts as unknown: warned about, not used). Raises
    ``ConfigurationError`` naming the option for a missing stream name or a bad value.
    """
    specs = {spec.name.lower(): spec for table in (CONNECTION_OPTIONS, *roles) for spec in table}
    values: dict[str, dict[str, Any]] = {}
    unknown = []
    for key, value in options.items():
        spec = specs.get(key.lower())
        if spec is None:
            if key.lower() not in SPARK_KEYS:
                unknown.append(key)
            continue
        values.setdefault(spec.target, {})[spec.field] = spec.parse(spec.name, value)
    for key in unknown:
        log.warning("unknown option %r for format aws-kinesis: ignored (known: %s)", key,
                    ", ".join(sorted(spec.name for spec in specs.values())))
    config_values = values.pop("config", {})
    if "stream_name" not in config_values:
        raise ConfigurationError(f"{STREAM_NAME} is required: the Kinesis stream to use")
    if "region_name" not in config_values:
        region = region_from_endpoint(config_values.get("kinesis_endpoint"))
        if region:
            config_values["region_name"] = region
    pairs = ((ACCESS_KEY_ID, SECRET_KEY, "aws_access_key_id", "aws_secret_key"),
             (STS_ROLE_ARN, STS_SESSION_NAME, "sts_assume_role_arn", "sts_session_name"))
    for first, second, first_field, second_field in pairs:
        if (first_field in config_values) != (second_field in config_values):
            raise ConfigurationError(f"{first} and {second} must be given together")
    if "sts_assume_role_arn" in config_values and "sts_external_id" not in config_values:
        # ConsumerConfig (and the client that assumes the role) take the three together.
        raise ConfigurationError(f"{STS_ROLE_ARN} needs {STS_EXTERNAL_ID} as well for now")
    if "sts_external_id" in config_values and "sts_assume_role_arn" not in config_values:
        raise ConfigurationError(f"{STS_EXTERNAL_ID} needs {STS_ROLE_ARN} and {STS_SESSION_NAME}")
    config_values.setdefault("application_name", SQL_APPLICATION_NAME)
    config_values.update(config_overrides)
    config = ConsumerConfig(**config_values)
    sink = SinkOptions(**values.pop("sink", {}))
    return KinesisOptions(config=config, sink=sink, unknown=tuple(unknown))
