"""The ``format("aws-kinesis")`` options: the awslabs connector's names, one parser for source
and sink.

Why one table of specs: the source and the sink share the connection options (endpoint,
region, stream, credentials, STS), so they are read and checked by the same code, and a user
who passes a sink option to the source (or the other way round), or mistypes one, hears
about it by name instead of having it silently ignored. Each role adds its own specs
(``SINK_OPTIONS``, ``SOURCE_OPTIONS``); ``parse_options`` (sink) and ``parse_source_options``
(source) validate the connection specs and their role's in one pass: an invalid value raises
``ConfigurationError`` naming the option, on the driver, before anything starts; an unknown
one is logged as a warning naming it rather than refused, because Spark passes every
``.option()`` the user set and jobs often carry options of other connectors.

Keys are case-insensitive (Spark hands data sources a lower-cased dict); values are strings.
Error messages use the awslabs spelling of the name (``kinesis.streamName``).
"""
from __future__ import annotations

import datetime as _dt
import difflib
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..config import ConsumerConfig, parse_duration_ms
from ..errors import ConfigurationError
from ..retrieval import MAX_FETCH_TIME_PER_SHARD_S

log = logging.getLogger(__name__)

# -- connection options: both roles ---------------------------------------------------------
ENDPOINT_URL = "kinesis.endpointUrl"
REGION = "kinesis.region"
STREAM_NAME = "kinesis.streamName"
ACCESS_KEY_ID = "kinesis.awsAccessKeyId"
SECRET_KEY = "kinesis.awsSecretKey"
STS_ROLE_ARN = "kinesis.stsRoleArn"
STS_SESSION_NAME = "kinesis.stsSessionName"
STS_EXTERNAL_ID = "kinesis.stsExternalId"  # our extension: roles whose trust policy wants one
STS_ENDPOINT_URL = "kinesis.stsEndpointUrl"
# -- sink ------------------------------------------------------------------------------------
SINK_FLUSH_WAIT_TIME_MS = "kinesis.sink.flushWaitTimeMs"
SINK_RECORD_MAX_BUFFERED_TIME_MS = "kinesis.sink.recordMaxBufferedTimeMs"
SINK_MAX_CONNECTIONS = "kinesis.sink.maxConnections"
SINK_AGGREGATION_ENABLED = "kinesis.sink.aggregationEnabled"
# -- source ----------------------------------------------------------------------------------
KINESIS_REGION = "kinesis.kinesisRegion"
CONSUMER_TYPE = "kinesis.consumerType"
FAIL_ON_DATA_LOSS = "kinesis.failOnDataLoss"
MAX_FETCH_RECORDS_PER_SHARD = "kinesis.maxFetchRecordsPerShard"
STARTING_POSITION = "kinesis.startingPosition"
DESCRIBE_SHARD_INTERVAL = "kinesis.describeShardInterval"
METADATA_COMMITTER_TYPE = "kinesis.metadataCommitterType"
METADATA_PATH = "kinesis.metadataPath"
DYNAMODB_TABLE_NAME = "kinesis.dynamodb.tableName"
DYNAMODB_ENDPOINT_URL = "kinesis.dynamodb.endpointUrl"  # our extension
RECORDS_PER_FETCH = "kinesis.getRecords.numberOfRecordsPerFetch"
FETCH_INTERVAL_MS = "kinesis.getRecords.fetchIntervalMs"
CLIENT_NUM_RETRIES = "kinesis.clientNumRetries"
CLIENT_RETRY_INTERVALS_MS = "kinesis.clientRetryIntervalsMs"
MAX_RECORDS_PER_TRIGGER = "kinesis.maxRecordsPerTrigger"  # our extension: ReadMaxRows
MAX_FETCH_TIME_PER_SHARD_MS = "kinesis.maxFetchTimePerShardMs"  # our extension
SHARDS_PER_TASK = "kinesis.shardsPerTask"  # the Databricks connector's shardsPerTask
ARROW_BATCHES = "kinesis.arrowBatches"  # our extension: read() yields Arrow (true) or tuples
# awslabs source options we accept and have nothing to do for (said in the README).
ACCEPTED_WITHOUT_EFFECT = ("kinesis.minBatchesToRetain", "kinesis.checkNewRecordThreads",
                           "kinesis.metadataNumRetries", "kinesis.metadataRetryIntervalsMs",
                           "kinesis.metadataMaxRetryIntervalMs",
                           "kinesis.clientMaxRetryIntervalMs")

