"""The KCL MultiLangDaemon's properties keys, declared once for the settings engine.

The Java daemon's ``MultiLangDaemonConfiguration`` bean properties (KCL 2.x and 3.x), with
the value readers only these keys need. ``properties.py`` reads files with this table; the
configuration page is generated from it.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Mapping
from urllib.parse import urlsplit

from ..config import (
    BILLING_MODES,
    INITIAL_POSITIONS,
    KCL_TABLE_KEYS,
    METRICS_LEVELS,
    STALL_KEYS,
    parse_stream_arn,
    stall_options,
    table_options,
)
from ..errors import ConfigurationError
from ..position_text import iso_time
from ..settings import (
    BOOLEAN,
    Choice,
    Duration,
    FrontEnd,
    Number,
    Option,
    Text,
    ValueType,
    Whole,
)
from .credentials_providers import read_provider_chain

log = logging.getLogger(__name__)

# Java daemon default is "no timeout" (a hung child stalls its shard for ever); a restart
# from the last checkpoint after a minute of silence loses nothing and unblocks the shard.
DEFAULT_ACTION_TIMEOUT_S = 60.0
RETRIEVAL_MODES = ("POLLING", "FANOUT", "DEFAULT")
# The KCL's PollingConfigBean.anyPropertiesSet: with retrievalMode DEFAULT, one of these set
# means polling, none enhanced fan-out. The first two are Java primitives, whose 0 is unset.
POLLING_KEYS = ("maxRecords", "idleTimeBetweenReadsInMillis", "retryGetRecordsInSeconds",
                "maxGetRecordsThreadPool")
# The properties of the KCL 3.x tables' configuration beans, after their table's prefix.
_TABLE_BEAN_PROPERTIES = ("TableName", "BillingMode", "ReadCapacity", "WriteCapacity",
                          "PointInTimeRecoveryEnabled", "DeletionProtectionEnabled", "Tags")
PRIMITIVE_POLLING_KEYS = POLLING_KEYS[:2]
CLIENT_VERSIONS = ("CLIENT_VERSION_CONFIG_3X", "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X")
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0"}


# --------------------------------------------------------------------------- value readers

def _any(key: str, value: str) -> str:
    return value


def normalise_endpoint(key: str, value: str) -> str:
    """The Java SDK needs a scheme; users often write ``host:port``. Local hosts get
    ``http://`` (emulators rarely serve TLS), anything else ``https://``."""
    value = _TEXT.parse(key, value)
    if "://" not in value:
        host = value.split("/")[0].rsplit(":", 1)[0] if not value.startswith("[") else \
            value.split("]")[0] + "]"
        scheme = "http" if host.lower() in _LOCAL_HOSTS else "https"
        log.debug("%s: %r has no scheme; using %s://", key, value, scheme)
        value = f"{scheme}://{value}"
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"{key}: not an http(s) endpoint URL: {value!r}")
    try:
        parts.port  # noqa: B018 - raises on a non-numeric port
    except ValueError:
        raise ConfigurationError(f"{key}: bad port in endpoint URL: {value!r}") from None
    return value


def _stream_arn(key: str, value: str) -> str:
    if parse_stream_arn(value) is None:
        raise ConfigurationError(
            f"{key}: not a Kinesis stream ARN (arn:aws:kinesis:<region>:<account>:stream/<name>): "
            f"{value!r}")
    return value


