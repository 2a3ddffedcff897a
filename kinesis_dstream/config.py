"""The one configuration object of a consumer application.

``ConsumerConfig`` is built from keyword arguments (``KinesisUtils.createStream``), from a
KCL properties file (``kinesis_dstream.multilang.properties``) or from Spark conf keys
(``with_spark_conf``; ``spark_conf`` declares them). Field names are the KCL's property
names in snake case with the unit in the name; defaults are the KCL's unless a comment says
why we differ.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ConfigurationError
from .settings import BOOLEAN, Choice, Duration, Option, ValueType, Whole
from .worker_id import default_worker_id

log = logging.getLogger(__name__)

# Spark conf keys honoured by the retry policy (same names and defaults as kinesis-asl).
SPARK_RETRY_WAIT_TIME = "spark.streaming.kinesis.retry.waitTime"
SPARK_RETRY_MAX_ATTEMPTS = "spark.streaming.kinesis.retry.maxAttempts"
SPARK_RECEIVER_MAX_RATE = "spark.streaming.receiver.maxRate"
SPARK_BACKPRESSURE_ENABLED = "spark.streaming.backpressure.enabled"
# Ours: how many shards a Spark task reads (the Databricks connector's shardsPerTask).
SPARK_SHARDS_PER_TASK = "spark.streaming.kinesis.shardsPerTask"
# Ours, named after the SQL source's option: fail a batch whose start was trimmed by retention.
SPARK_FAIL_ON_DATA_LOSS = "spark.streaming.kinesis.failOnDataLoss"
# Ours, named after the awslabs connector's options: read by GetRecords or by fan-out.
SPARK_CONSUMER_TYPE = "spark.streaming.kinesis.consumerType"
SPARK_CONSUMER_NAME = "spark.streaming.kinesis.consumerName"
SPARK_CONSUMER_ARN = "spark.streaming.kinesis.consumerArn"

SPARK_BACKPRESSURE_INITIAL_RATE = "spark.streaming.backpressure.initialRate"
SPARK_PID_PROPORTIONAL = "spark.streaming.backpressure.pid.proportional"
SPARK_PID_INTEGRAL = "spark.streaming.backpressure.pid.integral"
SPARK_PID_DERIVED = "spark.streaming.backpressure.pid.derived"
SPARK_PID_MIN_RATE = "spark.streaming.backpressure.pid.minRate"

INITIAL_POSITIONS = ("LATEST", "TRIM_HORIZON", "AT_TIMESTAMP")
# How the worker reads: GetRecords, or enhanced fan-out (SubscribeToShard).
RETRIEVAL_MODES = ("POLLING", "FANOUT")
# The awslabs connector's names for them (its kinesis.consumerType values).
CONSUMER_TYPES = {"GetRecords": "POLLING", "SubscribeToShard": "FANOUT"}
# RegisterStreamConsumer's rule for a consumer name.
_CONSUMER_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}")
METRICS_LEVELS = ("DETAILED", "SUMMARY", "NONE")
BILLING_MODES = ("PAY_PER_REQUEST", "PROVISIONED")
# The KCL's LeaseManagementConfig defaults for a PROVISIONED lease table.
DEFAULT_TABLE_CAPACITY = 10


# The settings of the DynamoDB tables we create, by ConsumerConfig field: the KCL's
# LeaseManagementConfig names (MultiLangDaemonConfiguration's where it has the key).
KCL_TABLE_KEYS = {
    "billing_mode": "billingMode",
    "initial_lease_table_read_capacity": "initialLeaseTableReadCapacity",
    "initial_lease_table_write_capacity": "initialLeaseTableWriteCapacity",
    "lease_table_deletion_protection_enabled": "leaseTableDeletionProtectionEnabled",
    "lease_table_pitr_enabled": "leaseTablePitrEnabled",
}
# Ours: when a lagging shard whose position stands still is called stalled.
STALL_KEYS = {"stalled_shard_lag_ms": "stalledShardLagMillis",
              "stalled_shard_time_ms": "stalledShardTimeMillis"}


def table_options(name_of: Mapping[str, str], *, what: str) -> tuple[Option, ...]:
    """The table settings, declared once: each front end names them (``name_of``: field ->
    its key) and says which tables they apply to (``what``). They act only when we create
    a table: one that exists is used as it is."""
    kcl = " (the KCL's {})"
    declared: dict[str, tuple[ValueType, str, str]] = {
        "billing_mode": (Choice(*BILLING_MODES), f"Billing mode of {what} when we create "
                         "them" + kcl.format("billingMode") + ".", "PAY_PER_REQUEST"),
        "initial_lease_table_read_capacity": (
            Whole(0), f"Read capacity units of {what} when created PROVISIONED (no effect "
            "with PAY_PER_REQUEST).", str(DEFAULT_TABLE_CAPACITY)),
        "initial_lease_table_write_capacity": (
            Whole(0), f"Write capacity units of {what} when created PROVISIONED (no effect "
            "with PAY_PER_REQUEST).", str(DEFAULT_TABLE_CAPACITY)),
        "lease_table_deletion_protection_enabled": (
            BOOLEAN, f"Create {what} with deletion protection.", "false"),
        "lease_table_pitr_enabled": (
            BOOLEAN, f"Turn point-in-time recovery on for {what} when we create them.",
            "false"),
    }
    return tuple(Option(name, *declared[field_name], field=field_name)
                 for field_name, name in name_of.items() if field_name in declared)


def stall_options(name_of: Mapping[str, str]) -> tuple[Option, ...]:
    """The stalled-shard warning's settings, named by each front end (field -> key)."""
    declared: dict[str, tuple[ValueType, str, str]] = {
        "stalled_shard_lag_ms": (
            Duration(0), "A shard further behind the tip than this (MillisBehindLatest) "
            "whose position has not moved for the stalled-shard time is logged once as "
            "stalled, and counted.", "60s"),
        "stalled_shard_time_ms": (
            Duration(1), "How long a lagging shard's position must stand still for it to be "
            "called stalled.", "5min"),
    }
    return tuple(Option(name, *declared[field_name], field=field_name)
                 for field_name, name in name_of.items() if field_name in declared)