# Keys Spark itself may put into a data source's options; not ours to warn about.
SPARK_KEYS = frozenset({"path", "checkpointlocation", "queryname"})
# ConsumerConfig needs an application name; the sink has no lease table, so any name does.
SQL_APPLICATION_NAME = "kinesis-dstream-sql"
# The source's range table is named after kinesis.dynamodb.tableName, this by default.
DEFAULT_TABLE_PREFIX = "spark-kinesis-source"
# GetRecords returns at most this many records per call (the Kinesis limit).
MAX_RECORDS_PER_GET = 10_000


# -- value parsers: (option name, text) -> value, raising ConfigurationError naming it --------
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


def _whole_number(key: str, value: str, minimum: int, maximum: int | None = None) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigurationError(f"{key}: not a whole number: {value!r}") from None
    if number < minimum:
        raise ConfigurationError(f"{key}: must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ConfigurationError(f"{key}: must be at most {maximum}, got {number}")
    return number


def _positive_int(key: str, value: str) -> int:
    return _whole_number(key, value, 1)


def _records_per_fetch(key: str, value: str) -> int:
    return _whole_number(key, value, 1, MAX_RECORDS_PER_GET)


def _attempts(key: str, value: str) -> int:
    """The awslabs option counts retries; ``ConsumerConfig`` counts attempts (one more)."""
    return _whole_number(key, value, 0) + 1


def _duration_ms(key: str, value: str) -> int:
    number = parse_duration_ms(value, key)
    if number < 0:
        raise ConfigurationError(f"{key}: must not be negative, got {value!r}")
    return number


def _positive_duration_ms(key: str, value: str) -> int:
    """For waits between retries: 0 would make every retry a hot loop against the service."""
    number = _duration_ms(key, value)
    if number < 1:
        raise ConfigurationError(f"{key}: must be at least 1 ms, got {value!r}")
    return number


def _seconds(key: str, value: str) -> float:
    return _duration_ms(key, value) / 1000


def _one_of(*choices: str) -> Callable[[str, str], str]:
    """A parser accepting ``choices`` in any case and returning the one spelled as here."""
    by_lower = {choice.lower(): choice for choice in choices}

    def parse(key: str, value: str) -> str:
        text = str(value).strip()
        if text.lower() not in by_lower:
            raise ConfigurationError(
                f"{key}: expected {' or '.join(choices)}, got {value!r}")
        return by_lower[text.lower()]
    return parse


_committer_type = _one_of("HDFS", "DYNAMODB")


def _consumer_type(key: str, value: str) -> str:
    kind = _one_of("GetRecords", "SubscribeToShard")(key, value)
    if kind == "SubscribeToShard":
        raise ConfigurationError(
            f"{key}: SubscribeToShard (enhanced fan-out) is not supported yet by this source; "
            "use GetRecords (the default)")
    return kind


def _accepted(key: str, value: str) -> str:
    return str(value)


@dataclass(frozen=True)
class StartingPosition:
    """LATEST, TRIM_HORIZON (EARLIEST), or AT_TIMESTAMP with epoch seconds."""

    kind: str
    timestamp: float | None = None


def parse_starting_position(text: str, key: str = STARTING_POSITION) -> StartingPosition:
    """``LATEST``, ``TRIM_HORIZON``/``EARLIEST``, or ``AT_TIMESTAMP <ISO 8601 time>``."""
    words = str(text).strip().split(None, 1)
    kind = words[0].upper() if words else ""
    if kind in ("LATEST", "TRIM_HORIZON", "EARLIEST") and len(words) == 1:
        return StartingPosition("TRIM_HORIZON" if kind == "EARLIEST" else kind)
    if kind == "AT_TIMESTAMP" and len(words) == 2:
        raw = words[1].strip()
        try:
            moment = _dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigurationError(
                f"{key}: cannot read {raw!r} as an ISO 8601 time") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=_dt.timezone.utc)
        return StartingPosition("AT_TIMESTAMP", moment.timestamp())
    raise ConfigurationError(
        f"{key}: expected LATEST, TRIM_HORIZON, EARLIEST or 'AT_TIMESTAMP <ISO time>', "
        f"got {text!r}")


