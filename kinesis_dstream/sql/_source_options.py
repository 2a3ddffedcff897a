"""The options of ``spark.readStream.format("aws-kinesis")``: awslabs names, our config.

Keys are the awslabs spark-sql-kinesis-connector's, matched case-insensitively, so a job
written for that jar runs unchanged. They become one ``SourceOptions`` (what only the SQL
source needs) holding one ``ConsumerConfig`` (what the shard reader needs). Unknown keys are
warned about by name rather than refused, because Spark passes every ``.option()`` the user
set and jobs often carry options of other connectors; invalid values raise
``ConfigurationError`` naming the key, on the driver, before the query starts.
"""
from __future__ import annotations

import datetime as _dt
import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import ConsumerConfig, parse_duration_ms
from ..errors import ConfigurationError

log = logging.getLogger(__name__)

ENDPOINT_URL = "kinesis.endpointurl"
REGION = "kinesis.region"
KINESIS_REGION = "kinesis.kinesisregion"
STREAM_NAME = "kinesis.streamname"
CONSUMER_TYPE = "kinesis.consumertype"
FAIL_ON_DATA_LOSS = "kinesis.failondataloss"
MAX_FETCH_RECORDS_PER_SHARD = "kinesis.maxfetchrecordspershard"
STARTING_POSITION = "kinesis.startingposition"
DESCRIBE_SHARD_INTERVAL = "kinesis.describeshardinterval"
METADATA_COMMITTER_TYPE = "kinesis.metadatacommittertype"
METADATA_PATH = "kinesis.metadatapath"
DYNAMODB_TABLE_NAME = "kinesis.dynamodb.tablename"
DYNAMODB_ENDPOINT_URL = "kinesis.dynamodb.endpointurl"  # our extension
ACCESS_KEY_ID = "kinesis.awsaccesskeyid"
SECRET_KEY = "kinesis.awssecretkey"
STS_ROLE_ARN = "kinesis.stsrolearn"
STS_SESSION_NAME = "kinesis.stssessionname"
RECORDS_PER_FETCH = "kinesis.getrecords.numberofrecordsperfetch"
FETCH_INTERVAL_MS = "kinesis.getrecords.fetchintervalms"
CLIENT_NUM_RETRIES = "kinesis.clientnumretries"
CLIENT_RETRY_INTERVALS_MS = "kinesis.clientretryintervalsms"
MAX_RECORDS_PER_TRIGGER = "kinesis.maxrecordspertrigger"  # our extension: ReadMaxRows
MAX_FETCH_TIME_PER_SHARD_MS = "kinesis.maxfetchtimepershardms"  # our extension
ARROW_BATCHES = "kinesis.arrowbatches"  # our extension: read() yields Arrow (true) or tuples

# awslabs options we accept and have nothing to do for (said in the README).
ACCEPTED_WITHOUT_EFFECT = ("kinesis.minbatchestoretain", "kinesis.checknewrecordthreads",
                           "kinesis.metadatanumretries", "kinesis.metadataretryintervalsms",
                           "kinesis.metadatamaxretryintervalms", "kinesis.clientmaxretryintervalms",
                           "kinesis.stsendpointurl")
KNOWN = {ENDPOINT_URL, REGION, KINESIS_REGION, STREAM_NAME, CONSUMER_TYPE, FAIL_ON_DATA_LOSS,
         MAX_FETCH_RECORDS_PER_SHARD, STARTING_POSITION, DESCRIBE_SHARD_INTERVAL,
         METADATA_COMMITTER_TYPE, METADATA_PATH, DYNAMODB_TABLE_NAME, DYNAMODB_ENDPOINT_URL,
         ACCESS_KEY_ID, SECRET_KEY, STS_ROLE_ARN, STS_SESSION_NAME, RECORDS_PER_FETCH,
         FETCH_INTERVAL_MS, CLIENT_NUM_RETRIES, CLIENT_RETRY_INTERVALS_MS,
         MAX_RECORDS_PER_TRIGGER, MAX_FETCH_TIME_PER_SHARD_MS, ARROW_BATCHES, *ACCEPTED_WITHOUT_EFFECT,
         "path"}

DEFAULT_TABLE_PREFIX = "spark-kinesis-source"


@dataclass(frozen=True)
class StartingPosition:
    """LATEST, TRIM_HORIZON (EARLIEST), or AT_TIMESTAMP with epoch seconds."""

    kind: str
    timestamp: float | None = None


@dataclass(frozen=True)
class SourceOptions:
    config: ConsumerConfig
    starting_position: StartingPosition
    fail_on_data_loss: bool = False
    max_fetch_records_per_shard: int = 100_000
    max_records_per_trigger: int | None = None
    max_fetch_time_per_shard_s: float = 5.0
    describe_shard_interval_s: float = 1.0
    metadata_committer_type: str = "HDFS"
    arrow_batches: bool = True

    @property
    def range_table_name(self) -> str:
        from ..aws.range_table import range_table_name

        return range_table_name(self.config.application_name)


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    if key not in options:
        return default
    text = str(options[key]).strip().lower()
    if text not in ("true", "false"):
        raise ConfigurationError(f"option {key}: expected true or false, got {options[key]!r}")
    return text == "true"


def _int(options: Mapping[str, str], key: str, default: int | None, minimum: int) -> int | None:
    if key not in options:
        return default
    try:
        value = int(str(options[key]).strip())
    except ValueError:
        raise ConfigurationError(f"option {key}: not a whole number: {options[key]!r}") from None
    if value < minimum:
        raise ConfigurationError(f"option {key}: must be >= {minimum}, got {value}")
    return value