def check_credentials(values: Mapping[str, Any], names: Mapping[str, str] | None = None
                      ) -> None:
    """The one rule for pairing credentials, for ``ConsumerConfig`` fields in ``values``
    (None or absent: not given); messages use ``names`` (field -> the user's name for it).

    A key id and a secret key come together. A role may come alone: STS takes ExternalId as
    optional (only roles whose trust policy asks for one need it), and Databricks makes the
    session name optional too (``default_sts_session_name`` then names the session). A
    session name or an external id without a role is a mistake, and so is an empty one.
    PySpark's ``createStream`` passes its three STS arguments to a JVM helper that wants all
    or none; we accept every combination with a role, a superset of what ran there.
    """
    def name(field_name: str) -> str:
        return (names or {}).get(field_name, field_name)

    def given(field_name: str) -> bool:
        return values.get(field_name) is not None

    for first, second in (("aws_access_key_id", "aws_secret_key"),
                          ("aws_secret_key", "aws_access_key_id")):
        if given(first) and not given(second):
            raise ConfigurationError(f"{name(first)} is set but {name(second)} is null: "
                                     "give both or neither")
    if given("aws_session_token") and not given("aws_access_key_id"):
        raise ConfigurationError(f"{name('aws_session_token')} given without "
                                 f"{name('aws_access_key_id')} and {name('aws_secret_key')}: "
                                 "a session token signs only with the temporary key it came with")
    sts = ("sts_assume_role_arn", "sts_session_name", "sts_external_id")
    if not given("sts_assume_role_arn"):
        without_role = [name(f) for f in sts[1:] if given(f)]
        if without_role:
            raise ConfigurationError(f"{' and '.join(without_role)} given without "
                                     f"{name(sts[0])} (the role to assume)")
        return
    if not values["sts_assume_role_arn"]:
        raise ConfigurationError(f"{name(sts[0])} must not be empty")
    for optional in sts[1:]:
        if given(optional) and not values[optional]:
            raise ConfigurationError(f"{name(optional)} must not be empty: leave it out "
                                     "when the role needs none")
    session = values.get("sts_session_name")
    if session is not None and not _STS_SESSION_NAME.fullmatch(str(session)):
        raise ConfigurationError(
            f"{name(sts[1])}: {session!r} is not an STS RoleSessionName (2-64 of "
            "a-z A-Z 0-9 _ + = , . @ -)")