def _starting_position(key: str, value: str) -> StartingPosition:
    return parse_starting_position(value, key)


# -- the table -------------------------------------------------------------------------------
@dataclass(frozen=True)
class OptionSpec:
    """One option: its awslabs name, how to read it, and where the value goes.

    ``target`` is ``"config"`` (a ``ConsumerConfig`` field) or the role whose options object
    takes it (``"sink"``, ``"source"``); ``field`` is the field there, or ``""`` for an option
    that is validated and then has no effect. ``aliases`` are the qubole kinesis-sql names of
    the options that mean exactly the same there, so jobs written for that jar (and for
    ``format("kinesis")``) run unchanged.
    """

    name: str
    parse: Callable[[str, str], Any]
    target: str
    field: str
    aliases: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """The lower-cased keys this option is found under."""
        return tuple(key.lower() for key in (self.name, *self.aliases))


CONNECTION_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(ENDPOINT_URL, _text, "config", "kinesis_endpoint", ("endpointUrl",)),
    OptionSpec(REGION, _text, "config", "region_name", ("regionName",)),
    OptionSpec(STREAM_NAME, _text, "config", "stream_name", ("streamName",)),
    OptionSpec(ACCESS_KEY_ID, _text, "config", "aws_access_key_id", ("awsAccessKeyId",)),
    OptionSpec(SECRET_KEY, _text, "config", "aws_secret_key", ("awsSecretKey",)),
    OptionSpec(STS_ROLE_ARN, _text, "config", "sts_assume_role_arn", ("awsSTSRoleARN",)),
    OptionSpec(STS_SESSION_NAME, _text, "config", "sts_session_name", ("awsSTSSessionName",)),
    OptionSpec(STS_EXTERNAL_ID, _text, "config", "sts_external_id"),
    OptionSpec(STS_ENDPOINT_URL, _text, "config", "sts_endpoint"),
)

SINK_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(SINK_FLUSH_WAIT_TIME_MS, _positive_duration_ms, "sink", "flush_wait_time_ms"),
    OptionSpec(SINK_RECORD_MAX_BUFFERED_TIME_MS, _duration_ms, "sink",
               "record_max_buffered_time_ms"),
    OptionSpec(SINK_MAX_CONNECTIONS, _positive_int, "sink", "max_connections"),
    OptionSpec(SINK_AGGREGATION_ENABLED, _boolean, "sink", "aggregation_enabled"),
)

SOURCE_OPTIONS: tuple[OptionSpec, ...] = (
    # kinesis.region wins over it: resolved in parse_source_options.
    OptionSpec(KINESIS_REGION, _text, "source", "kinesis_region"),
    OptionSpec(DYNAMODB_TABLE_NAME, _text, "config", "application_name"),
    OptionSpec(DYNAMODB_ENDPOINT_URL, _text, "config", "dynamodb_endpoint"),
    OptionSpec(RECORDS_PER_FETCH, _records_per_fetch, "config", "max_records"),
    OptionSpec(FETCH_INTERVAL_MS, _duration_ms, "config", "idle_time_between_reads_ms"),
    OptionSpec(CLIENT_NUM_RETRIES, _attempts, "config", "retry_max_attempts"),
    OptionSpec(CLIENT_RETRY_INTERVALS_MS, _positive_duration_ms, "config", "retry_wait_time_ms"),
    OptionSpec(SHARDS_PER_TASK, _positive_int, "config", "shards_per_task", ("shardsPerTask",)),
    OptionSpec(STARTING_POSITION, _starting_position, "source", "starting_position",
               ("startingPosition",)),
    OptionSpec(FAIL_ON_DATA_LOSS, _boolean, "source", "fail_on_data_loss"),
    OptionSpec(MAX_FETCH_RECORDS_PER_SHARD, _positive_int, "source",
               "max_fetch_records_per_shard"),
    OptionSpec(MAX_RECORDS_PER_TRIGGER, _positive_int, "source", "max_records_per_trigger"),
    OptionSpec(MAX_FETCH_TIME_PER_SHARD_MS, _seconds, "source", "max_fetch_time_per_shard_s"),
    OptionSpec(DESCRIBE_SHARD_INTERVAL, _seconds, "source", "describe_shard_interval_s"),
    OptionSpec(METADATA_COMMITTER_TYPE, _committer_type, "source", "metadata_committer_type"),
    OptionSpec(ARROW_BATCHES, _boolean, "source", "arrow_batches"),
    OptionSpec(CONSUMER_TYPE, _consumer_type, "source", ""),
    OptionSpec(METADATA_PATH, _accepted, "source", ""),
    *(OptionSpec(name, _accepted, "source", "") for name in ACCEPTED_WITHOUT_EFFECT),
)

