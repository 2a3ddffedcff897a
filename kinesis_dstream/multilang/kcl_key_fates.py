"""Every key of the KCL's multilang properties format and its fate here, for the migration page.

The keys are those the Java MultiLangDaemon reads (its ``MultiLangDaemonConfiguration`` bean
properties, KCL 2.x and 3.x: its fields, setters and the polling and fan-out beans it
delegates to, also by their nested ``<bean>.<property>`` names; and amazon-kclpy's sample
properties), each with a value it takes. The fate
is not written here: it is read from the key table (``property_keys``), so the page cannot
say one thing while the parser does another. A key the table sends to a ``ConsumerConfig``
or daemon setting, or resolves itself, is honoured; one it checks and drops is accepted
with no effect (its row's doc says why); a nested SDK client key other than
``endpointOverride`` is refused at start by name (``properties._apply``).
``tests/test_kcl_key_fates.py`` parses a file with each key and checks that fate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .property_keys import CLIENT_KEYS_REFUSAL, CLIENT_PREFIXES, NESTED_BEANS, PROPERTIES

HONOURED = "honoured"
ACCEPTED = "accepted"
REFUSED = "refused"

_ROLE = "arn:aws:iam::123456789012:role/reader"
_3X = "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X"

# key -> a value the KCL takes. Our own keys (cloudWatchEndpoint, the stalled-shard and
# billingMode keys) are not the KCL's and are on the configuration page only.
KCL_KEYS: Mapping[str, str] = {
    "executableName": "sample_kclpy_app.py", "processingLanguage": "python/3.11",
    "streamName": "orders",
    "streamArn": "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
    "applicationName": "orders-app", "tableName": "orders-leases",
    "AWSCredentialsProvider": f"KclStsAssumeRoleCredentialsProvider|{_ROLE}|etl",
    "AWSCredentialsProviderDynamoDB": "DefaultAWSCredentialsProviderChain",
    "AWSCredentialsProviderCloudWatch": "DefaultAWSCredentialsProviderChain",
    "regionName": "eu-west-1",
    "kinesisEndpoint": "https://kinesis.eu-west-1.amazonaws.com",
    "dynamoDBEndpoint": "https://dynamodb.eu-west-1.amazonaws.com",
    "kinesisClient.endpointOverride": "https://kinesis.eu-west-1.amazonaws.com",
    "dynamoDbClient.endpointOverride": "https://dynamodb.eu-west-1.amazonaws.com",
    "cloudWatchClient.endpointOverride": "https://monitoring.eu-west-1.amazonaws.com",
    "kinesisClient.region": "eu-west-1", "dynamoDbClient.region": "eu-west-1",
    "cloudWatchClient.region": "eu-west-1",
    "initialPositionInStream": "TRIM_HORIZON",
    "initialPositionInStreamExtended": "1700000000",
    "workerIdentifier": "worker-1", "workerId": "worker-1",
    "failoverTimeMillis": "20000", "shutdownGraceMillis": "30000",
    "maxRecords": "500", "idleTimeBetweenReadsInMillis": "250",
    "callProcessRecordsEvenForEmptyRecordList": "true",
    "parentShardPollIntervalMillis": "5000", "shardSyncIntervalMillis": "30000",
    "cleanupLeasesUponShardCompletion": "false",
    "ignoreUnexpectedChildShards": "true", "taskBackoffTimeMillis": "1000",
    "metricsBufferTimeMillis": "5000", "metricsMaxQueueSize": "5000",
    "metricsLevel": "SUMMARY", "metricsEnabledDimensions": "Operation",
    "validateSequenceNumberBeforeCheckpointing": "false",
    "maxLeasesForWorker": "8", "maxLeasesToStealAtOneTime": "2",
    "initialLeaseTableReadCapacity": "20", "initialLeaseTableWriteCapacity": "20",
    "leaseTableDeletionProtectionEnabled": "true", "leaseTablePitrEnabled": "true",
    "skipShardSyncAtWorkerInitializationIfLeasesExist": "true",
    "shardPrioritization": "NoOpShardPrioritization",
    "maxActiveThreads": "8", "maxLeaseRenewalThreads": "10",
    "maxGetRecordsThreadPool": "4", "retryGetRecordsInSeconds": "5",
    "listShardsBackoffTimeInMillis": "1500", "maxListShardsRetryAttempts": "50",
    "logWarningForTaskAfterMillis": "60000",
    "schedulerInitializationBackoffTimeMillis": "1000", "timeoutInSeconds": "120",
    "retrievalMode": "FANOUT",
    "fanoutConfig.consumerName": "orders-consumer",
    "fanoutConfig.consumerArn": "arn:aws:kinesis:us-east-1:123456789012:stream/orders/"
                                "consumer/c:1",
    **{f"{prefix}{name}": "3" for prefix in ("", "fanoutConfig.")
       for name in ("maxDescribeStreamConsumerRetries", "maxDescribeStreamSummaryRetries",
                    "registerStreamConsumerRetries", "retryBackoffMillis")},
    "consumerName": "orders-consumer",
    "consumerArn": "arn:aws:kinesis:us-east-1:123456789012:stream/orders/consumer/c:1",
    "clientVersionConfig": _3X, "leaseAssignmentIntervalMillis": "2000",
    "enablePriorityLeaseAssignment": "false",
    "millisBehindLatestThresholdForReducedTps": "60000",
    "gracefulLeaseHandoffTimeoutMillis": "30000", "isGracefulLeaseHandoffEnabled": "false",
    **{f"{table}{name}": value for table in ("coordinatorState", "workerMetrics")
       for name, value in (("TableName", "t"), ("BillingMode", "PAY_PER_REQUEST"),
                           ("ReadCapacity", "10"), ("WriteCapacity", "10"),
                           ("PointInTimeRecoveryEnabled", "true"),
                           ("DeletionProtectionEnabled", "true"), ("Tags", "k=v"))},
    "inMemoryWorkerMetricsCaptureFrequencyMillis": "1000",
    "workerMetricsReporterFreqInMillis": "30000",
    "noOfPersistedMetricsPerWorkerMetrics": "10", "disableWorkerMetrics": "true",
    "maxThroughputPerHostKBps": "1000", "dampeningPercentage": "60",
    "reBalanceThresholdPercentage": "10", "allowThroughputOvershoot": "false",
    "varianceBalancingFrequency": "3", "workerMetricsEMAAlpha": "0.5",
    "staleWorkerMetricsEntryCleanupDuration": "P1D",
}
# ... and each configuration bean's properties by their nested name (the same property).
KCL_KEYS = {**KCL_KEYS, **{f"{bean}.{name}": KCL_KEYS[name]
                           for bean, names in NESTED_BEANS.items() for name in names}}


# Where the keys the reader resolves itself (target "special") land, as an attribute path on
# the daemon's settings (``MultiLangSettings``).
SPECIAL_LANDS: Mapping[str, str] = {
    "streamArn": "config.stream_arn",
    "AWSCredentialsProvider": "config.sts_assume_role_arn",
    "AWSCredentialsProviderDynamoDB": "config.dynamodb_credentials",
    "AWSCredentialsProviderCloudWatch": "config.cloudwatch_credentials",
    "initialPositionInStreamExtended": "config.initial_position_timestamp",
    "retrievalMode": "retrieval_mode",
}


@dataclass(frozen=True)
class KeyFate:
    """One KCL key: its fate here, where a honoured key lands (an attribute path on the
    daemon's ``MultiLangSettings``) and why."""

    key: str
    example: str
    fate: str
    lands: str
    reason: str


def fate_of(key: str) -> KeyFate:
    """``key``'s fate, as the key table decides it."""
    for option in PROPERTIES.options:
        if key == option.name or key in option.aliases:
            if option.target == "ignore":
                return KeyFate(key, KCL_KEYS[key], ACCEPTED, "", option.doc)
            lands = {"config": f"config.{option.field}", "settings": option.field}.get(
                option.target) or SPECIAL_LANDS[option.name]
            note = "" if key == option.name else f"read as {option.name}"
            return KeyFate(key, KCL_KEYS[key], HONOURED, lands, note)
    if key.startswith(CLIENT_PREFIXES):
        return KeyFate(key, KCL_KEYS[key], REFUSED, "", CLIENT_KEYS_REFUSAL)
    raise KeyError(f"{key}: a KCL key the properties table does not declare")


def fates() -> tuple[KeyFate, ...]:
    """Every KCL key's fate, in the order listed."""
    return tuple(fate_of(key) for key in KCL_KEYS)