# STS AssumeRole's rule for RoleSessionName.
_STS_SESSION_NAME = re.compile(r"[A-Za-z0-9_+=,.@-]{2,64}")
# A role assumed without a session name: sessions are named this, then the epoch seconds, as
# botocore names one for a profile without role_session_name (botocore-session-<seconds>).
DEFAULT_STS_SESSION_PREFIX = "kinesis-dstream-"


def default_sts_session_name(now_s: float | None = None) -> str:
    """The RoleSessionName of a role given without one: ours, then the epoch seconds, so
    that CloudTrail tells our sessions apart from others of the role and from each other."""
    return f"{DEFAULT_STS_SESSION_PREFIX}{int(time.time() if now_s is None else now_s)}"


# A Kinesis stream's ARN (any partition: aws, aws-cn, aws-us-gov).
_STREAM_ARN = re.compile(r"arn:aws[a-z-]*:kinesis:(?P<region>[a-z0-9-]+):(?P<account>[0-9]{12}):"
                         r"stream/(?P<name>[a-zA-Z0-9_.-]{1,128})")


@dataclass(frozen=True)
class StreamArn:
    region: str
    account_id: str
    stream_name: str


def parse_stream_arn(text: str) -> StreamArn | None:
    """A Kinesis stream ARN's parts; None when ``text`` is not one."""
    match = _STREAM_ARN.fullmatch(text or "")
    return None if match is None else StreamArn(match["region"], match["account"], match["name"])