# Every role's table, by the name the warnings use.
ROLE_OPTIONS: Mapping[str, tuple[OptionSpec, ...]] = {"sink": SINK_OPTIONS,
                                                      "source": SOURCE_OPTIONS}
_ROLE_DOING = {"sink": "writing", "source": "reading"}

# ConsumerConfig values the source starts from (the awslabs defaults where it has one). The
# shard reader is told where to start by each offset, so the config's own position is moot.
_SOURCE_CONFIG_DEFAULTS: Mapping[str, Any] = dict(
    application_name=DEFAULT_TABLE_PREFIX, max_records=MAX_RECORDS_PER_GET,
    idle_time_between_reads_ms=200, retry_max_attempts=6, retry_wait_time_ms=1000,
    metrics_level="NONE", initial_position="TRIM_HORIZON", worker_id="spark-sql-source")


# -- what the parsers return -----------------------------------------------------------------
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
    """What the options of one ``format("aws-kinesis")`` write mean, validated and typed."""

    config: ConsumerConfig
    sink: SinkOptions = field(default_factory=SinkOptions)
    unknown: tuple[str, ...] = ()

    @property
    def stream_name(self) -> str:
        return self.config.stream_name


@dataclass(frozen=True)
class SourceOptions:
    """What the options of one ``readStream.format("aws-kinesis")`` mean: the shard reader's
    config and what only the SQL source uses."""

    config: ConsumerConfig
    starting_position: StartingPosition = field(
        default_factory=lambda: StartingPosition("LATEST"))
    fail_on_data_loss: bool = False
    max_fetch_records_per_shard: int = 100_000
    max_records_per_trigger: int | None = None
    max_fetch_time_per_shard_s: float = MAX_FETCH_TIME_PER_SHARD_S
    describe_shard_interval_s: float = 1.0
    metadata_committer_type: str = "HDFS"
    arrow_batches: bool = True
    unknown: tuple[str, ...] = ()

    @property
    def range_table_name(self) -> str:
        from ..aws.range_table import range_table_name

        return range_table_name(self.config.application_name)


_REGION_IN_ENDPOINT = re.compile(r"kinesis(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")


def region_from_endpoint(endpoint: str | None) -> str | None:
    """``https://kinesis.eu-west-1.amazonaws.com`` -> ``eu-west-1`` (the awslabs default)."""
    match = _REGION_IN_ENDPOINT.search(endpoint or "")
    return match.group(1) if match else None


# -- the one pass ----------------------------------------------------------------------------
@dataclass
class _Read:
    values: dict[str, dict[str, Any]]
    given: frozenset[str]
    unknown: tuple[str, ...]


def _read(options: Mapping[str, Any], role: str) -> _Read:
    """Parse every option that the connection table or ``role``'s table knows; warn about
    the rest by name, saying so when an option belongs to the other role."""
    specs = {key: spec for table in (CONNECTION_OPTIONS, ROLE_OPTIONS[role])
             for spec in table for key in spec.keys}
    elsewhere = {key: (other, spec) for other, table in ROLE_OPTIONS.items()
                 if other != role for spec in table for key in spec.keys}
    values: dict[str, dict[str, Any]] = {}
    given: dict[str, str] = {}  # option name -> the key it was given under
    unknown = []
    for raw_key, value in options.items():
        key = str(raw_key)
        spec = specs.get(key.lower())
        if spec is None:
            if key.lower() not in SPARK_KEYS:
                unknown.append(key)
            continue
        if spec.name in given:
            # Both spellings of one option: which one wins would depend on dict order.
            raise ConfigurationError(
                f"{spec.name}: given twice, as {given[spec.name]!r} and as {key!r}; keep one")
        given[spec.name] = key
        label = spec.name if key.lower() == spec.name.lower() else f"{spec.name} (as {key})"
        parsed = spec.parse(label, value)
        if spec.field:
            values.setdefault(spec.target, {})[spec.field] = parsed
    for key in unknown:
        if key.lower() in elsewhere:
            other, spec = elsewhere[key.lower()]
            log.warning("option %r is a %s option (%s): it does not apply to %s with format "
                        "aws-kinesis; ignored", key, other, spec.name, _ROLE_DOING[role])
            continue
        close = difflib.get_close_matches(key.lower(), list(specs), n=1, cutoff=0.8)
        log.warning("unknown option %r for format aws-kinesis (%s): ignored%s", key,
                    _ROLE_DOING[role], f"; did you mean {specs[close[0]].name}?" if close else "")
    return _Read(values, frozenset(given), tuple(unknown))


