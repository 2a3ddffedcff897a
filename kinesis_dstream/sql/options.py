"""What the ``format("aws-kinesis")`` options mean: one pass over them (the tables are in
``option_table``) gives the validated, typed ``SourceOptions`` or ``KinesisOptions``.

An invalid value raises ``ConfigurationError`` naming the option, on the driver, before
anything starts. An unknown option is warned about by name (and a sink option given to the
source, or the other way round, is said to be one) rather than refused, because Spark passes
every ``.option()`` the user set and jobs often carry options of other connectors. Keys are
case-insensitive (Spark hands data sources a lower-cased dict); messages use the awslabs
spelling (``kinesis.streamName``).
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping
from urllib.parse import quote

from ..aws.range_location import root_of
from ..aws.stream_consumer import QUERY_CONSUMER_PREFIX
from ..config import (
    ConsumerConfig,
    StreamArn,
    check_credentials,
    default_region,
    parse_stream_arn,
)
from ..errors import ConfigurationError
from ..retrieval import MAX_FETCH_TIME_PER_SHARD_S, StartingPosition
from ..settings import Read
from .credential_provider import apply_provider
from .option_table import (
    APPLICATION_NAME,
    AWSLABS_CONSUMER_NAME,
    CONNECTION_OPTIONS,
    CONSUMER_TYPE,
    DEFAULT_TABLE_PREFIX,
    ENDPOINT_URL,
    KINESIS_REGION,
    LEASE_TABLE_NAME,
    MAX_FETCH_TIME_PER_SHARD_MS,
    MAX_FETCH_TIME_PER_SHARD_SEC,
    MAX_RECORDS_PER_GET,
    METADATA_COMMITTER_TYPE,
    METADATA_PATH,
    REGION,
    ROLE_DOING,
    ROLES,
    SINK_PROXY_ADDRESS,
    SINK_PROXY_PASSWORD,
    SINK_PROXY_PORT,
    SINK_PROXY_USERNAME,
    SQL_APPLICATION_NAME,
    STARTING_POSITION,
    STREAM_ARN,
    STREAM_NAME,
)
from .other_connectors import endpoint_of_region, warn_no_effect
from .starting_position import ShardStarts
from .vocabulary import default_fail_on_data_loss

log = logging.getLogger(__name__)

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
    # kinesis.sink.recordTtl: the most a write spends getting its records in, retries included.
    record_ttl_ms: int = 30_000
    proxy_address: str | None = None
    proxy_port: int = 443
    proxy_username: str | None = None
    proxy_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.proxy_address is None and (self.proxy_username or self.proxy_password):
            raise ConfigurationError(f"{SINK_PROXY_USERNAME} and {SINK_PROXY_PASSWORD} need "
                                     f"{SINK_PROXY_ADDRESS} (the proxy they sign in to)")
        if (self.proxy_username is None) != (self.proxy_password is None):
            raise ConfigurationError(f"{SINK_PROXY_USERNAME} and {SINK_PROXY_PASSWORD}: give "
                                     "both or neither")
        if self.proxy_address is not None and not re.fullmatch(r"[A-Za-z0-9.:\[\]-]+",
                                                                self.proxy_address):
            raise ConfigurationError(f"{SINK_PROXY_ADDRESS}: {self.proxy_address!r} is not a "
                                     f"host name or address (the port goes in {SINK_PROXY_PORT})")

    @property
    def proxies(self) -> dict[str, str] | None:
        """botocore's ``proxies`` for the sink's client: every scheme through the proxy, as
        the KPL sends everything through its proxyHost; None without one."""
        if self.proxy_address is None:
            return None
        login = "" if self.proxy_username is None else \
            f"{quote(self.proxy_username, safe='')}:{quote(self.proxy_password or '', safe='')}@"
        url = f"http://{login}{self.proxy_address}:{self.proxy_port}"
        return {"http": url, "https": url}


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

    config: ConsumerConfig  # of the first stream; ``stream_configs`` has each stream's
    streams: tuple[str, ...] = ()
    arns: tuple[str, ...] = ()  # kinesis.streamArn: each stream's ARN, in the order of streams
    starting_position: StartingPosition = field(
        default_factory=lambda: StartingPosition("LATEST"))
    # qubole's per-shard startingPosition: these shards start there, the others as above.
    shard_starts: Mapping[str, StartingPosition] = field(default_factory=dict)
    fail_on_data_loss: bool = False
    max_fetch_records_per_shard: int = 100_000
    max_records_per_trigger: int | None = None
    max_fetch_time_per_shard_s: float = MAX_FETCH_TIME_PER_SHARD_S
    describe_shard_interval_s: float = 1.0
    # Where batch ranges are kept: HDFS, files under metadata_path (ConsumerConfig.range_path);
    # DYNAMODB, the range table. Not given: HDFS with a metadata_path, else DYNAMODB.
    metadata_committer_type: str = "DYNAMODB"
    metadata_path: str | None = None
    arrow_batches: bool = True
    max_fetch_rate_mb_s: float | None = None
    min_fetch_period_s: float = 0.0
    fetch_interval_s: float = 0.2  # kinesis.getRecords.fetchIntervalMs (awslabs: 200 ms)
    fetch_buffer_size_bytes: int | None = None
    # A KCL lease table to start a new query from, and its application (both or neither).
    start_lease_table: str | None = None
    start_application: str | None = None
    # Enhanced fan-out: kinesis.consumerType SubscribeToShard or consumerMode efo.
    consumer_type: str = "GetRecords"
    consumer_mode: str = "polling"
    consumer_name: str | None = None  # None with efo: named after the query (consumer_name_for)
    require_consumer_deregistration: bool | None = None
    unknown: tuple[str, ...] = ()

    @property
    def stream_names(self) -> tuple[str, ...]:
        return self.streams or (self.config.stream_name,)

    @property
    def stream_configs(self) -> dict[str, ConsumerConfig]:
        """The shard reader's config of each stream the query reads, in the order given."""
        arns = dict(zip(self.streams, self.arns, strict=False))  # no ARNs: names only
        return {name: self.config if name == self.config.stream_name
                else replace(self.config, stream_name=name, stream_arn=arns.get(name))
                for name in self.stream_names}

    @property
    def fan_out(self) -> bool:
        return self.consumer_type == "SubscribeToShard" or self.consumer_mode == "efo"

    @property
    def deregisters_consumer(self) -> bool:
        """The awslabs connector deregisters its consumer on stop(); Databricks' only when
        requireConsumerDeregistration says so. Which rule applies follows the names used."""
        if self.require_consumer_deregistration is not None:
            return self.require_consumer_deregistration
        return self.consumer_type == "SubscribeToShard"

    def consumer_name_for(self, query_id: str) -> str:
        """The fan-out consumer's name: the one given, else one per query (as Databricks
        names it after the streaming query), kept across restarts by the offsets."""
        return self.consumer_name or f"{QUERY_CONSUMER_PREFIX}{query_id}"

    @property
    def range_table_name(self) -> str:
        from ..aws.range_table import range_table_name

        return range_table_name(self.config.application_name)