def default_region() -> str | None:
    """The region when no setting names one: ``AWS_REGION``, ``AWS_DEFAULT_REGION``, then
    the profile's (``AWS_PROFILE``, else ``default``), as the AWS SDKs look; None if none."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        return region
    try:
        import botocore.session  # only here: the shared layer needs botocore for nothing else

        return botocore.session.Session().get_config_variable("region") or None
    except Exception:  # noqa: BLE001 - a broken profile names no region: the caller says so
        log.debug("no region from the AWS profile", exc_info=True)
        return None


_CREDENTIAL_FIELDS = ("aws_access_key_id", "aws_secret_key", "aws_session_token",
                      "sts_assume_role_arn", "sts_session_name", "sts_external_id")
# The fields one service's own credentials replace (ConsumerConfig.credentials_for).
SERVICE_CREDENTIAL_FIELDS = (*_CREDENTIAL_FIELDS, "aws_profile", "sts_endpoint", "sts_region")

@dataclass(frozen=True)
class ConsumerConfig:
    """Everything a worker needs; validated when built, immutable after."""

    application_name: str
    stream_name: str
    # DynamoDB's, CloudWatch's and STS's region, and Kinesis' unless kinesis_region_name or
    # the stream's ARN names another.
    region_name: str = field(default_factory=lambda: default_region() or "us-east-1")
    # The stream by ARN (Databricks' streamARN, the KCL's streamArn): every Kinesis call then
    # names it by StreamARN, which a read of another account's stream through its resource
    # policy needs. stream_name must be the ARN's.
    stream_arn: str | None = None
    # The region that signs Kinesis calls (the awslabs kinesis.kinesisRegion); by default the
    # stream ARN's region, else region_name.
    kinesis_region_name: str | None = None
    # Endpoints: None means boto3's own resolution, which honours
    # AWS_ENDPOINT_URL_KINESIS / AWS_ENDPOINT_URL_DYNAMODB.
    kinesis_endpoint: str | None = None
    dynamodb_endpoint: str | None = None
    cloudwatch_endpoint: str | None = None
    # S3's, for batch ranges kept under an s3:// range_path (AWS_ENDPOINT_URL_S3 otherwise).
    s3_endpoint: str | None = None
    # Credentials: None means boto3's default chain.
    aws_access_key_id: str | None = None
    # repr=False: a config is logged and shown in tracebacks; secrets never are.
    aws_secret_key: str | None = field(default=None, repr=False)
    # The session token of temporary static credentials (the awslabs kinesis.sessionToken),
    # with the key id and secret key above; None: long-term keys.
    aws_session_token: str | None = field(default=None, repr=False)
    sts_assume_role_arn: str | None = None
    sts_session_name: str | None = None
    sts_external_id: str | None = field(default=None, repr=False)
    # None means boto3's resolution (AWS_ENDPOINT_URL_STS, then the regional endpoint).
    sts_endpoint: str | None = None
    # Assumed-role credentials are refreshed this long before they expire (botocore's
    # advisory window); the session asked for lasts sts_duration_s (STS minimum 900).
    sts_duration_s: int = 3600
    # None: refresh when a quarter of the session (at most 15 minutes) is left.
    sts_refresh_margin_s: int | None = None

    initial_position: str = "LATEST"
    initial_position_timestamp: float | None = None  # epoch seconds, AT_TIMESTAMP only
    worker_id: str = field(default_factory=default_worker_id)

    # Retrieval (KCL PollingConfig names).
    max_records: int = 10000
    idle_time_between_reads_ms: int = 1000
    call_process_records_even_for_empty_record_list: bool = False
    # POLLING or FANOUT (the KCL's FanOutConfig: a registered consumer, named consumer_name,
    # the application's name by default; consumer_arn names one registered already).
    retrieval_mode: str = "POLLING"
    consumer_name: str | None = None
    consumer_arn: str | None = None

    # Leases (KCL LeaseManagementConfig names and defaults).
    failover_time_ms: int = 10000
    shard_sync_interval_ms: int = 60000
    max_leases_for_worker: int = 2**31 - 1
    max_leases_to_steal_at_one_time: int = 1
    # The KCL takes leases every 2 x failover (20 s); we look as often as we renew
    # (failover / 3) so that a dead worker's shards move within failover + 2 renew periods
    # and a joining worker gets its share in seconds. Still one steal per pass: no storms.
    lease_taker_interval_ms: int | None = None
    parent_shard_poll_interval_ms: int = 1000

    # Retries (Spark's kinesis-asl names and defaults).
    retry_wait_time_ms: int = 100
    retry_max_attempts: int = 3
    # Bounded time for every AWS call: a dead endpoint fails fast instead of hanging.
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 10.0

    checkpoint_interval_ms: int = 10000
    shutdown_grace_ms: int = 20000
    # Spark tasks: how many shards one task reads, concurrently (``shardsPerTask``; an idle
    # shard counts a quarter). An idle wide stream then needs few tasks a batch; busy shards
    # still get tasks of their own.
    shards_per_task: int = 32
    metrics_level: str = "DETAILED"
    # CloudWatch publishing period (the KCL's metricsBufferTimeMillis).
    metrics_buffer_time_ms: int = 10000
    # A start position older than the stream's retention: False goes on from the oldest record
    # Kinesis still holds, as the KCL does (it reads on from whatever iterator Kinesis hands
    # it); True fails the read, naming the shard and the lost range. Logged once either way.
    fail_on_data_loss: bool = False
    # The tables we create (KCL LeaseManagementConfig names and defaults); a table that
    # exists is used as it is.
    billing_mode: str = "PAY_PER_REQUEST"
    initial_lease_table_read_capacity: int = DEFAULT_TABLE_CAPACITY
    initial_lease_table_write_capacity: int = DEFAULT_TABLE_CAPACITY
    lease_table_deletion_protection_enabled: bool = False
    lease_table_pitr_enabled: bool = False
    # A shard further behind than stalled_shard_lag_ms whose position has stood still for
    # stalled_shard_time_ms is logged once as stalled (worker.stall).
    stalled_shard_lag_ms: int = 60_000
    stalled_shard_time_ms: int = 300_000
    # The lease table's name when it is not the application's (the KCL's tableName).
    table_name: str | None = None
    # A named profile of the shared config/credentials files signs every call (the KCL
    # daemon's ProfileCredentialsProvider); None: boto3's default chain.
    aws_profile: str | None = None
    # The region whose STS endpoint assumes the role (the KCL's endpointRegion); None: the
    # client's region.
    sts_region: str | None = None
    # Other credentials for DynamoDB or CloudWatch than for Kinesis (the KCL daemon's
    # AWSCredentialsProviderDynamoDB / ...CloudWatch): each maps every credential field
    # (SERVICE_CREDENTIAL_FIELDS) to its value; None: the same as Kinesis'. Kept out of the
    # hash: a mapping is not hashable.
    dynamodb_credentials: Mapping[str, Any] | None = field(default=None, repr=False,
                                                           hash=False)
    cloudwatch_credentials: Mapping[str, Any] | None = field(default=None, repr=False,
                                                             hash=False)
    # Delete a finished shard's lease once its children have started (the KCL's
    # cleanupLeasesUponShardCompletion, true there; the properties file defaults to true).
    cleanup_leases_upon_shard_completion: bool = False
    # Where the SQL source keeps its batch ranges: None, the DynamoDB range table; else a
    # local path or an s3:// URI, one small file per range there (the awslabs
    # kinesis.metadataCommitterType HDFS with kinesis.metadataPath; ``aws.range_store``).
    range_path: str | None = None

    def __post_init__(self) -> None:
        for name in ("application_name", "stream_name", "region_name"):
            if not getattr(self, name):
                raise ConfigurationError(f"{name} is required")
        if self.stream_arn is not None:
            arn = parse_stream_arn(self.stream_arn)
            if arn is None:
                raise ConfigurationError(
                    f"stream_arn {self.stream_arn!r} is not a Kinesis stream ARN "
                    "(arn:aws:kinesis:<region>:<account>:stream/<name>)")
            if arn.stream_name != self.stream_name:
                raise ConfigurationError(
                    f"stream_name {self.stream_name!r} is not the stream of stream_arn "
                    f"{self.stream_arn!r}")
        if self.initial_position not in INITIAL_POSITIONS:
            raise ConfigurationError(
                f"initial_position must be one of {INITIAL_POSITIONS}, got {self.initial_position!r}"
            )
        if self.initial_position == "AT_TIMESTAMP" and self.initial_position_timestamp is None:
            raise ConfigurationError("initial_position AT_TIMESTAMP needs initial_position_timestamp")
        if self.retrieval_mode not in RETRIEVAL_MODES:
            raise ConfigurationError(
                f"retrieval_mode must be one of {RETRIEVAL_MODES}, got {self.retrieval_mode!r}")
        if self.retrieval_mode == "FANOUT" and self.consumer_arn is None and \
                not _CONSUMER_NAME.fullmatch(self.fan_out_consumer_name):
            raise ConfigurationError(
                f"consumer name {self.fan_out_consumer_name!r} is not a valid Kinesis consumer "
                "name (1-128 of a-z A-Z 0-9 _ . -); set consumer_name")
        if self.metrics_level not in METRICS_LEVELS:
            raise ConfigurationError(
                f"metrics_level must be one of {METRICS_LEVELS}, got {self.metrics_level!r}"
            )
        check_credentials({name: getattr(self, name) for name in _CREDENTIAL_FIELDS})
        for service in ("dynamodb", "cloudwatch"):
            own = getattr(self, f"{service}_credentials")
            if own is not None:
                unknown = set(own) - set(SERVICE_CREDENTIAL_FIELDS)
                if unknown:
                    raise ConfigurationError(f"{service}_credentials: unknown field(s) "
                                             f"{', '.join(sorted(unknown))}")
                check_credentials(own, {f: f"{service}_credentials.{f}" for f in own})
        if self.billing_mode not in BILLING_MODES:
            raise ConfigurationError(
                f"billing_mode must be one of {BILLING_MODES}, got {self.billing_mode!r}")
        if self.billing_mode == "PROVISIONED" and min(
                self.initial_lease_table_read_capacity,
                self.initial_lease_table_write_capacity) < 1:
            raise ConfigurationError(
                "billing_mode PROVISIONED needs read and write capacities of at least 1, got "
                f"{self.initial_lease_table_read_capacity} and "
                f"{self.initial_lease_table_write_capacity}")
        positive = ("max_records", "failover_time_ms", "shard_sync_interval_ms",
                    "retry_max_attempts", "retry_wait_time_ms", "sts_duration_s",
                    "metrics_buffer_time_ms", "max_leases_to_steal_at_one_time", "max_leases_for_worker",
                    "shards_per_task", "stalled_shard_time_ms")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be positive, got {getattr(self, name)}")
        # retry_wait_time_ms is positive, not just non-negative: 0 made every retry and every
        # transient-fault wait a hot loop against a failing service.
        non_negative = ("idle_time_between_reads_ms", "checkpoint_interval_ms",
                        "shutdown_grace_ms", "parent_shard_poll_interval_ms",
                        "stalled_shard_lag_ms", "initial_lease_table_read_capacity",
                        "initial_lease_table_write_capacity")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.sts_refresh_margin_s is not None and not (
                0 < self.sts_refresh_margin_s < self.sts_duration_s):
            raise ConfigurationError(
                f"sts_refresh_margin_s must be within 1..sts_duration_s-1 ({self.sts_duration_s}), "
                f"got {self.sts_refresh_margin_s}")
        if not 1 <= self.max_records <= 10000:
            raise ConfigurationError(f"max_records must be within 1..10000, got {self.max_records}")

    @property
    def kinesis_region(self) -> str:
        """The region that signs Kinesis calls: kinesis_region_name, else the stream ARN's,
        else region_name (which DynamoDB, CloudWatch and STS use)."""
        arn = parse_stream_arn(self.stream_arn) if self.stream_arn else None
        return self.kinesis_region_name or (arn.region if arn else self.region_name)

    @property
    def lease_table_name(self) -> str:
        """The KCL names the lease table after the application unless told (tableName)."""
        return self.table_name or self.application_name

    def credentials_for(self, service: str) -> "ConsumerConfig":
        """This config with ``service``'s own credentials, if it has any
        (``dynamodb_credentials``, ``cloudwatch_credentials``): every credential field is
        replaced, so a service given the default chain does not inherit Kinesis' role."""
        own = getattr(self, f"{service}_credentials", None)
        if own is None:
            return self
        return dataclasses.replace(self, **{name: own.get(name)
                                            for name in SERVICE_CREDENTIAL_FIELDS})

    @property
    def fan_out_consumer_name(self) -> str:
        """The fan-out consumer registered for this application (the KCL's default: its name)."""
        return self.consumer_name or self.application_name

    @property
    def renew_interval_ms(self) -> int:
        """The KCL renews every failover / 3 (minus an epsilon)."""
        return max(self.failover_time_ms // 3 - 25, 50)

    @property
    def taker_interval_ms(self) -> int:
        if self.lease_taker_interval_ms is not None:
            return self.lease_taker_interval_ms
        return self.renew_interval_ms

    def replace(self, **changes: Any) -> "ConsumerConfig":
        """A copy with some fields changed; unknown names raise ConfigurationError."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigurationError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    def with_spark_conf(self, conf: Mapping[str, str]) -> "ConsumerConfig":
        """Apply the kinesis-asl retry keys and ours from a Spark conf (a dict of its items);
        an unknown ``spark.streaming.kinesis.*`` key is warned about by name."""
        from .spark_conf import SPARK_CONF  # declared with this module's option helpers

        changes = SPARK_CONF.read(conf, source="Spark conf").of("config")
        return self.replace(**changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for handing the config to a worker process as JSON."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ConsumerConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigurationError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return cls(**data)