def _timestamp(key: str, value: str) -> float:
    """Epoch seconds as the Java daemon reads them; ISO-8601 also accepted (ours only)."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return iso_time(value).timestamp()
    except ValueError:
        raise ConfigurationError(f"{key}: not a timestamp (epoch seconds): {value!r}") from None


# --------------------------------------------------------------------------- key table

# The Java daemon's nested SDK client builder keys (MultiLangDaemonConfiguration's
# kinesisClient, dynamoDbClient, cloudWatchClient beans).
CLIENT_PREFIXES = ("kinesisClient.", "dynamoDbClient.", "cloudWatchClient.")
# Why any other nested client key is refused (the properties reader's error, the KCL key
# table's reason): said once.
CLIENT_KEYS_REFUSAL = (
    "the Java daemon hands it to its SDK client's builder (region, retry policy, HTTP "
    "client...), which has no boto3 counterpart of the same meaning; refused at start by "
    "name. Use regionName and the endpoint keys")

_CREDENTIALS_PREFIX = "AWSCredentialsProvider"


def canonical_key(key: str) -> str:
    """KCL 3.x reads the credentials keys in any case (kclpy 3's sample writes
    ``AwsCredentialsProvider``); the rest of the name stays case-sensitive, as there."""
    if key.lower().startswith(_CREDENTIALS_PREFIX.lower()):
        return _CREDENTIALS_PREFIX + key[len(_CREDENTIALS_PREFIX):]
    return key



_TEXT = Text()
_ANY = ValueType("text", _any)
_ENDPOINT = ValueType("URL (http(s)://host:port; host:port gets a scheme)", normalise_endpoint)
_PROVIDER = ValueType("credentials provider chain (Class, arguments after a bar, classes "
                      "separated by commas)",
                      read_provider_chain)
_PROVIDER_DOC = (
    "Honoured: DefaultAWSCredentialsProviderChain / DefaultCredentialsProvider (boto3's "
    "default chain); EnvironmentVariableCredentialsProvider (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY must be set); ProfileCredentialsProvider[|<profile>] (AWS_PROFILE "
    "or default without one); KclStsAssumeRoleCredentialsProvider|<role arn>[|<session "
    "name>][|externalId=<id>][|endpointRegion=<region>][|endpoint=<url>^<region>], also "
    "spelt StsAssumeRoleCredentialsProvider, STSAssumeRoleSessionCredentialsProvider and "
    "KclSTSAssumeRoleSessionCredentialsProvider: the role is assumed with the default "
    "chain's credentials and refreshed before it expires; without a session name the "
    "session is named kinesis-dstream-<epoch seconds>. A comma-separated chain is resolved once at "
    "start: the first provider that can give credentials then. Any other provider (JVM system "
    "properties, instance or container role alone, static keys in the file, a custom class) "
    "is refused at start naming the key and the class, never its arguments.")
_KCL3 = ("KCL 3.x: this engine speaks the 2.x lease protocol (no leader, no worker metrics, "
         "no extra tables); the value is checked, then left to the Java daemon.")


def _ignored(name: str, value_type: ValueType, doc: str) -> Option:
    return Option(name, value_type, doc, target="ignore", field=name)


def _config(name: str, value_type: ValueType, field_name: str, doc: str, default: str = "",
            aliases: tuple[str, ...] = ()) -> Option:
    return Option(name, value_type, doc, default, aliases, target="config", field=field_name)


# The Java daemon's configuration beans (KCL 3.1.3's MultiLangDaemonConfiguration): each of
# their properties is delegated to a top-level key of the same name, and each bean also has a
# getter, so commons-beanutils reads "<bean>.<property>" as that same property. Here the
# nested key is an alias of the top-level one (both given: refused as given twice).
# fanoutConfig is not among them: its keys are not delegated (see consumerArn below).
NESTED_BEANS: Mapping[str, tuple[str, ...]] = {
    "pollingConfig": (*POLLING_KEYS, "millisBehindLatestThresholdForReducedTps"),
    "gracefulLeaseHandoffConfigBean": ("gracefulLeaseHandoffTimeoutMillis",
                                       "isGracefulLeaseHandoffEnabled"),
    "workerUtilizationAwareAssignmentConfigBean": (
        "inMemoryWorkerMetricsCaptureFrequencyMillis", "workerMetricsReporterFreqInMillis",
        "noOfPersistedMetricsPerWorkerMetrics", "disableWorkerMetrics",
        "maxThroughputPerHostKBps", "dampeningPercentage", "reBalanceThresholdPercentage",
        "allowThroughputOvershoot", "varianceBalancingFrequency", "workerMetricsEMAAlpha",
        "staleWorkerMetricsEntryCleanupDuration"),
    **{f"{table}TableConfigBean": tuple(f"{prefix}{name}" for name in _TABLE_BEAN_PROPERTIES)
       for table, prefix in (("workerMetricStats", "workerMetrics"),
                             ("coordinatorState", "coordinatorState"))},
}


def _with_nested_keys(options: tuple[Option, ...]) -> tuple[Option, ...]:
    """Each option a bean holds, with its ``<bean>.<name>`` spelling as an alias."""
    names = {option.name for option in options}
    missing = {name for held in NESTED_BEANS.values() for name in held} - names
    assert not missing, f"bean properties with no option: {sorted(missing)}"
    return tuple(replace(option, aliases=option.aliases + tuple(
        f"{bean}.{option.name}" for bean, held in NESTED_BEANS.items() if option.name in held))
        for option in options)


# Target "config" sets a ConsumerConfig field, "settings" a MultiLangSettings one, "special"
# is resolved in _apply, "ignore" is checked and then ignored.
PROPERTIES = FrontEnd(
    name="KCL properties file (multilang daemon, propertiesFile)",
    doc="The Java MultiLangDaemon's keys (KCL 2.x and 3.x names), read by `python -m "
        "kinesis_dstream multilang` and by createStream's propertiesFile; the same file runs "
        "under the Java daemon. The AWSCredentialsProvider keys are read in any case. The "
        "Java daemon's nested SDK client keys (kinesisClient.*, dynamoDbClient.*, "
        "cloudWatchClient.*) are refused at start by name, except endpointOverride (an alias "
        "of the endpoint key). A key marked 'Accepted with no effect' has no meaning here; "
        "its row says why.",
    case_sensitive=True, noun="property", canonical=canonical_key,
    logger=__name__,
    options=_with_nested_keys((
        _config("streamName", _TEXT, "stream_name", "The Kinesis stream (or streamArn)."),
        Option("streamArn", ValueType("Kinesis stream ARN", _stream_arn),
               "The stream by ARN; wins over streamName. Every Kinesis call names it by "
               "StreamARN (a stream of another account, through its resource policy), signed "
               "in the ARN's region. With a regionName of another region only its name is "
               "kept, with a warning, as the Java daemon keeps only the name (amazon-kclpy's "
               "sample.properties has an ARN of a made-up region).", target="special", field="streamArn"),
        _config("applicationName", _TEXT, "application_name",
                "The application; names the lease table (required)."),
        _config("tableName", _TEXT, "table_name", "The lease table, if not named after "
                "the application (as the KCL's).", "applicationName"),
        _config("cleanupLeasesUponShardCompletion", BOOLEAN,
                "cleanup_leases_upon_shard_completion", "Delete a finished shard's lease "
                "once every child has a lease checkpointed past its start and its own "
                "parents' leases are gone (the KCL's LeaseCleanupManager rules), checked on "
                "the shard-sync interval; false keeps every finished lease.", "true"),
        Option("executableName", _TEXT, "The record processor's command (a .py script runs "
               "with this interpreter); required by the daemon.", target="settings",
               field="executable_name"),
        Option("processingLanguage", _TEXT, "Told to the child as the Java daemon does.",
               target="settings", field="processing_language"),
        _config("regionName", _TEXT, "region_name", "AWS region.", "AWS_REGION or us-east-1"),
        _config("initialPositionInStream", Choice(*INITIAL_POSITIONS), "initial_position",
                "Where a shard without a checkpoint starts.", "LATEST"),
        Option("initialPositionInStreamExtended", ValueType(
            "epoch seconds or ISO-8601 time", _timestamp), "A start time: sets "
            "initialPositionInStream to AT_TIMESTAMP.", target="special",
            field="initialPositionInStreamExtended"),
        Option("AWSCredentialsProvider", _PROVIDER, _PROVIDER_DOC + " Signs Kinesis calls, "
               "and DynamoDB's and CloudWatch's unless their own keys are set.",
               "DefaultAWSCredentialsProviderChain", target="special",
               field="AWSCredentialsProvider"),
        *(Option(f"AWSCredentialsProvider{service}", _PROVIDER, f"The same forms, for "
                 f"{service} calls only (the lease table's, or metrics').",
                 "AWSCredentialsProvider's", target="special",
                 field=f"AWSCredentialsProvider{service}")
          for service in ("DynamoDB", "CloudWatch")),
        # The Java daemon also sets its SDK clients' builder properties by nested keys
        # (kinesisClient.endpointOverride, ...): the endpoint is the one we honour; any other
        # CLIENT_PREFIXES key is refused by name (properties.py).
        _config("kinesisEndpoint", _ENDPOINT, "kinesis_endpoint",
                "The Kinesis endpoint; by default boto3's resolution.",
                aliases=("kinesisClient.endpointOverride",)),
        _config("dynamoDBEndpoint", _ENDPOINT, "dynamodb_endpoint",
                "The DynamoDB endpoint of the lease table.",
                aliases=("dynamoDbClient.endpointOverride",)),
        _config("cloudWatchEndpoint", _ENDPOINT, "cloudwatch_endpoint",
                "The CloudWatch endpoint for metrics (ours; the Java daemon's only way is "
                "its nested cloudWatchClient.endpointOverride).",
                aliases=("cloudWatchClient.endpointOverride",)),
        _config("maxRecords", Whole(1), "max_records", "Records per GetRecords call "
                "(at most 10000).", "10000"),
        _config("idleTimeBetweenReadsInMillis", Whole(0), "idle_time_between_reads_ms",
                "Wait between GetRecords calls at a shard's tip, ms.", "1000"),
        _config("failoverTimeMillis", Whole(1), "failover_time_ms",
                "A lease not renewed for this long may be taken, ms.", "10000"),
        _config("shardSyncIntervalMillis", Whole(1), "shard_sync_interval_ms",
                "How often the shard list is synced with the lease table, ms.", "60000"),
        _config("workerIdentifier", _TEXT, "worker_id", "This worker's id in the lease table.",
                "host:pid:random", aliases=("workerId",)),
        _config("callProcessRecordsEvenForEmptyRecordList", BOOLEAN,
                "call_process_records_even_for_empty_record_list",
                "Send processRecords with no records too.", "false"),
        Option("retrievalMode", Choice(*RETRIEVAL_MODES), "FANOUT reads by enhanced fan-out "
               "(SubscribeToShard) as a registered consumer, POLLING by GetRecords. DEFAULT, "
               "as the KCL: fan-out unless a polling key (maxRecords, "
               "idleTimeBetweenReadsInMillis, retryGetRecordsInSeconds, "
               "maxGetRecordsThreadPool) is set, then polling with a warning. createStream's "
               "propertiesFile reads by polling whatever this says.", "DEFAULT",
               target="special", field="retrievalMode"),
        _config("fanoutConfig.consumerName", _TEXT, "consumer_name", "The fan-out consumer to "
                "register (if missing) and read as; never deregistered.", "applicationName"),
        _config("fanoutConfig.consumerArn", _TEXT, "consumer_arn", "A fan-out consumer "
                "registered already, by ARN: used as it is (it must be ACTIVE), nothing is "
                "registered."),
        _config("metricsLevel", Choice(*METRICS_LEVELS), "metrics_level",
                "CloudWatch metrics published.", "DETAILED"),
        _config("metricsBufferTimeMillis", Whole(1), "metrics_buffer_time_ms",
                "CloudWatch publishing period, ms.", "10000"),
        _config("shutdownGraceMillis", Whole(0), "shutdown_grace_ms",
                "Time given to record processors at shutdown, ms.", "20000"),
        _config("maxLeasesForWorker", Whole(1), "max_leases_for_worker",
                "Most leases this worker holds.", "unlimited"),
        _config("maxLeasesToStealAtOneTime", Whole(1), "max_leases_to_steal_at_one_time",
                "Most leases taken from other workers per pass.", "1"),
        _config("parentShardPollIntervalMillis", Whole(0), "parent_shard_poll_interval_ms",
                "How often a child shard checks whether its parents finished, ms.", "1000"),
        Option("timeoutInSeconds", Whole(1), "Longest silence of a child while it handles "
               "one action, then it is restarted from the last checkpoint.",
               f"{DEFAULT_ACTION_TIMEOUT_S:g}", target="settings", field="action_timeout_s"),
        # KCL 3.x: how often its leader assigns leases; here, how often this worker looks for
        # leases to take (by default we look every renew period, failover / 3).
        _config("leaseAssignmentIntervalMillis", Whole(1), "lease_taker_interval_ms",
                "KCL 3.x's lease assignment period; here how often this worker looks for "
                "leases to take, ms.", "failoverTimeMillis / 3"),
        # The lease table's settings (billingMode is LeaseManagementConfig's: the Java
        # daemon has no key for it and ignores it; the 3.x daemon reads the last two).
        *table_options(KCL_TABLE_KEYS, what="the lease table"),
        *stall_options(STALL_KEYS),
        _ignored("maxActiveThreads", Whole(-2**31), "The KCL's record-processor thread "
                 "pool. Accepted with no effect: here each held lease has one thread and one "
                 "child process; maxLeasesForWorker bounds them."),
        _ignored("maxLeaseRenewalThreads", Whole(1), "The KCL's renewer thread pool. "
                 "Accepted with no effect: renewals run on a bounded pool of 20, as the "
                 "KCL's default."),
        _ignored("maxGetRecordsThreadPool", Whole(0), "The KCL's asynchronous GetRecords "
                 "pool. Accepted with no effect beyond retrievalMode DEFAULT's choice of "
                 "polling: each shard reads on its own thread."),
        _ignored("retryGetRecordsInSeconds", Whole(0), "The KCL's asynchronous GetRecords "
                 "retry. Accepted with no effect beyond retrievalMode DEFAULT's choice of "
                 "polling: a GetRecords is retried by the one retry policy."),
        _ignored("metricsMaxQueueSize", Whole(0), "The KCL's queue of metrics waiting to "
                 "be published. Accepted with no effect: metrics are aggregated per metric "
                 "and dimensions into one statistic set, so the buffer is bounded by the "
                 "number of series, not by a queue."),
        _ignored("metricsEnabledDimensions", _ANY, "Accepted with no effect: the dimensions "
                 "follow metricsLevel, as the KCL's defaults (Operation, ShardId at "
                 "DETAILED)."),
        _ignored("validateSequenceNumberBeforeCheckpointing", BOOLEAN, "Accepted with no "
                 "effect: every checkpoint is checked against the records delivered to its "
                 "shard (one beyond the last delivered is refused), without the KCL's "
                 "GetShardIterator call; false does not turn that off."),
        _ignored("taskBackoffTimeMillis", Whole(0), "The KCL's wait after a failed task. "
                 "Accepted with no effect: a failed read or child is retried after the "
                 "retry policy's backoff."),
        _ignored("ignoreUnexpectedChildShards", BOOLEAN, "Accepted with no effect: shard "
                 "sync creates a lease for every shard it lists, a child naming its "
                 "parents, so no child is unexpected."),
        _ignored("listShardsBackoffTimeInMillis", Whole(0), "Accepted with no effect: "
                 "ListShards is retried by the one retry policy, as every call."),
        _ignored("maxListShardsRetryAttempts", Whole(0), "Accepted with no effect: "
                 "ListShards is retried by the one retry policy, as every call."),
        _ignored("logWarningForTaskAfterMillis", Whole(0), "Accepted with no effect: a "
                 "child silent for timeoutInSeconds in one action is restarted from its "
                 "checkpoint, with a warning."),
        _ignored("schedulerInitializationBackoffTimeMillis", Whole(0), "Accepted with no "
                 "effect: start-up fails fast, within the retry policy, instead of the KCL's "
                 "initialization retries."),
        _ignored("shardPrioritization", _ANY, "Accepted with no effect: a child is read "
                 "only after its parents, whatever the order leases are taken in."),
        _ignored("skipShardSyncAtWorkerInitializationIfLeasesExist", BOOLEAN, "Accepted "
                 "with no effect: the start's shard sync is one ListShards and one table "
                 "scan, which finds nothing to create when the leases exist."),
        *(_ignored(name, _ANY, "The Java daemon reads this only as fanoutConfig." + name +
                   " (a top-level key reaches no property there); ignored here too, with a "
                   "warning.") for name in ("consumerArn", "consumerName")),
        *(_ignored(f"{prefix}{name}", Whole(0), "The KCL's fan-out registration retries. "
                   "Accepted with no effect: registration waits throttles out for 10 s and "
                   "ACTIVE for 60 s.")
          for prefix in ("", "fanoutConfig.")
          for name in ("maxDescribeStreamConsumerRetries", "maxDescribeStreamSummaryRetries",
                       "registerStreamConsumerRetries", "retryBackoffMillis")),
        # KCL 3.x (MultiLangDaemonConfiguration of 3.1.3): a 3.x file is accepted as it is.
        _ignored("clientVersionConfig", Choice(*CLIENT_VERSIONS), _KCL3),
        _ignored("enablePriorityLeaseAssignment", BOOLEAN, _KCL3),
        _ignored("millisBehindLatestThresholdForReducedTps", Whole(0), _KCL3),
        _ignored("gracefulLeaseHandoffTimeoutMillis", Whole(0), _KCL3),
        _ignored("isGracefulLeaseHandoffEnabled", BOOLEAN, _KCL3),
        *(_ignored(f"{table}{name}", value_type, _KCL3)
          for table in ("coordinatorState", "workerMetrics")
          for name, value_type in (("TableName", _TEXT), ("BillingMode", Choice(*BILLING_MODES)),
                                   ("ReadCapacity", Whole(0)), ("WriteCapacity", Whole(0)),
                                   ("PointInTimeRecoveryEnabled", BOOLEAN),
                                   ("DeletionProtectionEnabled", BOOLEAN), ("Tags", _ANY))),
        _ignored("inMemoryWorkerMetricsCaptureFrequencyMillis", Whole(0), _KCL3),
        _ignored("workerMetricsReporterFreqInMillis", Whole(0), _KCL3),
        _ignored("noOfPersistedMetricsPerWorkerMetrics", Whole(0), _KCL3),
        _ignored("disableWorkerMetrics", BOOLEAN, _KCL3),
        _ignored("maxThroughputPerHostKBps", Number(0), _KCL3),
        _ignored("dampeningPercentage", Whole(0), _KCL3),
        _ignored("reBalanceThresholdPercentage", Whole(0), _KCL3),
        _ignored("allowThroughputOvershoot", BOOLEAN, _KCL3),
        _ignored("varianceBalancingFrequency", Whole(0), _KCL3),
        _ignored("workerMetricsEMAAlpha", Number(0), _KCL3),
        _ignored("staleWorkerMetricsEntryCleanupDuration", Duration(None), _KCL3),
    )))
KNOWN_KEYS = frozenset(key for option in PROPERTIES.options
                       for key in (option.name, *option.aliases))