_CONSUMER_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}")


def _check_fan_out(source_values: dict[str, Any], config_values: dict[str, Any]) -> None:
    """The fan-out options' rules: the awslabs connector requires a consumer name."""
    name = source_values.get("consumer_name")
    if source_values.get("consumer_type") == "SubscribeToShard" and not name:
        raise ConfigurationError(
            f"{AWSLABS_CONSUMER_NAME} is required with {CONSUMER_TYPE} SubscribeToShard: the "
            "enhanced fan-out consumer to register (1-128 of a-z A-Z 0-9 _ . -)")
    if name is not None and not _CONSUMER_NAME.fullmatch(name):
        raise ConfigurationError(f"{AWSLABS_CONSUMER_NAME}: {name!r} is not a valid Kinesis "
                                 "consumer name (1-128 of a-z A-Z 0-9 _ . -)")
    if source_values.get("consumer_type") == "SubscribeToShard" or \
            source_values.get("consumer_mode") == "efo":
        config_values["retrieval_mode"] = "FANOUT"
        if name:
            config_values["consumer_name"] = name


_REGION_IN_ENDPOINT = re.compile(r"kinesis(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")


def region_from_endpoint(endpoint: str | None) -> str | None:
    """``https://kinesis.eu-west-1.amazonaws.com`` -> ``eu-west-1`` (the awslabs default)."""
    match = _REGION_IN_ENDPOINT.search(endpoint or "")
    return match.group(1) if match else None


