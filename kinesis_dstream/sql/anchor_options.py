"""Every option the connectors we replace (the anchors: awslabs, qubole, Databricks) document,
and its fate here: honoured, accepted without effect (with the reason), or refused (with the
reason).

The migration page's per-anchor tables are generated from these lists
(``scripts/migration_tables.py``) and a test parses every row (``tests/test_anchor_options.py``),
so that a job moved from an anchor keeps every setting it wrote or is told by name why not.
Which of our options a honoured name means is not written here: it is looked up in
``option_table`` (the name or one of its aliases), so the two cannot drift apart. A row
carries a valid example value, and where our default differs from the anchor's, says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..settings import Option
from .option_table import ROLES
from .other_connectors import NO_EFFECT_ELSEWHERE, SERVICE_CREDENTIAL_REFUSAL

HONOURED = "honoured"
ACCEPTED = "accepted"
REFUSED = "refused"
SOURCE = ("source",)
SINK = ("sink",)
BOTH = ("source", "sink")


@dataclass(frozen=True)
class AnchorOption:
    """One documented option of an anchor.

    ``example``: a value the anchor takes (for ``refused``, one that is refused).
    ``default``: the anchor's documented default, as option text, where one can be compared
    (a honoured option with it and without it must mean the same here, unless ``differs``
    says why not). ``needs``: other options the example only works with (a session name
    needs a role). ``sets``: where the example shows, when not in the mapped option's own
    field: (attribute path on the parsed options, expected value). ``note``: the reason of an
    ``accepted`` or ``refused`` fate, or what to know about a honoured one.
    """

    name: str
    fate: str
    roles: tuple[str, ...]
    example: str
    default: str = ""
    differs: str = ""
    note: str = ""
    needs: Mapping[str, str] = field(default_factory=dict)
    sets: tuple[str, object] | None = None

    def reason(self) -> str:
        """Why an option has no effect here: the row's note, else what the parser warns."""
        if self.note or self.name not in NO_EFFECT_ELSEWHERE:
            return self.note
        who, what = NO_EFFECT_ELSEWHERE[self.name]
        owner = f"{who}'" if who.endswith("s") else f"{who}'s"
        return f"warned about by name: with {owner} connector it would have {what}"


@dataclass(frozen=True)
class Anchor:
    """One connector we replace: its format name here, the least options that make a valid
    query in its names (by role), and its documented options."""

    key: str
    title: str
    format_name: str
    base: Mapping[str, Mapping[str, str]]
    options: tuple[AnchorOption, ...]


def our_option(name: str, role: str) -> Option | None:
    """The option of ours that ``name`` is (its name or an alias) for ``role``, or None."""
    return ROLES[role].by_key.get(name.lower())


_ROLE_ARN = "arn:aws:iam::123456789012:role/reader"
_ENDPOINT = "https://kinesis.eu-west-1.amazonaws.com"
_PROVIDER = "org.apache.spark.sql.connector.kinesis.BasicAwsCredentials"


def _honoured(name: str, roles: tuple[str, ...], example: str, default: str = "",
              **more: object) -> AnchorOption:
    return AnchorOption(name, HONOURED, roles, example, default, **more)  # type: ignore[arg-type]


def _accepted(name: str, roles: tuple[str, ...], example: str, note: str = "") -> AnchorOption:
    return AnchorOption(name, ACCEPTED, roles, example, note=note)


def _refused(name: str, roles: tuple[str, ...], example: str, note: str) -> AnchorOption:
    return AnchorOption(name, REFUSED, roles, example, note=note)


_NO_RETRY_STORE = ("the awslabs connector's metadata store retries; our batch-range table's "
                   "calls retry by the one policy of kinesis.clientNumRetries and "
                   "kinesis.clientRetryIntervalsMs")

