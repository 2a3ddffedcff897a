"""The ``format("aws-kinesis")`` options, declared once: their names (the awslabs
connector's, with the Databricks and qubole names as aliases), types, defaults and docs, as
two front ends of the settings engine (``kinesis_dstream/settings.py``), ``SQL_SOURCE`` and
``SQL_SINK``, which share the connection options (endpoint, region, stream, credentials, STS).

What the values mean once read, and the rules between options, are ``options``' job; the
configuration page (``scripts/configuration_page.py``) is generated from these tables.
"""
from __future__ import annotations

from typing import Mapping

from ..config import stall_options, table_options
from ..retrieval import MAX_FETCH_TIME_PER_SHARD_S
from ..settings import (
    BOOLEAN,
    Bytes,
    Choice,
    Duration,
    FrontEnd,
    Number,
    Option,
    Refused,
    Text,
    ValueType,
    Whole,
)
from .credential_provider import PROVIDER_CLASS, PROVIDER_PARAM, accepted_classes
from .other_connectors import (
    CONSUMER_MODE,
    CONSUMER_NAME,
    NO_EFFECT_ELSEWHERE,
    QUBOLE_ADD_IDLE_TIME,
    QUBOLE_IDLE_TIME,
    QUBOLE_SINK_ALIASES,
    QUBOLE_USE_INSTANCE_PROFILE,
    REQUIRE_CONSUMER_DEREGISTRATION,
    SERVICE_CREDENTIAL,
    SERVICE_CREDENTIAL_REFUSAL,
)
from .starting_position import parse_starting_position

# Unknown and misplaced options are warned about when options are parsed: on that module's
# logger, where users filter them.
PARSER_LOGGER = "kinesis_dstream.sql.options"

# -- connection options: both roles ---------------------------------------------------------
ENDPOINT_URL = "kinesis.endpointUrl"
REGION = "kinesis.region"
STREAM_NAME = "kinesis.streamName"
STREAM_ARN = "kinesis.streamArn"  # Databricks' streamARN under an awslabs-style name
ACCESS_KEY_ID = "kinesis.awsAccessKeyId"
SECRET_KEY = "kinesis.awsSecretKey"
SESSION_TOKEN = "kinesis.sessionToken"
STS_ROLE_ARN = "kinesis.stsRoleArn"
STS_SESSION_NAME = "kinesis.stsSessionName"
STS_EXTERNAL_ID = "kinesis.stsExternalId"  # our extension: roles whose trust policy wants one
STS_ENDPOINT_URL = "kinesis.stsEndpointUrl"
# -- sink ------------------------------------------------------------------------------------
SINK_FLUSH_WAIT_TIME_MS = "kinesis.sink.flushWaitTimeMs"
SINK_RECORD_MAX_BUFFERED_TIME_MS = "kinesis.sink.recordMaxBufferedTimeMs"
SINK_MAX_CONNECTIONS = "kinesis.sink.maxConnections"
SINK_AGGREGATION_ENABLED = "kinesis.sink.aggregationEnabled"
SINK_RECORD_TTL = "kinesis.sink.recordTtl"
# The awslabs sink's proxy (KPL proxyHost and friends); older releases read them unprefixed.
SINK_PROXY_ADDRESS = "kinesis.sink.proxyAddress"
SINK_PROXY_PORT = "kinesis.sink.proxyPort"
SINK_PROXY_USERNAME = "kinesis.sink.proxyUsername"
SINK_PROXY_PASSWORD = "kinesis.sink.proxyPassword"
# -- source ----------------------------------------------------------------------------------
KINESIS_REGION = "kinesis.kinesisRegion"
CONSUMER_TYPE = "kinesis.consumerType"
AWSLABS_CONSUMER_NAME = "kinesis.consumerName"  # the fan-out consumer (SubscribeToShard)
FAIL_ON_DATA_LOSS = "kinesis.failOnDataLoss"
MAX_FETCH_RECORDS_PER_SHARD = "kinesis.maxFetchRecordsPerShard"
STARTING_POSITION = "kinesis.startingPosition"
DESCRIBE_SHARD_INTERVAL = "kinesis.describeShardInterval"
METADATA_COMMITTER_TYPE = "kinesis.metadataCommitterType"
METADATA_PATH = "kinesis.metadataPath"
DYNAMODB_TABLE_NAME = "kinesis.dynamodb.tableName"
DYNAMODB_ENDPOINT_URL = "kinesis.dynamodb.endpointUrl"  # our extension
# Ours: how the batch-range table is created when it does not exist (KCL setting names).
DYNAMODB_TABLE_OPTIONS = {
    "billing_mode": "kinesis.dynamodb.billingMode",
    "initial_lease_table_read_capacity": "kinesis.dynamodb.readCapacity",
    "initial_lease_table_write_capacity": "kinesis.dynamodb.writeCapacity",
    "lease_table_deletion_protection_enabled": "kinesis.dynamodb.deletionProtectionEnabled",
    "lease_table_pitr_enabled": "kinesis.dynamodb.pitrEnabled",
}
RECORDS_PER_FETCH = "kinesis.getRecords.numberOfRecordsPerFetch"
FETCH_INTERVAL_MS = "kinesis.getRecords.fetchIntervalMs"
CLIENT_NUM_RETRIES = "kinesis.clientNumRetries"
CLIENT_RETRY_INTERVALS_MS = "kinesis.clientRetryIntervalsMs"
MAX_RECORDS_PER_TRIGGER = "kinesis.maxRecordsPerTrigger"  # our extension: ReadMaxRows
MAX_FETCH_TIME_PER_SHARD_MS = "kinesis.maxFetchTimePerShardMs"  # our extension
MAX_FETCH_TIME_PER_SHARD_SEC = "kinesis.maxFetchTimePerShardSec"  # awslabs' (whole seconds)
# awslabs refuses less: Kinesis sometimes takes more than 5 s to answer.
MIN_FETCH_TIME_PER_SHARD_SEC = 10
SHARDS_PER_TASK = "kinesis.shardsPerTask"  # the Databricks connector's shardsPerTask
ARROW_BATCHES = "kinesis.arrowBatches"  # our extension: read() yields Arrow (true) or tuples
# Ours: a new query starts at the checkpoints of a KCL application's lease table.
LEASE_TABLE_NAME = "kinesis.leaseTableName"
APPLICATION_NAME = "kinesis.applicationName"
# The Databricks connector's pacing and buffer options (no awslabs name; given ours).
MAX_FETCH_RATE = "kinesis.maxFetchRate"
MIN_FETCH_PERIOD = "kinesis.minFetchPeriod"
FETCH_BUFFER_SIZE = "kinesis.fetchBufferSize"
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