# -- the one pass ----------------------------------------------------------------------------
def _read(options: Mapping[str, Any], role: str) -> Read:
    """Parse every option ``role``'s front end knows; warn about the rest by name, saying
    so when an option belongs to the other role."""
    front = ROLES[role]
    own = front.by_key
    elsewhere = {key: f"is a {other} option ({option.name}): it does not apply to "
                      f"{ROLE_DOING[role]} with format aws-kinesis"
                 for other, other_front in ROLES.items() if other != role
                 for key, option in other_front.by_key.items() if key not in own}
    return front.read(options, source=f"format aws-kinesis ({ROLE_DOING[role]})",
                      elsewhere=elsewhere)


def _check_connection(config_values: dict[str, Any], *, role: str,
                      provider: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The rules between connection options, checked here so that errors name the options
    rather than ``ConsumerConfig``'s fields. Fills in the stream names of
    ``kinesis.streamArn`` and the region when no option names one; returns the ARNs given
    (one per stream, in order), or none."""
    arns: tuple[str, ...] = ()
    if "stream_arn" in config_values:
        arns = stream_arn_list(config_values.pop("stream_arn"))
        names = tuple(_arn(arn).stream_name for arn in arns)
        if "stream_name" in config_values and \
                stream_list(config_values["stream_name"]) != names:
            raise ConfigurationError(
                f"{STREAM_NAME} {config_values['stream_name']!r} and {STREAM_ARN} "
                f"{','.join(arns)!r} name different streams: give one of them")
        regions = sorted({_arn(arn).region for arn in arns})
        if len(regions) > 1:
            raise ConfigurationError(f"{STREAM_ARN}: streams of regions {', '.join(regions)}: "
                                     "one query reads the streams of one region")
        config_values["stream_name"] = ",".join(names)
        config_values["stream_arn"] = arns[0]
    if "stream_name" not in config_values:
        raise ConfigurationError(f"{STREAM_NAME} (or {STREAM_ARN}) is required: the Kinesis "
                                 "stream to use")
    if "region_name" not in config_values:
        region = (region_from_endpoint(config_values.get("kinesis_endpoint"))
                  or config_values.get("kinesis_region_name")
                  or (_arn(arns[0]).region if arns else None) or default_region())
        if not region and (role == "sink" or config_values.get("kinesis_endpoint")):
            # An endpoint that names no region (an emulator): any region signs. The sink has
            # always written to us-east-1 when nothing named a region; kept for its jobs.
            region = "us-east-1"
        if not region:
            raise ConfigurationError(
                f"{REGION} is required: no region in {ENDPOINT_URL}, {KINESIS_REGION} or "
                f"{STREAM_ARN}, nor in AWS_REGION, AWS_DEFAULT_REGION or the AWS profile")
        config_values["region_name"] = region
    apply_provider(provider or {}, config_values, _CREDENTIAL_NAMES)
    check_credentials(config_values, _CREDENTIAL_NAMES)
    return arns


def _arn(text: str) -> StreamArn:
    arn = parse_stream_arn(text)
    assert arn is not None  # stream_arn_list checked it
    return arn


def stream_arn_list(value: str) -> tuple[str, ...]:
    """``kinesis.streamArn`` / ``streamARN``: one stream ARN, or a comma-separated list."""
    arns = tuple(arn.strip() for arn in str(value).split(","))
    bad = [arn for arn in arns if parse_stream_arn(arn) is None]
    if bad:
        raise ConfigurationError(f"{STREAM_ARN}: {bad[0]!r} is not a Kinesis stream ARN "
                                 "(arn:aws:kinesis:<region>:<account>:stream/<name>)")
    return arns


_CREDENTIAL_NAMES = {option.field: option.name for option in CONNECTION_OPTIONS}
_STREAM_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}")


def stream_list(value: str) -> tuple[str, ...]:
    """``kinesis.streamName`` / ``streamName``: one stream, or a comma-separated list of
    them (Databricks'), each named once."""
    names = tuple(name.strip() for name in str(value).split(","))
    bad = [name for name in names if not _STREAM_NAME.fullmatch(name)]
    if bad:
        raise ConfigurationError(f"{STREAM_NAME}: {bad[0]!r} in {value!r} is not a Kinesis "
                                 "stream name (1-128 of a-z A-Z 0-9 _ . -; several are "
                                 "separated by commas)")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigurationError(f"{STREAM_NAME}: stream {twice[0]!r} is listed twice in "
                                 f"{value!r}")
    return names


def parse_options(options: Mapping[str, Any], **config_overrides: Any) -> KinesisOptions:
    """The options of a write -> ``KinesisOptions`` (config + sink options).

    ``config_overrides`` are ``ConsumerConfig`` fields set after the options. Raises
    ``ConfigurationError`` naming the option for a missing stream name or a bad value.
    """
    read = _read(options, "sink")
    config_values = read.of("config")
    arns = _check_connection(config_values, role="sink", provider=read.of("credentials"))
    if len(arns) > 1 or "," in str(config_values["stream_name"]):
        raise ConfigurationError(f"{STREAM_NAME}: a write goes to one stream, not to the list "
                                 f"{config_values['stream_name']!r}")
    config_values.setdefault("application_name", SQL_APPLICATION_NAME)
    config_values.update(config_overrides)
    return KinesisOptions(config=ConsumerConfig(**config_values),
                          sink=SinkOptions(**read.of("sink")), unknown=read.unknown)


def _split_shard_starts(source_values: dict[str, Any], streams: tuple[str, ...]) -> None:
    """qubole's per-shard ``startingPosition`` -> ``shard_starts`` and the others' start
    (LATEST). Its shard ids name one stream's shards, and a lease table's checkpoints would
    say the same thing a second time: both refused."""
    starts = source_values.get("starting_position")
    if not isinstance(starts, ShardStarts):
        return
    if len(streams) > 1:
        raise ConfigurationError(f"{STARTING_POSITION}: a per-shard JSON start names the "
                                 f"shards of one stream; this query reads {len(streams)} "
                                 f"({', '.join(streams)})")
    if source_values.get("start_lease_table") or source_values.get("start_application"):
        raise ConfigurationError(f"{STARTING_POSITION}: a per-shard JSON start and a lease "
                                 f"table to start from ({LEASE_TABLE_NAME} / "
                                 f"{APPLICATION_NAME}) both say where shards start: give one")
    source_values["starting_position"] = starts.default
    source_values["shard_starts"] = dict(starts.shards)


def parse_source_options(options: Mapping[str, Any]) -> SourceOptions:
    """The options of a streaming read -> ``SourceOptions``.

    Raises ``ConfigurationError`` naming the option for a missing stream (name or ARN), a
    region found nowhere, or a bad value. Unlike the awslabs connector, the endpoint is not
    required: AWS_ENDPOINT_URL_KINESIS, else the Kinesis region's public endpoint.
    """
    read = _read(options, "source")
    config_values = read.of("config")
    source_values = read.of("source")
    arns = _check_connection(config_values, role="source", provider=read.of("credentials"))
    seconds = source_values.pop("max_fetch_time_per_shard_sec", None)
    if seconds is not None:
        if "max_fetch_time_per_shard_s" in source_values:
            raise ConfigurationError(f"{MAX_FETCH_TIME_PER_SHARD_SEC} and "
                                     f"{MAX_FETCH_TIME_PER_SHARD_MS} both bound one shard's "
                                     "read: keep one")
        source_values["max_fetch_time_per_shard_s"] = float(seconds)
    streams = stream_list(config_values["stream_name"])
    config_values["stream_name"] = streams[0]
    # The default follows the connector whose names the options are written in (qubole: true).
    source_values.setdefault("fail_on_data_loss", default_fail_on_data_loss(options))
    # The executors' readers decide on a trimmed start.
    config_values["fail_on_data_loss"] = source_values["fail_on_data_loss"]
    if "kinesis_endpoint" not in config_values:
        # Read on the driver, as boto3 would (AWS_ENDPOINT_URL_KINESIS, else the region's
        # public endpoint), so that every executor reads the same endpoint.
        kinesis_region = (config_values.get("kinesis_region_name")
                          or (_arn(arns[0]).region if arns else config_values["region_name"]))
        config_values["kinesis_endpoint"] = (os.environ.get("AWS_ENDPOINT_URL_KINESIS")
                                             or endpoint_of_region(kinesis_region))
    qubole = read.of("qubole")
    if qubole.get("add_idle_time") and "min_fetch_period_s" not in source_values:
        source_values["min_fetch_period_s"] = qubole.get("idle_time_s", 1.0)
    warn_no_effect(read.given)
    _check_fan_out(source_values, config_values)
    _split_shard_starts(source_values, streams)
    table = source_values.get("start_lease_table") or source_values.get("start_application")
    if table:  # the KCL names the table after the application
        source_values["start_lease_table"] = table
        source_values.setdefault("start_application", table)
    _choose_range_store(source_values, config_values)
    # Read on the driver so that executors, which may lack the variable, use the same table.
    config_values.setdefault("dynamodb_endpoint",
                             os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or None)
    for name, value in _SOURCE_CONFIG_DEFAULTS.items():
        config_values.setdefault(name, value)
    source = SourceOptions(config=ConsumerConfig(**config_values), streams=streams,
                           arns=arns, unknown=read.unknown, **source_values)
    if source.metadata_committer_type == "DYNAMODB" and source.metadata_path is not None:
        log.info("aws-kinesis source: %s is not used with %s DYNAMODB: batch ranges are kept "
                 "in DynamoDB table %s", METADATA_PATH, METADATA_COMMITTER_TYPE,
                 source.range_table_name)
    return source


def _choose_range_store(source_values: dict[str, Any], config_values: dict[str, Any]) -> None:
    """``kinesis.metadataCommitterType`` and ``kinesis.metadataPath`` -> where the readers
    keep batch ranges (``ConsumerConfig.range_path``: None is the DynamoDB table).

    The awslabs connector's HDFS writes under the query's checkpointLocation by default. A
    Python source is not told that location (Spark's ``PythonScan.toMicroBatchStream``
    drops it, 4.0 to 4.3), so HDFS needs the path given, and without one the ranges stay in
    DynamoDB, as before; HDFS asked for without a path is refused rather than kept in
    DynamoDB behind the user's back (IAM written for HDFS allows no DynamoDB).
    """
    path = source_values.get("metadata_path")
    committer = source_values.setdefault("metadata_committer_type",
                                         "HDFS" if path else "DYNAMODB")
    if committer != "HDFS":
        return
    if not path:
        raise ConfigurationError(
            f"{METADATA_COMMITTER_TYPE} HDFS needs {METADATA_PATH}: Spark does not tell a "
            "Python source its checkpointLocation. Give the query's checkpointLocation (or "
            f"any local, s3:// or s3a:// path) as {METADATA_PATH}, or {METADATA_COMMITTER_TYPE} "
            "DYNAMODB to keep the batch ranges in DynamoDB")
    # A file system we can create on atomically (else refused), resolved on the driver: a
    # relative local path means the same directory to every executor (on a shared mount).
    config_values["range_path"] = str(root_of(path, METADATA_PATH))
    # Read on the driver, as the DynamoDB endpoint is, so that every executor uses it.
    config_values.setdefault("s3_endpoint", os.environ.get("AWS_ENDPOINT_URL_S3") or None)