AWSLABS = Anchor("awslabs", "awslabs spark-sql-kinesis-connector", "aws-kinesis", {
    "source": {"kinesis.streamName": "orders", "kinesis.endpointUrl": _ENDPOINT},
    "sink": {"kinesis.streamName": "orders", "kinesis.endpointUrl": _ENDPOINT}}, (
    _honoured("kinesis.endpointUrl", BOTH, "https://kinesis.us-west-2.amazonaws.com",
              note="not required here: without it, AWS_ENDPOINT_URL_KINESIS, else the "
                   "region's public endpoint"),
    _honoured("kinesis.region", BOTH, "us-west-2"),
    _honoured("kinesis.streamName", BOTH, "payments"),
    _honoured("kinesis.consumerType", SOURCE, "SubscribeToShard", "GetRecords",
              needs={"kinesis.consumerName": "orders-etl"}),
    _honoured("kinesis.failOnDataLoss", SOURCE, "true", "false"),
    _honoured("kinesis.maxFetchRecordsPerShard", SOURCE, "5000", "100000"),
    _honoured("kinesis.maxFetchTimePerShardSec", SOURCE, "20",
              sets=("max_fetch_time_per_shard_s", 20.0),
              note="whole seconds; less than 10 is refused, as there. Unset, awslabs has no "
                   "time cap and ends a read on the record cap only; here "
                   "kinesis.maxFetchTimePerShardMs (5 s) applies, since a read still going "
                   "after that is reading a backlog and a longer one only delays the batch. "
                   "Given with kinesis.maxFetchTimePerShardMs, the query is refused"),
    _honoured("kinesis.startingPosition", SOURCE, "TRIM_HORIZON", "LATEST"),
    _honoured("kinesis.describeShardInterval", SOURCE, "5s", "1s"),
    _accepted("kinesis.minBatchesToRetain", SOURCE, "10",
              "it bounds the batches of the connector's own metadata files kept; batch ranges "
              "here are items of a DynamoDB table keyed by the query id"),
    _accepted("kinesis.checkNewRecordThreads", SOURCE, "4",
              "a thread pool of the awslabs driver; this source has none to size"),
    _honoured("kinesis.metadataCommitterType", SOURCE, "DYNAMODB", "HDFS",
              needs={"kinesis.metadataPath": "s3://bucket/meta"},
              note="HDFS keeps the batch ranges as small files under kinesis.metadataPath "
                   "(local, s3:// or s3a://), and the query makes no DynamoDB call. A Python "
                   "source is not told its checkpointLocation, so HDFS needs "
                   "kinesis.metadataPath (give the checkpointLocation): HDFS without it is "
                   "refused, and with neither option the ranges stay in DynamoDB"),
    _honoured("kinesis.metadataPath", SOURCE, "s3://bucket/meta",
              sets=("config.range_path", "s3://bucket/meta"),
              note="awslabs' default is the checkpointLocation, which a Python source is "
                   "not told: give it here; hdfs:// and other file systems without an "
                   "atomic create are refused"),
    _accepted("kinesis.metadataNumRetries", SOURCE, "3", _NO_RETRY_STORE),
    _accepted("kinesis.metadataRetryIntervalsMs", SOURCE, "500", _NO_RETRY_STORE),
    _accepted("kinesis.metadataMaxRetryIntervalMs", SOURCE, "5000", _NO_RETRY_STORE),
    _honoured("kinesis.clientNumRetries", SOURCE, "3", "5"),
    _honoured("kinesis.clientRetryIntervalsMs", SOURCE, "500", "1000"),
    _accepted("kinesis.clientMaxRetryIntervalMs", SOURCE, "5000",
              "our waits between retries double up to a fixed 10 s, awslabs' default"),
    _honoured("kinesis.consumerName", SOURCE, "orders-etl"),
    _honoured("kinesis.stsRoleArn", BOTH, _ROLE_ARN),
    _honoured("kinesis.stsSessionName", BOTH, "etl", needs={"kinesis.stsRoleArn": _ROLE_ARN}),
    _honoured("kinesis.stsEndpointUrl", BOTH, "https://sts.eu-west-1.amazonaws.com"),
    _honoured("kinesis.awsAccessKeyId", BOTH, "AKIDEXAMPLE",
              needs={"kinesis.awsSecretKey": "secret"}),
    _honoured("kinesis.awsSecretKey", BOTH, "secret",
              needs={"kinesis.awsAccessKeyId": "AKIDEXAMPLE"}),
    _honoured("kinesis.sessionToken", BOTH, "token",
              needs={"kinesis.awsAccessKeyId": "AKIDEXAMPLE", "kinesis.awsSecretKey": "secret"},
              note="in the connector's code, not its README. Sent as X-Amz-Security-Token; "
                   "nothing refreshes it, as there: the job fails once it expires. A token "
                   "without keys is refused"),
    _honoured("kinesis.kinesisRegion", SOURCE, "us-west-2"),
    _honoured("kinesis.credentialProviderClass", BOTH, _PROVIDER,
              needs={"kinesis.credentialProviderParam": "AKIDEXAMPLE,secret"},
              sets=("config.aws_access_key_id", "AKIDEXAMPLE"),
              note="the classes listed below; any other class is refused at load() with "
                   "the accepted list, since no JVM class is loaded here. A class given beside "
                   "the key, token or role options is refused too (with awslabs the class "
                   "would win)"),
    _honoured("kinesis.credentialProviderParam", BOTH, "AKIDEXAMPLE,secret",
              needs={"kinesis.credentialProviderClass": _PROVIDER},
              sets=("config.aws_secret_key", "secret")),
    _honoured("kinesis.dynamodb.tableName", SOURCE, "orders-meta",
              note="names our batch-range table"),
    _accepted("kinesis.subscribeToShard.timeoutSec", SOURCE, "30"),
    _accepted("kinesis.subscribeToShard.maxRetries", SOURCE, "5"),
    _honoured("kinesis.getRecords.numberOfRecordsPerFetch", SOURCE, "500", "10000"),
    _honoured("kinesis.getRecords.fetchIntervalMs", SOURCE, "500", "200",
              note="the least time between the starts of two GetRecords calls of one shard's "
                   "reading; with minFetchPeriod too, the longer one holds"),
    _honoured("kinesis.sink.flushWaitTimeMs", SINK, "50", "100"),
    _honoured("kinesis.sink.recordMaxBufferedTimeMs", SINK, "500", "1000"),
    _honoured("kinesis.sink.maxConnections", SINK, "4", "1"),
    _honoured("kinesis.sink.aggregationEnabled", SINK, "false", "true"),
    _honoured("kinesis.sink.recordTtl", SINK, "60000", "30000",
              note="the most time a write spends getting its records in, retries included; "
                   "then the write fails naming the records not written (the KPL drops them "
                   "and the awslabs sink then fails the task)"),
    _honoured("kinesis.sink.proxyAddress", SINK, "proxy.example.com",
              note="in the connector's code, not its README (earlier releases: without "
                   "kinesis.sink., also taken). The sink's Kinesis calls go through that HTTP "
                   "proxy, HTTPS through CONNECT, with basic authentication when a user is "
                   "given; the source's calls do not, as with awslabs"),
    _honoured("kinesis.sink.proxyPort", SINK, "8080",
              needs={"kinesis.sink.proxyAddress": "proxy.example.com"}),
    _honoured("kinesis.sink.proxyUsername", SINK, "user",
              needs={"kinesis.sink.proxyAddress": "proxy.example.com",
                     "kinesis.sink.proxyPassword": "pw"}),
    _honoured("kinesis.sink.proxyPassword", SINK, "pw",
              needs={"kinesis.sink.proxyAddress": "proxy.example.com",
                     "kinesis.sink.proxyUsername": "user"}),
))