def _accepted(key: str, value: str) -> str:
    return str(value)


# -- the tables ------------------------------------------------------------------------------
_TEXT = Text()
_ATTEMPTS = Whole(0, then=lambda retries: retries + 1)  # awslabs counts retries, we attempts
_NO_EFFECT = ValueType("text", _accepted)
_STARTING_POSITION = ValueType(
    "LATEST, TRIM_HORIZON, EARLIEST or AT_TIMESTAMP <ISO 8601 time> (any case), or "
    "{\"at_timestamp\": \"<time>\", \"format\": \"<Java pattern>\"}, or qubole's per-shard "
    "{\"<shard id>\": {\"iteratorType\": \"<type>\", \"iteratorPosition\": \"<position>\"}}",
    lambda key, value: parse_starting_position(value, key))
_BYTES = Bytes(1)


# The qubole kinesis-sql names of options that mean exactly the same there are aliases, so
# jobs written for that jar (and for format("kinesis")) run unchanged.
CONNECTION_OPTIONS: tuple[Option, ...] = (
    Option(ENDPOINT_URL, _TEXT, "The Kinesis endpoint. The source needs it or a region "
           "(then the region's public endpoint); the sink uses boto3's resolution without it.",
           aliases=("endpointUrl", "endpoint"), field="kinesis_endpoint"),
    Option(REGION, _TEXT, "AWS region of DynamoDB and STS, and of Kinesis unless "
           "kinesis.kinesisRegion or the stream's ARN names another; by default the one in "
           "the endpoint's host name, else kinesis.kinesisRegion, else the stream ARN's, else "
           "AWS_REGION, AWS_DEFAULT_REGION, then the AWS profile's.",
           aliases=("regionName", "region"), field="region_name"),
    Option(STREAM_NAME, _TEXT, "The Kinesis stream (required). A read takes a "
           "comma-separated list of streams too (as Databricks' streamName): one query reads "
           "them all. A write goes to one stream.", aliases=("streamName",),
           field="stream_name"),
    Option(STREAM_ARN, _TEXT, "The stream by ARN, instead of kinesis.streamName (Databricks' "
           "streamARN; a read takes a comma-separated list): every Kinesis call names it by "
           "StreamARN, as a read of another account's stream through its resource policy "
           "needs, in the ARN's region.", aliases=("streamARN",), field="stream_arn"),
    Option(ACCESS_KEY_ID, _TEXT, "Static credentials: the key id, with kinesis.awsSecretKey; "
           "without both, boto3's default chain.", aliases=("awsAccessKeyId", "awsAccessKey"),
           field="aws_access_key_id"),
    Option(SECRET_KEY, _TEXT, "Static credentials: the secret key, with "
           "kinesis.awsAccessKeyId.", aliases=("awsSecretKey",), field="aws_secret_key"),
    Option(SESSION_TOKEN, _TEXT, "Temporary static credentials: their session token, "
           "with kinesis.awsAccessKeyId and kinesis.awsSecretKey (sent as "
           "X-Amz-Security-Token; nobody refreshes it: the job fails when it expires).",
           aliases=("sessionToken",), field="aws_session_token"),
    Option(PROVIDER_CLASS, _TEXT, "The awslabs connector's credential provider class, where "
           "it means credentials this connector has (with kinesis.credentialProviderParam "
           "as said); any other class is refused, since no JVM class is loaded here. "
           "Accepted: " + accepted_classes() + ".", target="credentials",
           field="provider_class"),
    Option(PROVIDER_PARAM, _TEXT, "The parameter of kinesis.credentialProviderClass: that "
           "class's fields, comma-separated.", target="credentials", field="provider_param"),
    Option(STS_ROLE_ARN, _TEXT, "A role to assume, assumed once per process and again "
           "before its credentials expire; kinesis.stsSessionName and kinesis.stsExternalId "
           "are optional.", aliases=("awsSTSRoleARN", "roleArn"), field="sts_assume_role_arn"),
    Option(STS_SESSION_NAME, _TEXT, "The RoleSessionName STS records for the assumed role "
           "(optional, as Databricks' roleSessionName).", "kinesis-dstream-<epoch seconds>",
           aliases=("awsSTSSessionName", "roleSessionName"), field="sts_session_name"),
    Option(STS_EXTERNAL_ID, _TEXT, "Ours: the ExternalId for roles whose trust policy "
           "asks for one (only with kinesis.stsRoleArn).", aliases=("roleExternalId",),
           field="sts_external_id"),
    Option(STS_ENDPOINT_URL, _TEXT, "The STS endpoint; by default boto3's resolution.",
           aliases=("stsEndpoint",), field="sts_endpoint"),
    Option(SERVICE_CREDENTIAL, Refused(SERVICE_CREDENTIAL_REFUSAL), "Databricks' name, "
           "refused at load() naming it: " + SERVICE_CREDENTIAL_REFUSAL + "."),
)

