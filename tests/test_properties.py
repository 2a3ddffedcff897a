"""KCL properties files -> ConsumerConfig + MultiLangSettings (pure logic, no emulator)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.multilang.java_properties import parse_properties
from kinesis_dstream.multilang.properties import consumer_config_from_properties, load_properties
from kinesis_dstream.multilang.property_keys import normalise_endpoint

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "app.properties") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def app_py(tmp_path: Path) -> Path:
    path = tmp_path / "app.py"
    path.write_text("print('hi')\n")
    return path


FULL = """\
# every key our engine uses
executableName = app.py --verbose
streamName = ignored-because-arn
streamArn = arn:aws:kinesis:us-west-2:123456789012:stream/orders
applicationName = OrdersApp
processingLanguage = python/3.11
regionName: us-west-2
initialPositionInStream = TRIM_HORIZON
AWSCredentialsProvider = DefaultAWSCredentialsProviderChain
kinesisEndpoint = 127.0.0.1:4567
dynamoDBEndpoint = https://dynamodb.us-west-2.amazonaws.com
maxRecords = 500
idleTimeBetweenReadsInMillis = 250
failoverTimeMillis = 6000
shardSyncIntervalMillis = 10000
workerId = worker-a
callProcessRecordsEvenForEmptyRecordList = true
retrievalMode = POLLING
metricsLevel = NONE
shutdownGraceMillis = 15000
maxLeasesForWorker = 8
maxLeasesToStealAtOneTime = 2
parentShardPollIntervalMillis = 500
timeoutInSeconds = 30
! known to the Java daemon, no effect here
metricsBufferTimeMillis = 10000
validateSequenceNumberBeforeCheckpointing = true
taskBackoffTimeMillis = 500
maxActiveThreads = 0
"""


def test_every_key_lands_in_config_and_settings(tmp_path, app_py):
    settings = load_properties(write(tmp_path, FULL))
    c = settings.config
    assert c.stream_name == "orders"  # streamArn wins, as in the Java daemon
    # ... and names the stream in every Kinesis call, signed in the ARN's region
    assert c.stream_arn == "arn:aws:kinesis:us-west-2:123456789012:stream/orders"
    assert c.kinesis_region == "us-west-2"
    assert c.application_name == "OrdersApp"
    assert c.lease_table_name == "OrdersApp"
    assert c.region_name == "us-west-2"
    assert c.initial_position == "TRIM_HORIZON"
    assert c.kinesis_endpoint == "http://127.0.0.1:4567"
    assert c.dynamodb_endpoint == "https://dynamodb.us-west-2.amazonaws.com"
    assert (c.max_records, c.idle_time_between_reads_ms) == (500, 250)
    assert (c.failover_time_ms, c.shard_sync_interval_ms) == (6000, 10000)
    assert c.worker_id == "worker-a"
    assert c.call_process_records_even_for_empty_record_list is True
    assert c.metrics_level == "NONE"
    assert c.shutdown_grace_ms == 15000
    assert (c.max_leases_for_worker, c.max_leases_to_steal_at_one_time) == (8, 2)
    assert c.parent_shard_poll_interval_ms == 500
    assert settings.executable_name == "app.py --verbose"
    assert settings.command == (sys.executable, str(app_py.resolve()), "--verbose")
    assert settings.processing_language == "python/3.11"
    assert settings.retrieval_mode == "POLLING"
    assert settings.action_timeout_s == 30
    assert c.metrics_buffer_time_ms == 10000
    assert set(settings.ignored_keys) == {"maxActiveThreads",
                                          "validateSequenceNumberBeforeCheckpointing",
                                          "taskBackoffTimeMillis"}


def test_java_properties_syntax():
    text = (
        "  # comment\n"
        "! bang comment\n"
        "\n"
        "a=1\n"
        "b : 2   \n"
        "c 3\n"
        "d = long \\\n"
        "      value\n"
        "e = x\\=y\\:z\n"
        "f = \\u0041\n"
        "g =\n"
        "a = last wins\n"
    )
    assert parse_properties(text) == {"a": "last wins", "b": "2", "c": "3", "d": "long value",
                                      "e": "x=y:z", "f": "A", "g": ""}


def test_unknown_key_is_warned_by_name(tmp_path, app_py, caplog):
    path = write(tmp_path, "executableName = app.py\nstreamName = s\napplicationName = a\n"
                           "failoverTimeMilis = 5000\nFailoverTimeMillis = 5000\n")
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.multilang.properties"):
        settings = load_properties(path)
    text = caplog.text
    assert "'failoverTimeMilis'" in text
    assert "'FailoverTimeMillis'" in text and "did you mean failoverTimeMillis" in text
    assert settings.config.failover_time_ms == 10000  # the KCL default, untouched


@pytest.mark.parametrize("line, key", [
    ("maxRecords = lots", "maxRecords"),
    ("maxRecords = 20000", "maxRecords"),
    ("failoverTimeMillis = -5", "failoverTimeMillis"),
    ("callProcessRecordsEvenForEmptyRecordList = maybe", "callProcessRecordsEvenForEmptyRecordList"),
    ("initialPositionInStream = OLDEST", "initialPositionInStream"),
    ("metricsLevel = LOUD", "metricsLevel"),
    ("retrievalMode = PUSH", "retrievalMode"),
    ("kinesisEndpoint = ftp://example.com", "kinesisEndpoint"),
    ("kinesisEndpoint = localhost:port", "kinesisEndpoint"),
    ("streamArn = arn:aws:s3:::bucket", "streamArn"),
    ("initialPositionInStreamExtended = yesterday", "initialPositionInStreamExtended"),
    ("taskBackoffTimeMillis = soon", "taskBackoffTimeMillis"),
    # KCL 3.x keys
    ("clientVersionConfig = CLIENT_VERSION_CONFIG_2X", "clientVersionConfig"),
    ("workerMetricsBillingMode = ON_DEMAND", "workerMetricsBillingMode"),
    ("maxThroughputPerHostKBps = fast", "maxThroughputPerHostKBps"),
    ("staleWorkerMetricsEntryCleanupDuration = 15 minutes", "staleWorkerMetricsEntryCleanupDuration"),
    ("leaseAssignmentIntervalMillis = 0", "leaseAssignmentIntervalMillis"),
])
def test_invalid_value_names_the_key(tmp_path, app_py, line, key):
    path = write(tmp_path, f"executableName = app.py\nstreamName = s\napplicationName = a\n{line}\n")
    with pytest.raises(ConfigurationError) as info:
        load_properties(path)
    assert key in str(info.value)
    assert line.split("=", 1)[1].strip() in str(info.value)


def test_required_keys(tmp_path, app_py):
    with pytest.raises(ConfigurationError, match="applicationName"):
        load_properties(write(tmp_path, "executableName = app.py\nstreamName = s\n"))
    with pytest.raises(ConfigurationError, match="streamName or streamArn"):
        load_properties(write(tmp_path, "executableName = app.py\napplicationName = a\n"))
    with pytest.raises(ConfigurationError, match="executableName"):
        load_properties(write(tmp_path, "streamName = s\napplicationName = a\n"))
    with pytest.raises(ConfigurationError, match="executableName.*nothere.py"):
        load_properties(write(tmp_path, "executableName = nothere.py\nstreamName = s\n"
                                        "applicationName = a\n"))
    with pytest.raises(ConfigurationError, match="cannot read properties file"):
        load_properties(tmp_path / "missing.properties")


def test_at_timestamp_and_fanout_and_credentials(tmp_path, app_py, caplog, monkeypatch):
    profiles = tmp_path / "aws_config"
    profiles.write_text("[profile team]\naws_access_key_id = AKIDTEAM\n"
                        "aws_secret_access_key = team-secret\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(profiles))
    path = write(tmp_path, "executableName = app.py\nstreamName = s\napplicationName = a\n"
                           "initialPositionInStreamExtended = 1636609142\n"
                           "retrievalMode = FANOUT\n"
                           "AWSCredentialsProvider = ProfileCredentialsProvider|team\n")
    with caplog.at_level(logging.WARNING):
        settings = load_properties(path)
    assert settings.config.initial_position == "AT_TIMESTAMP"
    assert settings.config.initial_position_timestamp == 1636609142.0
    assert settings.retrieval_mode == settings.config.retrieval_mode == "FANOUT"
    assert settings.config.fan_out_consumer_name == "a"  # the application's name, as the KCL
    assert "retrievalMode" not in caplog.text
    assert settings.config.aws_profile == "team"


BASE = "executableName = app.py\nstreamName = s\napplicationName = a\n"


@pytest.mark.parametrize("lines, mode", [
    ("", "FANOUT"),  # kclpy's sample: no retrievalMode, no polling key
    ("retrievalMode = default\n", "FANOUT"),
    ("maxRecords = 500\n", "POLLING"),
    ("idleTimeBetweenReadsInMillis = 250\n", "POLLING"),
    ("idleTimeBetweenReadsInMillis = 0\n", "FANOUT"),  # Java's 0 is "not set"
    ("retryGetRecordsInSeconds = 0\n", "POLLING"),
    ("maxGetRecordsThreadPool = 4\n", "POLLING"),
    ("failoverTimeMillis = 6000\nshardSyncIntervalMillis = 10000\n", "FANOUT"),
    ("maxRecords = 500\nretrievalMode = FANOUT\n", "FANOUT"),
    ("retrievalMode = POLLING\n", "POLLING"),
])
def test_retrieval_mode_default_is_fan_out_unless_a_polling_key_is_set(tmp_path, app_py, caplog,
                                                                      lines, mode):
    with caplog.at_level(logging.WARNING):
        settings = load_properties(write(tmp_path, BASE + lines))
    assert settings.retrieval_mode == settings.config.retrieval_mode == mode
    # Polling by DEFAULT is warned about, naming the key; an explicit choice is not.
    assert ("retrievalMode DEFAULT reads by polling" in caplog.text) == (
        mode == "POLLING" and "retrievalMode" not in lines)


def test_fanout_config_keys_nested_as_the_kcl(tmp_path, app_py, caplog):
    arn = "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/c:1"
    settings = load_properties(write(tmp_path, BASE + "fanoutConfig.consumerName = reader-1\n"))
    assert settings.config.fan_out_consumer_name == "reader-1"
    settings = load_properties(write(tmp_path, BASE + f"fanoutConfig.consumerArn = {arn}\n"))
    assert settings.config.consumer_arn == arn
    with caplog.at_level(logging.WARNING):
        settings = load_properties(write(tmp_path, BASE + "consumerName = top\n"))
    assert settings.config.fan_out_consumer_name == "a"  # the Java daemon ignores it too
    assert "fanoutConfig.consumerName" in caplog.text
    with pytest.raises(ConfigurationError, match="consumer name"):
        load_properties(write(tmp_path, BASE + "fanoutConfig.consumerName = no spaces\n"))


def test_create_stream_properties_stay_polling(tmp_path, caplog):
    path = write(tmp_path, "streamName = s\napplicationName = a\n")
    assert consumer_config_from_properties(path).retrieval_mode == "POLLING"


def test_default_credentials_provider_forms_are_quiet(tmp_path, app_py, caplog):
    path = write(tmp_path, "executableName = app.py\nstreamName = s\napplicationName = a\n"
                           "AWSCredentialsProvider = com.amazonaws.auth.DefaultAWSCredentialsProviderChain\n"
                           "AWSCredentialsProviderDynamoDB = DefaultCredentialsProvider\n")
    with caplog.at_level(logging.WARNING):
        load_properties(path)
    assert "AWSCredentialsProvider" not in caplog.text


def test_endpoint_normalisation():
    assert normalise_endpoint("k", "localhost:4567") == "http://localhost:4567"
    assert normalise_endpoint("k", "127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert normalise_endpoint("k", "kinesis.eu-west-1.amazonaws.com") == \
        "https://kinesis.eu-west-1.amazonaws.com"
    assert normalise_endpoint("k", "http://example.com:80") == "http://example.com:80"


def test_consumer_config_for_the_spark_glue(tmp_path):
    # No executableName needed; overrides win over the file.
    path = write(tmp_path, "streamName = words\napplicationName = wc\nmaxRecords = 100\n"
                           "initialPositionInStream = TRIM_HORIZON\n")
    config = consumer_config_from_properties(path, max_records=50, checkpoint_interval_ms=2000)
    assert (config.stream_name, config.application_name) == ("words", "wc")
    assert config.max_records == 50 and config.checkpoint_interval_ms == 2000
    assert config.initial_position == "TRIM_HORIZON"
    with pytest.raises(ConfigurationError, match="no_such_field"):
        consumer_config_from_properties(path, no_such_field=1)


def test_executable_on_path_and_relative_to_cwd(tmp_path, monkeypatch):
    path = write(tmp_path, "executableName = env python3 -u x\nstreamName = s\napplicationName = a\n")
    assert load_properties(path).command[1:] == ("python3", "-u", "x")
    sub = tmp_path / "sub"
    sub.mkdir()
    (tmp_path / "run.py").write_text("")
    monkeypatch.chdir(tmp_path)
    path = write(sub, "executableName = run.py\nstreamName = s\napplicationName = a\n")
    assert load_properties(path).command == (sys.executable, str((tmp_path / "run.py").resolve()))


@pytest.mark.parametrize("name", ["wordcount.properties", "sample_kclpy_app.properties"])
def test_shipped_example_files_load_without_warnings(name, caplog):
    path = REPO / "kcl_properties" / name
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.multilang.properties"):
        config = consumer_config_from_properties(path)
    assert config.stream_name and config.application_name
    assert caplog.text == ""


# KCL 3.x: kclpy 3's sample properties with every KCL 3 key given a value
# (amazon-kinesis-client-python samples/sample.properties, 3.x section uncommented).
KCL3 = """\
executableName = app.py
streamName = orders
applicationName = OrdersApp
AwsCredentialsProvider = DefaultCredentialsProvider
awsCredentialsProviderDynamoDB = DefaultCredentialsProvider
processingLanguage = python/3.8
initialPositionInStream = TRIM_HORIZON
regionName = us-east-1
failoverTimeMillis = 10000
clientVersionConfig = CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X
coordinatorStateTableName = OrdersApp-CoordinatorState
coordinatorStateBillingMode = PROVISIONED
coordinatorStateReadCapacity = 5
coordinatorStateWriteCapacity = 5
coordinatorStatePointInTimeRecoveryEnabled = false
coordinatorStateDeletionProtectionEnabled = false
coordinatorStateTags = team=orders
gracefulLeaseHandoffTimeoutMillis = 30000
isGracefulLeaseHandoffEnabled = true
workerMetricsTableName = OrdersApp-WorkerMetricStats
workerMetricsBillingMode = PAY_PER_REQUEST
workerMetricsReadCapacity = 5
workerMetricsWriteCapacity = 5
workerMetricsPointInTimeRecoveryEnabled = false
workerMetricsDeletionProtectionEnabled = false
workerMetricsTags = team=orders
inMemoryWorkerMetricsCaptureFrequencyMillis = 1000
workerMetricsReporterFreqInMillis = 30000
noOfPersistedMetricsPerWorkerMetrics = 10
disableWorkerMetrics = false
maxThroughputPerHostKBps = 10000.5
dampeningPercentage = 60
reBalanceThresholdPercentage = 10
allowThroughputOvershoot = true
varianceBalancingFrequency = 3
workerMetricsEMAAlpha = 0.5
staleWorkerMetricsEntryCleanupDuration = PT15M
leaseAssignmentIntervalMillis = 20000
enablePriorityLeaseAssignment = true
leaseTableDeletionProtectionEnabled = false
leaseTablePitrEnabled = false
millisBehindLatestThresholdForReducedTps = 0
"""


def test_a_kcl3_file_loads_quietly_and_its_keys_that_mean_something_here_take_effect(
        tmp_path, app_py, caplog):
    with caplog.at_level(logging.DEBUG, logger="kinesis_dstream.multilang.properties"):
        settings = load_properties(write(tmp_path, KCL3))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    c = settings.config
    assert (c.stream_name, c.application_name, c.failover_time_ms) == ("orders", "OrdersApp", 10000)
    # KCL 3's leader assigns leases this often; our worker looks for leases as often.
    assert c.taker_interval_ms == 20000
    # The lease table's own settings take effect too (when our engine creates the table).
    effective = {"leaseAssignmentIntervalMillis", "leaseTableDeletionProtectionEnabled",
                 "leaseTablePitrEnabled"}
    kcl3_only = {line.split(" = ")[0] for line in KCL3.splitlines()[9:]} - effective
    assert set(settings.ignored_keys) == kcl3_only
    for key in kcl3_only:  # quiet, but a debug line names each one
        assert f"{key} has no effect" in caplog.text


@pytest.mark.parametrize("key", ["AwsCredentialsProvider", "awsCredentialsProvider",
                                 "AWSCREDENTIALSPROVIDER", "AwsCredentialsProviderCloudWatch"])
def test_kcl3_credentials_key_spellings_are_read_as_the_kcl3_daemon_reads_them(
        tmp_path, app_py, caplog, key, monkeypatch):
    profiles = tmp_path / "aws_config"
    profiles.write_text("[default]\naws_access_key_id = AKIDDEFAULT\n"
                        "aws_secret_access_key = default-secret\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(profiles))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    path = write(tmp_path, "executableName = app.py\nstreamName = s\napplicationName = a\n"
                           f"{key} = ProfileCredentialsProvider\n")
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.multilang.properties"):
        config = load_properties(path).config
    assert "unknown property" not in caplog.text
    if key.endswith("CloudWatch"):
        assert config.aws_profile is None
        assert config.cloudwatch_credentials is not None
        assert config.cloudwatch_credentials["aws_profile"] == "default"
    else:
        assert config.aws_profile == "default"  # the SDK's default profile, files only


def test_free_text_keys_the_java_daemon_knows_are_accepted(tmp_path, app_py):
    path = write(tmp_path, "executableName = app.py\nstreamName = s\napplicationName = a\n"
                           "metricsEnabledDimensions = Operation|ShardId\n"
                           "shardPrioritization = NoOpShardPrioritization\n")
    assert set(load_properties(path).ignored_keys) == {"metricsEnabledDimensions", "shardPrioritization"}
