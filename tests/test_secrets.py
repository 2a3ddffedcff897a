"""Secrets out of reprs, log lines, exception messages and the DStream checkpoint, for a
config built from each vocabulary: createStream's arguments, the SQL options, a KCL
properties file. The Spark tests (test_spark_secrets.py) grep what a running job writes."""
from __future__ import annotations

import logging
import pickle
import uuid

import pytest
from pyspark import cloudpickle

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.multilang.properties import consumer_config_from_properties
from kinesis_dstream.spark.kinesis_utils import _build_config
from kinesis_dstream.spark.planner import StreamSpec
from kinesis_dstream.sql.options import parse_options, parse_source_options

pytestmark = pytest.mark.unit

ROLE = "arn:aws:iam::123456789012:role/stream-reader"


@pytest.fixture
def secret() -> str:
    return "kd-secret-" + uuid.uuid4().hex


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No key in the environment, and credentials files that hold nothing."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))


def shown(config: object, caplog: pytest.LogCaptureFixture) -> str:
    """Everything a user may see of an object: its repr, its str, and the log lines so far."""
    return "\n".join([repr(config), str(config), *(r.getMessage() for r in caplog.records)])


def error_of(make) -> str:
    with pytest.raises(ConfigurationError) as info:
        make()
    return f"{info.value!r} {info.value}"


# -- createStream's arguments -----------------------------------------------------------------
def create_stream_settings(secret: str, **changes) -> dict:
    return {**dict(application_name="app", stream_name="words", region_name="us-east-1",
                   aws_access_key_id="AKIDSTATIC", aws_secret_key=secret,
                   sts_assume_role_arn=ROLE, sts_session_name="sess", sts_external_id=secret),
            **changes}


def test_create_stream_config_and_its_spec_show_no_secret(secret, caplog):
    caplog.set_level(logging.DEBUG)
    config = _build_config(create_stream_settings(secret), None, {"max_records": 100})
    spec = StreamSpec(key="k", config=config.to_dict())
    assert config.aws_secret_key == secret  # it is there, only not shown
    assert secret not in shown(config, caplog) + shown(spec, caplog)
    # an error raised while the config is built names the setting, not the values beside it
    text = error_of(lambda: _build_config(create_stream_settings(secret), None,
                                          {"max_records": 0}))
    assert "max_records" in text and secret not in text


def test_the_checkpointed_spec_holds_the_key_id_and_no_secret_key(secret, monkeypatch,
                                                                  no_aws_credentials):
    spec = StreamSpec(key="k", config=_build_config(
        create_stream_settings(secret, sts_external_id="ext"), None, None).to_dict())
    for dump in (pickle.dumps, cloudpickle.dumps):  # Spark's checkpoint: cloudpickle
        data = dump(spec)
        assert secret.encode() not in data and b"AKIDSTATIC" in data
    assert spec.consumer_config.aws_secret_key == secret  # this driver keeps it in memory

    recovered = pickle.loads(cloudpickle.dumps(spec))
    text = error_of(lambda: recovered.consumer_config)
    for needed in ("words", "AKIDSTATIC", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
                   "getOrCreate"):
        assert needed in text

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDOTHER")  # another key's secret is no answer
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-this-one")
    error_of(lambda: recovered.consumer_config)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSTATIC")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    config = recovered.consumer_config
    assert (config.aws_access_key_id, config.aws_secret_key) == ("AKIDSTATIC", secret)
    assert config == spec.consumer_config


def test_a_recovered_spec_finds_its_secret_in_the_named_profile(secret, monkeypatch, tmp_path,
                                                                no_aws_credentials):
    recovered = pickle.loads(pickle.dumps(StreamSpec(key="k", config=ConsumerConfig(
        "app", "words", aws_access_key_id="AKIDSTATIC", aws_secret_key=secret).to_dict())))
    credentials = tmp_path / "credentials"
    credentials.write_text("[default]\naws_access_key_id = AKIDOTHER\n"
                           "aws_secret_access_key = not-this-one\n"
                           f"[streams]\naws_access_key_id = AKIDSTATIC\n"
                           f"aws_secret_access_key = {secret}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    error_of(lambda: recovered.consumer_config)  # the default profile holds another key
    monkeypatch.setenv("AWS_PROFILE", "streams")
    assert recovered.consumer_config.aws_secret_key == secret


def test_a_spec_without_static_keys_pickles_and_recovers_as_it_was(no_aws_credentials):
    spec = StreamSpec(key="k", config=ConsumerConfig("app", "words").to_dict())
    assert pickle.loads(cloudpickle.dumps(spec)).consumer_config == spec.consumer_config


# -- the SQL options ------------------------------------------------------------------------------
@pytest.mark.parametrize("secret_key", ["kinesis.awsSecretKey", "awsSecretKey",
                                        "KINESIS.AWSSECRETKEY"])
def test_sql_source_and_sink_options_show_no_secret(secret, secret_key, caplog):
    caplog.set_level(logging.DEBUG)
    options = {"kinesis.streamName": "words", "kinesis.endpointUrl": "http://127.0.0.1:1",
               "kinesis.region": "us-east-1", "kinesis.awsAccessKeyId": "AKIDSTATIC",
               secret_key: secret, "kinesis.stsRoleArn": ROLE, "kinesis.stsSessionName": "sess",
               "kinesis.stsExternalId": secret, "kinesis.secretKy": secret}
    source, sink = parse_source_options(options), parse_options(options)
    assert source.config.aws_secret_key == secret == sink.config.aws_secret_key
    assert secret not in shown(source, caplog) + shown(sink, caplog)
    assert "kinesis.secretKy" in shown(sink, caplog)  # the unknown option was warned about
    for bad in ({"kinesis.maxRecordsPerTrigger": "many"},    # an invalid value beside them
                {"kinesis.awsAccessKeyId": None},             # a secret key without its id
                {"kinesis.stsRoleArn": None}):                # an external id without a role
        text = error_of(lambda bad=bad: parse_source_options(
            {k: v for k, v in {**options, **bad}.items() if v is not None}))
        assert secret not in text


# -- a KCL properties file ------------------------------------------------------------------------
def test_properties_file_credentials_show_no_secret(secret, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "app.properties"
    provider = f"StsAssumeRoleCredentialsProvider|{ROLE}|session|externalId={secret}"
    path.write_text("applicationName = app\nstreamName = words\nregionName = us-east-1\n"
                    f"AWSCredentialsProvider = {provider}\n"
                    f"AWSCredentialsProviderDynamoDB = {provider}\n"
                    f"AwsCredentialsProviderCloudWatch = {provider}\n")
    # createStream(propertiesFile=..., awsAccessKeyId=..., awsSecretKey=...)
    config = consumer_config_from_properties(path, aws_access_key_id="AKIDSTATIC",
                                             aws_secret_key=secret)
    # Honoured (the role, its external id, for every service), and shown nowhere.
    assert config.sts_external_id == secret
    assert config.credentials_for("dynamodb").sts_external_id == secret
    assert secret not in shown(config, caplog)
    text = error_of(lambda: consumer_config_from_properties(
        path, aws_access_key_id="AKIDSTATIC", aws_secret_key=secret, max_records=0))
    assert "maxRecords" in text and secret not in text