QUBOLE = Anchor("qubole", "qubole kinesis-sql", "kinesis", {
    "source": {"streamName": "orders", "endpointUrl": _ENDPOINT},
    "sink": {"streamName": "orders", "endpointUrl": _ENDPOINT}}, (
    _honoured("streamName", BOTH, "payments"),
    _honoured("endpointUrl", BOTH, "https://kinesis.us-west-2.amazonaws.com",
              note="qubole's default is us-east-1's endpoint; here, without it, the region "
                   "(regionName, AWS_REGION, ...) names the endpoint"),
    _honoured("regionName", BOTH, "us-west-2", note="in the connector's code, not its README"),
    _honoured("awsAccessKeyId", BOTH, "AKIDEXAMPLE", needs={"awsSecretKey": "secret"}),
    _honoured("awsSecretKey", BOTH, "secret", needs={"awsAccessKeyId": "AKIDEXAMPLE"}),
    _honoured("sessionToken", BOTH, "token",
              needs={"awsAccessKeyId": "AKIDEXAMPLE", "awsSecretKey": "secret"},
              note="in the connector's code, not its README"),
    _honoured("awsSTSRoleARN", BOTH, _ROLE_ARN),
    _honoured("awsSTSSessionName", BOTH, "etl", needs={"awsSTSRoleARN": _ROLE_ARN}),
    _accepted("awsUseInstanceProfile", BOTH, "true",
              "without key options boto3's default chain is used, the instance profile "
              "included"),
    _honoured("startingPosition", SOURCE, "TRIM_HORIZON", "LATEST"),
    _honoured("failOnDataLoss", SOURCE, "false", "true"),
    _honoured("kinesis.executor.maxFetchTimeInMs", SOURCE, "2000", "1000",
              differs="ours is 5 s: a read of a shard still going after 1 s on a backlog "
                      "only makes more, smaller batches"),
    _honoured("kinesis.executor.maxFetchRecordsPerShard", SOURCE, "5000", "100000"),
    _honoured("kinesis.executor.maxRecordPerRead", SOURCE, "500", "10000"),
    _honoured("kinesis.executor.addIdleTimeBetweenReads", SOURCE, "true", "false",
              sets=("min_fetch_period_s", 1.0)),
    _honoured("kinesis.executor.idleTimeBetweenReadsInMs", SOURCE, "250", "1000",
              needs={"kinesis.executor.addIdleTimeBetweenReads": "true"},
              sets=("min_fetch_period_s", 0.25)),
    _honoured("kinesis.client.describeShardInterval", SOURCE, "5s", "1s"),
    _honoured("kinesis.client.numRetries", SOURCE, "2", "3",
              differs="ours is 5, the awslabs connector's"),
    _honoured("kinesis.client.retryIntervalMs", SOURCE, "500", "1000"),
    _accepted("kinesis.client.maxRetryIntervalMs", SOURCE, "5000"),
    _accepted("kinesis.client.avoidEmptyBatches", SOURCE, "true"),
    _honoured("kinesis.executor.recordMaxBufferedTime", SINK, "500", "1000"),
    _honoured("kinesis.executor.maxConnections", SINK, "4", "1"),
    _honoured("kinesis.executor.aggregationEnabled", SINK, "false", "true"),
    _honoured("kinesis.executor.flushWaitTimeMillis", SINK, "50", "100"),
    _honoured("kniesis.executor.flushWaitTimeMillis", SINK, "50", "100",
              note="the README's spelling"),
))