def _check_connection(config_values: dict[str, Any]) -> None:
    """The rules between connection options, checked here so that errors name the options
    rather than ``ConsumerConfig``'s fields; and the region from the endpoint if none given."""
    if "stream_name" not in config_values:
        raise ConfigurationError(f"{STREAM_NAME} is required: the Kinesis stream to use")
    if "region_name" not in config_values:
        region = region_from_endpoint(config_values.get("kinesis_endpoint"))
        if region:
            config_values["region_name"] = region
    if ("aws_access_key_id" in config_values) != ("aws_secret_key" in config_values):
        raise ConfigurationError(f"{ACCESS_KEY_ID} and {SECRET_KEY} must be given together")
    if "sts_assume_role_arn" in config_values:
        if "sts_session_name" not in config_values:
            raise ConfigurationError(f"{STS_ROLE_ARN} needs {STS_SESSION_NAME} as well")
        return
    without_role = [name for name, key in ((STS_SESSION_NAME, "sts_session_name"),
                                           (STS_EXTERNAL_ID, "sts_external_id"))
                    if key in config_values]
    if without_role:
        raise ConfigurationError(
            f"{' and '.join(without_role)} given without {STS_ROLE_ARN}, the role to assume")


def parse_options(options: Mapping[str, Any], **config_overrides: Any) -> KinesisOptions:
    """The options of a write -> ``KinesisOptions`` (config + sink options).

    ``config_overrides`` are ``ConsumerConfig`` fields set after the options. Raises
    ``ConfigurationError`` naming the option for a missing stream name or a bad value.
    """
    read = _read(options, "sink")
    config_values = read.values.get("config", {})
    _check_connection(config_values)
    config_values.setdefault("application_name", SQL_APPLICATION_NAME)
    config_values.update(config_overrides)
    return KinesisOptions(config=ConsumerConfig(**config_values),
                          sink=SinkOptions(**read.values.get("sink", {})), unknown=read.unknown)


def parse_source_options(options: Mapping[str, Any]) -> SourceOptions:
    """The options of a streaming read -> ``SourceOptions``.

    Raises ``ConfigurationError`` naming the option for a missing stream name or endpoint
    (both required, as in the awslabs connector) or a bad value.
    """
    read = _read(options, "source")
    config_values = read.values.get("config", {})
    source_values = read.values.get("source", {})
    kinesis_region = source_values.pop("kinesis_region", None)
    if kinesis_region and "region_name" not in config_values:
        config_values["region_name"] = kinesis_region
    _check_connection(config_values)
    if "fail_on_data_loss" in source_values:  # the executors' readers decide on a trimmed start
        config_values["fail_on_data_loss"] = source_values["fail_on_data_loss"]
    if "kinesis_endpoint" not in config_values:
        raise ConfigurationError(f"{ENDPOINT_URL} is required: the Kinesis endpoint to read from")
    # Read on the driver so that executors, which may lack the variable, use the same table.
    config_values.setdefault("dynamodb_endpoint",
                             os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or None)
    for name, value in _SOURCE_CONFIG_DEFAULTS.items():
        config_values.setdefault(name, value)
    source = SourceOptions(config=ConsumerConfig(**config_values), unknown=read.unknown,
                           **source_values)
    if source.metadata_committer_type == "HDFS":
        log.info("aws-kinesis source: %s HDFS: batch ranges are kept in DynamoDB table %s all "
                 "the same (our only range store); the query's offsets stay in its "
                 "checkpointLocation", METADATA_COMMITTER_TYPE, source.range_table_name)
    if METADATA_PATH in read.given:
        log.info("aws-kinesis source: %s is not used: ranges are keyed by the query id kept in "
                 "the checkpoint's offset log", METADATA_PATH)
    return source

