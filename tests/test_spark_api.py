"""createStream's signature and argument rules match PySpark's (no SparkContext needed)."""
from __future__ import annotations

import inspect
import sys
from datetime import datetime

import pyspark.streaming.kinesis as pyspark_kinesis
import pytest

import kinesis_dstream
from kinesis_dstream import ConfigurationError
from kinesis_dstream.spark import kinesis_utils


@pytest.mark.unit
@pytest.mark.matrix
def test_signature_matches_pyspark() -> None:
    ours = inspect.signature(kinesis_dstream.KinesisUtils.createStream).parameters
    theirs = inspect.signature(pyspark_kinesis.KinesisUtils.createStream).parameters
    positional = [p for p in ours.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert [(p.name, p.kind, p.default) for p in positional] == \
        [(p.name, p.kind, p.default) for p in theirs.values()]
    # the defaults that are objects are the equivalent ones
    assert ours["decoder"].default is kinesis_dstream.utf8_decoder
    assert ours["storageLevel"].default == theirs["storageLevel"].default
    extensions = [p.name for p in ours.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert {"initialPositionTimestamp", "messageHandler", "dynamoDBEndpoint",
            "cloudWatchEndpoint", "propertiesFile", "configOverrides"} == set(extensions)


@pytest.mark.unit
@pytest.mark.matrix
def test_constants_match_pyspark() -> None:
    ip, ml = kinesis_dstream.InitialPositionInStream, kinesis_dstream.MetricsLevel
    assert (ip.LATEST, ip.TRIM_HORIZON) == (pyspark_kinesis.InitialPositionInStream.LATEST,
                                            pyspark_kinesis.InitialPositionInStream.TRIM_HORIZON)
    assert ip.AT_TIMESTAMP == 2
    assert (ml.DETAILED, ml.SUMMARY, ml.NONE) == (0, 1, 2)
    assert kinesis_dstream.utf8_decoder("é".encode()) == "é"
    assert kinesis_dstream.utf8_decoder(None) is None


def _create(**kwargs):
    args = dict(ssc=None, kinesisAppName="app", streamName="s", endpointUrl="http://127.0.0.1:1",
                regionName="us-east-1", initialPositionInStream=0, checkpointInterval=2)
    args.update(kwargs)
    return kinesis_dstream.KinesisUtils.createStream(**args)


@pytest.mark.unit
@pytest.mark.parametrize("kwargs, message", [
    (dict(awsAccessKeyId="AK"), "awsAccessKeyId is set but awsSecretKey is null"),
    (dict(awsSecretKey="SK"), "awsSecretKey is set but awsAccessKeyId is null"),
    (dict(stsSessionName="sess"), "stsSessionName given without stsAssumeRoleArn"),
    (dict(stsExternalId="x", stsSessionName="sess"),
     "stsSessionName and stsExternalId given without stsAssumeRoleArn"),
    (dict(stsAssumeRoleArn="arn:aws:iam::1:role/r", stsSessionName=""),
     "stsSessionName must not be empty"),
    # a role alone passes the credentials rule (PySpark's JVM helper wanted all three): the
    # next rule is the one that fails
    (dict(stsAssumeRoleArn="arn:aws:iam::1:role/r", storageLevel="MEMORY"),
     "storageLevel must be"),
    (dict(initialPositionInStream=7), "initialPositionInStream must be"),
    (dict(initialPositionInStream=2), "needs initialPositionTimestamp"),
    (dict(initialPositionTimestamp=datetime(2024, 1, 1)), "only for"),
    (dict(checkpointInterval=0), "checkpointInterval must be"),
    (dict(metricsLevel=9), "metricsLevel must be"),
    (dict(storageLevel="MEMORY"), "storageLevel must be"),
    (dict(messageHandler=len, decoder=bytes.hex), "not both"),
])
def test_argument_rules(kwargs, message) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _create(**kwargs)


@pytest.mark.unit
def test_at_timestamp_position() -> None:
    when = datetime(2024, 1, 2, 3, 4, 5)
    assert kinesis_utils._initial_position(2, when) == ("AT_TIMESTAMP", when.timestamp())
    assert kinesis_utils._initial_position(when, None) == ("AT_TIMESTAMP", when.timestamp())
    assert kinesis_utils._initial_position("trim_horizon", None) == ("TRIM_HORIZON", None)


@pytest.mark.emulator
def test_worker_and_executor_reader_never_import_pyspark() -> None:
    import subprocess

    code = ("import sys, kinesis_dstream.retrieval, kinesis_dstream.worker.process;"
            "sys.exit(1 if any(m.startswith('pyspark') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


class _Built(Exception):
    """Stops createStream once its config is built (no SparkContext here)."""


def _config_of(monkeypatch, **kwargs):
    def build(*args):
        raise _Built(real(*args))

    real = kinesis_utils._build_config
    monkeypatch.setattr(kinesis_utils, "_build_config", build)
    with pytest.raises(_Built) as built:
        _create(**kwargs)
    return built.value.args[0]


@pytest.mark.unit
def test_a_stream_arn_as_stream_name_reads_by_arn(monkeypatch, tmp_path) -> None:
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"
    config = _config_of(monkeypatch, streamName=arn, regionName="us-east-1")
    assert (config.stream_name, config.stream_arn) == ("orders", arn)
    # the ARN's region signs Kinesis calls; regionName stays DynamoDB's and CloudWatch's
    assert (config.kinesis_region, config.region_name) == ("eu-west-1", "us-east-1")
    plain = _config_of(monkeypatch, streamName="orders")
    assert (plain.stream_name, plain.stream_arn) == ("orders", None)
    # a properties file's streamName gives way to the ARN given to createStream
    path = tmp_path / "app.properties"
    path.write_text("streamName = other\napplicationName = app\nregionName = us-east-1\n")
    from_file = _config_of(monkeypatch, streamName=arn, propertiesFile=str(path))
    assert (from_file.stream_name, from_file.stream_arn) == ("orders", arn)


@pytest.mark.unit
def test_a_malformed_stream_arn_is_refused_by_name() -> None:
    bad = "arn:aws:kinesis:eu-west-1:1234:stream/orders"  # an account id has 12 digits
    with pytest.raises(ConfigurationError, match=f"streamName '{bad}' is neither"):
        _create(streamName=bad)