DATABRICKS = Anchor("databricks", "Databricks Kinesis connector", "kinesis", {
    "source": {"streamName": "orders", "region": "eu-west-1"},
    "sink": {"streamName": "orders", "region": "eu-west-1"}}, (
    _honoured("streamName", BOTH, "payments",
              note="a read takes a comma-separated list of streams, as there"),
    _honoured("region", BOTH, "us-west-2"),
    _honoured("endpoint", BOTH, "https://kinesis.us-west-2.amazonaws.com"),
    _honoured("streamARN", BOTH, "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"),
    _honoured("initialPosition", SOURCE, "trim_horizon", "latest"),
    _honoured("awsAccessKey", BOTH, "AKIDEXAMPLE", needs={"awsSecretKey": "secret"}),
    _honoured("awsSecretKey", BOTH, "secret", needs={"awsAccessKey": "AKIDEXAMPLE"}),
    _honoured("roleArn", BOTH, _ROLE_ARN),
    _honoured("roleSessionName", BOTH, "etl", needs={"roleArn": _ROLE_ARN}),
    _honoured("roleExternalId", BOTH, "ext-1", needs={"roleArn": _ROLE_ARN}),
    _honoured("stsEndpoint", BOTH, "https://sts.eu-west-1.amazonaws.com"),
    _refused("serviceCredential", BOTH, "kinesis-reader", SERVICE_CREDENTIAL_REFUSAL),
    _honoured("maxRecordsPerFetch", SOURCE, "500", "10000"),
    _honoured("maxFetchRate", SOURCE, "2.0", "1.0",
              differs="ours is unlimited: Kinesis' 2 MB/s a shard bounds a reader already"),
    _honoured("maxFetchDuration", SOURCE, "20s", "10s",
              differs="ours is 5 s, for rows within seconds on a backlog"),
    _honoured("fetchBufferSize", SOURCE, "10mb", "20gb",
              differs="ours is unlimited: a batch is bounded by the record caps"),
    _honoured("shardsPerTask", SOURCE, "8", "5",
              differs="ours is 32: a task here reads its shards concurrently"),
    _honoured("shardFetchInterval", SOURCE, "5s", "1s"),
    _honoured("minFetchPeriod", SOURCE, "1s", "400ms",
              differs="ours is 0: kinesis.getRecords.fetchIntervalMs (200 ms) spaces the "
                      "calls already"),
    _honoured("consumerMode", SOURCE, "efo", "polling"),
    _honoured("consumerName", SOURCE, "orders-etl",
              note="used as given: give the registered name, databricks_ prefix included, to "
                   "keep reading by the old consumer"),
    _honoured("requireConsumerDeregistration", SOURCE, "true", "false",
              sets=("deregisters_consumer", True)),
    _accepted("coalesceThresholdBlockSize", SOURCE, "10000000"),
    _accepted("coalesceBinSize", SOURCE, "128000000"),
))

ANCHORS: tuple[Anchor, ...] = (AWSLABS, QUBOLE, DATABRICKS)