SINK_OPTIONS: tuple[Option, ...] = (
    Option(SINK_FLUSH_WAIT_TIME_MS, Duration(1), "First wait before failed entries are sent "
           "again (doubling, jittered).", "100", target="sink", field="flush_wait_time_ms",
           aliases=QUBOLE_SINK_ALIASES["flush_wait_time_ms"]),
    Option(SINK_RECORD_MAX_BUFFERED_TIME_MS, Duration(0), "Longest a record waits in the "
           "buffer before it is sent.", "1000", target="sink",
           field="record_max_buffered_time_ms",
           aliases=QUBOLE_SINK_ALIASES["record_max_buffered_time_ms"]),
    Option(SINK_MAX_CONNECTIONS, Whole(1), "Full PutRecords requests sent concurrently.", "1",
           target="sink", field="max_connections",
           aliases=QUBOLE_SINK_ALIASES["max_connections"]),
    Option(SINK_AGGREGATION_ENABLED, BOOLEAN, "Write KPL aggregates (grouped by the shard "
           "each user record belongs on) instead of one Kinesis record per row.", "true",
           target="sink", field="aggregation_enabled",
           aliases=QUBOLE_SINK_ALIASES["aggregation_enabled"]),
    Option(SINK_RECORD_TTL, Duration(1), "Most time a write spends getting its records "
           "into Kinesis, retries of failed entries included; past it the write fails, "
           "naming the entries not written (the KPL drops them and awslabs fails the task).",
           "30000", target="sink", field="record_ttl_ms"),
    Option(SINK_PROXY_ADDRESS, _TEXT, "An HTTP proxy host for the sink's Kinesis calls "
           "(HTTPS through CONNECT), with kinesis.sink.proxyPort.",
           aliases=("proxyAddress",), target="sink", field="proxy_address"),
    Option(SINK_PROXY_PORT, Whole(1, 65535), "The proxy's port.", "443",
           aliases=("proxyPort",), target="sink", field="proxy_port"),
    Option(SINK_PROXY_USERNAME, _TEXT, "The proxy's user (basic authentication), with "
           "kinesis.sink.proxyPassword.", aliases=("proxyUsername",), target="sink",
           field="proxy_username"),
    Option(SINK_PROXY_PASSWORD, _TEXT, "The proxy user's password.",
           aliases=("proxyPassword",), target="sink", field="proxy_password"),
    Option(QUBOLE_USE_INSTANCE_PROFILE, _NO_EFFECT, "qubole's name, accepted: without key "
           "options boto3's default chain is used, the instance profile included.",
           target="sink"),
)