def _duration_ms(options: Mapping[str, str], key: str, default: int) -> int:
    if key not in options:
        return default
    value = parse_duration_ms(options[key], f"option {key}")
    if value < 0:
        raise ConfigurationError(f"option {key}: must not be negative, got {options[key]!r}")
    return value


def parse_starting_position(text: str) -> StartingPosition:
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
                f"option {STARTING_POSITION}: cannot read {raw!r} as an ISO 8601 time") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=_dt.timezone.utc)
        return StartingPosition("AT_TIMESTAMP", moment.timestamp())
    raise ConfigurationError(
        f"option {STARTING_POSITION}: expected LATEST, TRIM_HORIZON, EARLIEST or "
        f"'AT_TIMESTAMP <ISO time>', got {text!r}")


def parse_source_options(raw: Mapping[str, Any]) -> SourceOptions:
    """Validate the user's options; raises ConfigurationError naming the first bad one."""
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = sorted(set(options) - KNOWN)
    if unknown:
        log.warning("aws-kinesis source: unknown option(s) ignored: %s", ", ".join(unknown))
    for key in (STREAM_NAME, ENDPOINT_URL):
        if not options.get(key, "").strip():
            raise ConfigurationError(f"option {key} is required")
    consumer_type = options.get(CONSUMER_TYPE, "GetRecords").strip()
    if consumer_type.lower() == "subscribetoshard":
        raise ConfigurationError(
            f"option {CONSUMER_TYPE}: SubscribeToShard (enhanced fan-out) is not supported yet by "
            "this source; use GetRecords (the default)")
    if consumer_type.lower() != "getrecords":
        raise ConfigurationError(
            f"option {CONSUMER_TYPE}: expected GetRecords or SubscribeToShard, got {consumer_type!r}")
    committer = options.get(METADATA_COMMITTER_TYPE, "HDFS").strip().upper()
    if committer not in ("HDFS", "DYNAMODB"):
        raise ConfigurationError(
            f"option {METADATA_COMMITTER_TYPE}: expected HDFS or DYNAMODB, got {committer!r}")
    if (ACCESS_KEY_ID in options) != (SECRET_KEY in options):
        raise ConfigurationError(f"options {ACCESS_KEY_ID} and {SECRET_KEY} go together")
    if (STS_ROLE_ARN in options) != (STS_SESSION_NAME in options):
        raise ConfigurationError(f"options {STS_ROLE_ARN} and {STS_SESSION_NAME} go together")
    endpoint = options[ENDPOINT_URL].strip()
    region = (options.get(REGION) or options.get(KINESIS_REGION) or _region_of(endpoint)).strip()
    stream = options[STREAM_NAME].strip()
    table = options.get(DYNAMODB_TABLE_NAME, "").strip() or DEFAULT_TABLE_PREFIX
    retries = _int(options, CLIENT_NUM_RETRIES, 5, 0)
    try:
        config = ConsumerConfig(
            application_name=table, stream_name=stream, region_name=region,
            kinesis_endpoint=endpoint,
            dynamodb_endpoint=options.get(DYNAMODB_ENDPOINT_URL) or
            os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or None,
            aws_access_key_id=options.get(ACCESS_KEY_ID), aws_secret_key=options.get(SECRET_KEY),
            # The awslabs connector has no external id; ConsumerConfig wants the three together.
            sts_assume_role_arn=options.get(STS_ROLE_ARN),
            sts_session_name=options.get(STS_SESSION_NAME),
            sts_external_id="" if STS_ROLE_ARN in options else None,
            max_records=_int(options, RECORDS_PER_FETCH, 10_000, 1),
            idle_time_between_reads_ms=_duration_ms(options, FETCH_INTERVAL_MS, 200),
            retry_max_attempts=(retries or 0) + 1,
            retry_wait_time_ms=_duration_ms(options, CLIENT_RETRY_INTERVALS_MS, 1000),
            metrics_level="NONE", initial_position="TRIM_HORIZON",
            worker_id="spark-sql-source")
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} (check {RECORDS_PER_FETCH}, {REGION}, "
                                 f"{DYNAMODB_TABLE_NAME})") from None
    source = SourceOptions(
        config=config,
        starting_position=parse_starting_position(options.get(STARTING_POSITION, "LATEST")),
        fail_on_data_loss=_bool(options, FAIL_ON_DATA_LOSS, False),
        max_fetch_records_per_shard=_int(options, MAX_FETCH_RECORDS_PER_SHARD, 100_000, 1),
        max_records_per_trigger=_int(options, MAX_RECORDS_PER_TRIGGER, None, 1),
        max_fetch_time_per_shard_s=_duration_ms(options, MAX_FETCH_TIME_PER_SHARD_MS, 5000) / 1000,
        describe_shard_interval_s=_duration_ms(options, DESCRIBE_SHARD_INTERVAL, 1000) / 1000,
        metadata_committer_type=committer,
        arrow_batches=_bool(options, ARROW_BATCHES, True))
    if committer == "HDFS":
        log.info("aws-kinesis source: %s HDFS: batch ranges are kept in DynamoDB table %s all "
                 "the same (our only range store); the query's offsets stay in its "
                 "checkpointLocation", METADATA_COMMITTER_TYPE, source.range_table_name)
    if METADATA_PATH in options:
        log.info("aws-kinesis source: %s is not used: ranges are keyed by the query id kept in "
                 "the checkpoint's offset log", METADATA_PATH)
    return source


def _region_of(endpoint: str) -> str:
    """The region in an AWS endpoint (kinesis.<region>.amazonaws.com), else the environment's."""
    host = endpoint.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    parts = host.split(".")
    if len(parts) >= 4 and parts[0] == "kinesis" and parts[2] == "amazonaws":
        return parts[1]
    return (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            or "us-east-1")