SOURCE_OPTIONS: tuple[Option, ...] = (
    # kinesis.region wins over it: resolved in parse_source_options.
    Option(KINESIS_REGION, _TEXT, "The region that signs Kinesis calls (awslabs name); "
           "kinesis.region stays that of DynamoDB and STS. Alone, it is both.",
           field="kinesis_region_name"),
    Option(DYNAMODB_TABLE_NAME, _TEXT, "Names the DynamoDB table of batch ranges "
           "(<name>-kinesis-dstream-ranges).", DEFAULT_TABLE_PREFIX, field="application_name"),
    Option(DYNAMODB_ENDPOINT_URL, _TEXT, "Ours: the DynamoDB endpoint; by default "
           "AWS_ENDPOINT_URL_DYNAMODB as the driver sees it, else boto3's resolution.",
           field="dynamodb_endpoint"),
    *table_options(DYNAMODB_TABLE_OPTIONS, what="the batch-range table"),
    *stall_options({"stalled_shard_lag_ms": "kinesis.stalledShardLag",
                    "stalled_shard_time_ms": "kinesis.stalledShardTime"}),
    Option(RECORDS_PER_FETCH, Whole(1, MAX_RECORDS_PER_GET), "Records asked for per "
           "GetRecords call.", str(MAX_RECORDS_PER_GET),
           aliases=("maxRecordsPerFetch", "kinesis.executor.maxRecordPerRead"),
           field="max_records"),
    Option(FETCH_INTERVAL_MS, Duration(0, unit_ms=1000), "Least time between the starts of "
           "two GetRecords calls of one shard's reading (Kinesis serves 5 a second per shard "
           "to every reader together); with kinesis.minFetchPeriod too, the longer one.",
           "200", target="source", field="fetch_interval_s"),
    Option(CLIENT_NUM_RETRIES, _ATTEMPTS, "Retries of a failed AWS call.", "5",
           aliases=("kinesis.client.numRetries",), field="retry_max_attempts"),
    Option(CLIENT_RETRY_INTERVALS_MS, Duration(1), "First wait between retries of a failed "
           "AWS call (doubling).", "1000", aliases=("kinesis.client.retryIntervalMs",),
           field="retry_wait_time_ms"),
    Option(SHARDS_PER_TASK, Whole(1), "How many shards one Spark task reads, concurrently "
           "(the Databricks connector's name); a shard that read nothing in its last "
           "reading counts as a quarter.", "32", aliases=("shardsPerTask",),
           field="shards_per_task"),
    Option(STARTING_POSITION, _STARTING_POSITION, "Where a new query starts; an "
           "unreadable value is refused, never taken as LATEST.", "LATEST",
           aliases=("startingPosition", "initialPosition"), target="source",
           field="starting_position"),
    Option(APPLICATION_NAME, _TEXT, "Ours: a KCL application (DStream, worker, multilang or "
           "Java KCL) whose lease table a new query starts from: each shard at its checkpoint "
           "(sub-sequence numbers included), shards without one as kinesis.startingPosition "
           "says. Read once, never written; a restarted query follows its checkpointLocation.",
           aliases=("applicationName",), target="source", field="start_application"),
    Option(LEASE_TABLE_NAME, _TEXT, "Ours: that lease table, when it is not named after "
           "the application (either option starts the query from the table).",
           aliases=("leaseTableName", "kinesis.leaseTable", "leaseTable"), target="source",
           field="start_lease_table"),
    Option(FAIL_ON_DATA_LOSS, BOOLEAN, "A start trimmed by the stream's retention fails the "
           "query (true) or goes on from the oldest record (false). The default follows the "
           "names the options are written in: true (qubole's) when only qubole's are used.",
           "false (true with qubole's names)",
           aliases=("failOnDataLoss",), target="source", field="fail_on_data_loss"),
    Option(MAX_FETCH_RECORDS_PER_SHARD, Whole(1), "Most records one shard gives one "
           "micro-batch (the first one a query plans: at most 1000, for rows within seconds "
           "on a backlog).", "100000", aliases=("kinesis.executor.maxFetchRecordsPerShard",),
           target="source", field="max_fetch_records_per_shard"),
    Option(MAX_RECORDS_PER_TRIGGER, Whole(1), "Ours: most records of one micro-batch, all "
           "shards together (Spark's ReadMaxRows).", "unlimited", target="source",
           field="max_records_per_trigger"),
    Option(MAX_FETCH_TIME_PER_SHARD_MS, Duration(0, unit_ms=1000), "Ours: longest one shard's "
           "read of a micro-batch may take.", f"{int(MAX_FETCH_TIME_PER_SHARD_S * 1000)}",
           aliases=("maxFetchDuration", "kinesis.executor.maxFetchTimeInMs"), target="source",
           field="max_fetch_time_per_shard_s"),
    Option(MAX_FETCH_TIME_PER_SHARD_SEC, Whole(MIN_FETCH_TIME_PER_SHARD_SEC), "Longest one "
           "shard's read of a micro-batch may take, in whole seconds (at least 10, as the "
           "awslabs connector wants). Unset, awslabs has no time cap; here "
           f"{MAX_FETCH_TIME_PER_SHARD_MS} (5 s) applies: a longer read only delays the "
           "batch, since a caught-up shard stops at its tip.", "5 s",
           target="source", field="max_fetch_time_per_shard_sec"),
    Option(DESCRIBE_SHARD_INTERVAL, Duration(0, unit_ms=1000), "Shortest time between two "
           "looks at the stream's shards.", "1s",
           aliases=("shardFetchInterval", "kinesis.client.describeShardInterval"),
           target="source", field="describe_shard_interval_s"),
    Option(MAX_FETCH_RATE, Number(0.001), "Most MB (MiB) a second one shard's reads bring "
           "(Databricks' name; the GetRecords calls of a reading are spaced to it).",
           "unlimited", aliases=("maxFetchRate",), target="source",
           field="max_fetch_rate_mb_s"),
    Option(MIN_FETCH_PERIOD, Duration(0, unit_ms=1000), "Least time between two GetRecords "
           "calls of one shard's reading (Databricks' name).", "0",
           aliases=("minFetchPeriod",), target="source", field="min_fetch_period_s"),
    Option(FETCH_BUFFER_SIZE, _BYTES, "Bytes one micro-batch reads, all shards together, "
           "split evenly over the shards it reads; a stopping condition, not a strict bound "
           "(Databricks' name).", "unlimited", aliases=("fetchBufferSize",), target="source",
           field="fetch_buffer_size_bytes"),
    Option(CONSUMER_MODE, Choice("polling", "efo"), "Databricks' name: efo reads by "
           "enhanced fan-out (SubscribeToShard) as a registered consumer, polling by "
           "GetRecords.", "polling", target="source", field="consumer_mode"),
    Option(REQUIRE_CONSUMER_DEREGISTRATION, BOOLEAN, "Databricks' name: deregister the "
           "fan-out consumer when the query stops. By default only with "
           f"{CONSUMER_TYPE} SubscribeToShard (the awslabs connector deregisters); a "
           f"{CONSUMER_MODE} efo consumer is kept.", "false (true with "
           f"{CONSUMER_TYPE})", target="source", field="require_consumer_deregistration"),
    Option(QUBOLE_ADD_IDLE_TIME, BOOLEAN, "qubole's name: wait "
           f"{QUBOLE_IDLE_TIME} between GetRecords calls (as {MIN_FETCH_PERIOD}).", "false",
           target="qubole", field="add_idle_time"),
    Option(QUBOLE_IDLE_TIME, Duration(0, unit_ms=1000), f"qubole's name: with "
           f"{QUBOLE_ADD_IDLE_TIME} true, the least time between GetRecords calls.", "1000",
           target="qubole", field="idle_time_s"),
    Option(METADATA_COMMITTER_TYPE, Choice("HDFS", "DYNAMODB"), "Where batch ranges are "
           f"kept: HDFS, as small files under {METADATA_PATH} (a local path, s3:// or "
           "s3a://; the query then makes no DynamoDB call), or DYNAMODB, in the DynamoDB "
           f"table {DYNAMODB_TABLE_NAME} names. HDFS needs {METADATA_PATH}: "
           "Spark does not tell a Python source its checkpointLocation.",
           f"HDFS with {METADATA_PATH}, else DYNAMODB", target="source",
           field="metadata_committer_type"),
    Option(ARROW_BATCHES, BOOLEAN, "Ours: read() yields Arrow batches (true) or tuples.",
           "true", target="source", field="arrow_batches"),
    Option(CONSUMER_TYPE, Choice("GetRecords", "SubscribeToShard"), "GetRecords polls; "
           "SubscribeToShard reads by enhanced fan-out as the registered consumer "
           f"{AWSLABS_CONSUMER_NAME}, registered when the query starts and deregistered "
           "when it stops.", "GetRecords", target="source", field="consumer_type"),
    Option(AWSLABS_CONSUMER_NAME, _TEXT, "The fan-out consumer (required with "
           f"{CONSUMER_TYPE} SubscribeToShard). With {CONSUMER_MODE} efo (Databricks' "
           f"{CONSUMER_NAME}) it defaults to kinesis-dstream-sql-<the query id the "
           "checkpoint's offsets keep>.", aliases=(CONSUMER_NAME,), target="source",
           field="consumer_name"),
    Option(METADATA_PATH, _TEXT, "Where batch ranges are kept with "
           f"{METADATA_COMMITTER_TYPE} HDFS (under <path>/kinesis-ranges/): a local path, "
           "file://, s3:// or s3a:// (S3 by conditional PUT; AWS_ENDPOINT_URL_S3 is read "
           "on the driver). The query's checkpointLocation is a good choice.",
           target="source", field="metadata_path"),
    *(Option(name, _NO_EFFECT, "Accepted for the awslabs connector's jobs; no effect here.",
             target="source") for name in ACCEPTED_WITHOUT_EFFECT),
    *(Option(name, _NO_EFFECT, f"The {who} connector's; no effect here (warned about): it "
             f"would have {what}.", target="source")
      for name, (who, what) in NO_EFFECT_ELSEWHERE.items()),
)

_SQL_DOC = ("Options of {what} with format(\"aws-kinesis\") (also format(\"kinesis\")): "
            "the awslabs connector's names; the Databricks connector's and the qubole "
            "kinesis-sql names are aliases where they mean the same (see \"Databricks and "
            "qubole option names\" in docs/migration.md).")
SQL_SOURCE = FrontEnd(
    name="SQL source (readStream)", doc=_SQL_DOC.format(what="spark.readStream"),
    options=CONNECTION_OPTIONS + SOURCE_OPTIONS, case_sensitive=False, host_keys=SPARK_KEYS,
    logger=PARSER_LOGGER)
SQL_SINK = FrontEnd(
    name="SQL sink (write, writeStream)", doc=_SQL_DOC.format(what="df.write and writeStream"),
    options=CONNECTION_OPTIONS + SINK_OPTIONS, case_sensitive=False, host_keys=SPARK_KEYS,
    logger=PARSER_LOGGER)
# Every role's front end, by the name the warnings use.
ROLES: Mapping[str, FrontEnd] = {"sink": SQL_SINK, "source": SQL_SOURCE}
ROLE_DOING = {"sink": "writing", "source": "reading"}
