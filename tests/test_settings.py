"""The one settings engine: the same value rules in every front end, every option documented,
and docs/configuration.md generated from the declarations (tier 1, no I/O but tmp files)."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from repo_scripts import load_script

from kinesis_dstream.config import (
    SPARK_BACKPRESSURE_ENABLED,
    SPARK_FAIL_ON_DATA_LOSS,
    SPARK_RETRY_WAIT_TIME,
    ConsumerConfig,
)
from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.multilang.properties import load_properties
from kinesis_dstream.multilang.property_keys import PROPERTIES
from kinesis_dstream.settings import BOOLEAN, FrontEnd, Option, Whole, parse_duration_ms
from kinesis_dstream.spark.rate import RateSettings
from kinesis_dstream.spark_conf import SPARK_CONF
from kinesis_dstream.sql.option_table import SQL_SINK, SQL_SOURCE
from kinesis_dstream.sql.options import parse_options, parse_source_options

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.unit
FRONT_ENDS = (SPARK_CONF, SQL_SOURCE, SQL_SINK, PROPERTIES)
SQL_BASE = {"kinesis.streamName": "s", "kinesis.endpointUrl": "http://127.0.0.1:1"}


def _page_module():
    return load_script("configuration_page")


def config() -> ConsumerConfig:
    return ConsumerConfig(application_name="a", stream_name="s", region_name="eu-west-1",
                          worker_id="w")


def properties(tmp_path: Path, line: str):
    (tmp_path / "app.py").write_text("pass\n")
    path = tmp_path / "app.properties"
    path.write_text(f"executableName = app.py\nstreamName = s\napplicationName = a\n{line}\n")
    return load_properties(path)


# -- one boolean rule ----------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("true", True), ("TRUE", True), (" yes ", True), ("On", True), ("1", True),
    ("false", False), ("No", False), ("off", False), ("0", False)])
def test_every_front_end_reads_a_boolean_the_same_way(tmp_path, text, expected):
    assert config().with_spark_conf({SPARK_FAIL_ON_DATA_LOSS: text}).fail_on_data_loss is expected
    assert RateSettings.from_spark_conf({SPARK_BACKPRESSURE_ENABLED: text}).backpressure is expected
    assert parse_source_options({**SQL_BASE, "kinesis.failOnDataLoss": text}) \
        .fail_on_data_loss is expected
    assert parse_options({**SQL_BASE, "kinesis.sink.aggregationEnabled": text}) \
        .sink.aggregation_enabled is expected
    assert properties(tmp_path, f"callProcessRecordsEvenForEmptyRecordList = {text}") \
        .config.call_process_records_even_for_empty_record_list is expected


@pytest.mark.parametrize("text", ["maybe", "2", "y", ""])
def test_every_front_end_refuses_the_same_non_booleans_naming_the_key(tmp_path, text):
    for parse, key in (
            (lambda k, v: config().with_spark_conf({k: v}), SPARK_FAIL_ON_DATA_LOSS),
            (lambda k, v: RateSettings.from_spark_conf({k: v}), SPARK_BACKPRESSURE_ENABLED),
            (lambda k, v: parse_source_options({**SQL_BASE, k: v}), "kinesis.failOnDataLoss"),
            (lambda k, v: properties(tmp_path, f"{k} = {v}"),
             "callProcessRecordsEvenForEmptyRecordList")):
        with pytest.raises(ConfigurationError, match=key.replace(".", r"\.")):
            parse(key, text)


# -- one case rule for choices -------------------------------------------------------------------
def test_choices_are_read_in_any_case_and_come_out_as_declared(tmp_path):
    settings = properties(tmp_path, "initialPositionInStream = trim_horizon\n"
                                    "metricsLevel = summary\nretrievalMode = polling")
    assert (settings.config.initial_position, settings.config.metrics_level,
            settings.retrieval_mode) == ("TRIM_HORIZON", "SUMMARY", "POLLING")
    parsed = parse_source_options({**SQL_BASE, "kinesis.metadataCommitterType": "dynamodb"})
    assert parsed.metadata_committer_type == "DYNAMODB"
    with pytest.raises(ConfigurationError, match="metricsLevel"):
        properties(tmp_path, "metricsLevel = LOUD")


# -- one duration parser -------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("PT15M", 900_000), ("pt0.25s", 250), ("P1DT1H", 90_000_000), ("PT1,5S", 1500),
    ("-PT1S", -1000), ("250ms", 250), ("2s", 2000), ("1.5s", 1500), ("1min", 60000),
    ("2m", 120000), ("1h", 3600000), ("300", 300), (" 40 MS ", 40)])
def test_one_duration_parser_reads_spark_and_iso_8601_forms(text, expected):
    assert parse_duration_ms(text, "k") == expected


@pytest.mark.parametrize("bad", ["P", "PT", "P1DT", "PT15", "15 minutes", "fast", "ms", "", "1x",
                                 "inf", "-inf", "nan", "1e400s"])
def test_the_duration_parser_refuses_garbage_naming_the_key(bad):
    with pytest.raises(ConfigurationError, match="my.key"):
        parse_duration_ms(bad, "my.key")


def test_every_front_end_takes_both_duration_forms(tmp_path):
    assert config().with_spark_conf({SPARK_RETRY_WAIT_TIME: "PT0.25S"}).retry_wait_time_ms == 250
    parsed = parse_source_options({**SQL_BASE, "kinesis.describeShardInterval": "PT2S",
                                   "kinesis.getRecords.fetchIntervalMs": "1s"})
    assert (parsed.describe_shard_interval_s, parsed.fetch_interval_s) == (2.0, 1.0)
    properties(tmp_path, "staleWorkerMetricsEntryCleanupDuration = 15min")  # checked, ignored
    with pytest.raises(ConfigurationError, match="staleWorkerMetricsEntryCleanupDuration"):
        properties(tmp_path, "staleWorkerMetricsEntryCleanupDuration = soon")


# -- unknown keys --------------------------------------------------------------------------------
def test_an_unknown_spark_conf_key_of_ours_is_warned_by_name_once(caplog):
    typo = "spark.streaming.kinesis.retry.waitTme"
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.config"):
        config().with_spark_conf({typo: "1s", "spark.app.name": "x",
                                  "spark.streaming.backpressure.enabled": "true"})
    lines = [r.getMessage() for r in caplog.records if r.name == "kinesis_dstream.config"]
    assert len(lines) == 1 and repr(typo) in lines[0]
    assert f"did you mean {SPARK_RETRY_WAIT_TIME}" in lines[0]


def test_a_front_end_that_rejects_unknown_keys_names_them():
    strict = FrontEnd("strict", "doc", (Option("a.b", Whole(1), "doc", field="b"),),
                      case_sensitive=True, unknown="reject")
    assert strict.read({"a.b": "3"}, source="t").of("config") == {"b": 3}
    with pytest.raises(ConfigurationError, match="a.c"):
        strict.read({"a.b": "3", "a.c": "4"}, source="t")


def test_an_option_given_under_two_of_its_names_is_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="given twice"):
        properties(tmp_path, "workerId = w1\nworkerIdentifier = w2")
    with pytest.raises(ConfigurationError, match="given twice"):
        parse_source_options({**SQL_BASE, "shardsPerTask": "2", "kinesis.shardsPerTask": "3"})


# -- one credentials rule ------------------------------------------------------------------------
ROLE = "arn:aws:iam::1:role/r"


@pytest.mark.parametrize("given, accepted", [
    (dict(sts_assume_role_arn=ROLE, sts_session_name="sess"), True),
    (dict(sts_assume_role_arn=ROLE, sts_session_name="sess", sts_external_id="x"), True),
    (dict(sts_assume_role_arn=ROLE), True),
    (dict(sts_assume_role_arn=ROLE, sts_external_id="x"), True),
    (dict(sts_session_name="sess", sts_external_id="x"), False),
    (dict(sts_session_name="sess"), False),
    (dict(sts_external_id="x"), False),
    (dict(aws_access_key_id="AK"), False),
    (dict(aws_access_key_id="AK", aws_secret_key="SK"), True),
])
def test_config_and_sql_options_pair_credentials_by_one_rule(given, accepted):
    names = {"aws_access_key_id": "kinesis.awsAccessKeyId",
             "aws_secret_key": "kinesis.awsSecretKey",
             "sts_assume_role_arn": "kinesis.stsRoleArn",
             "sts_session_name": "kinesis.stsSessionName",
             "sts_external_id": "kinesis.stsExternalId"}
    options = {names[field]: value for field, value in given.items()}
    attempts = (lambda: ConsumerConfig(application_name="a", stream_name="s", **given),
                lambda: parse_options({**SQL_BASE, **options}),
                lambda: parse_source_options({**SQL_BASE, **options}))
    for attempt in attempts:
        if accepted:
            attempt()
        else:
            with pytest.raises(ConfigurationError):
                attempt()


def test_a_role_alone_is_accepted_by_every_front_end_with_the_databricks_names():
    """Databricks' roleArn without roleSessionName: accepted by the source and the sink."""
    for parse in (parse_options, parse_source_options):
        parsed = parse({**SQL_BASE, "roleArn": ROLE})
        assert (parsed.config.sts_assume_role_arn, parsed.config.sts_session_name) == (ROLE, None)
    with pytest.raises(ConfigurationError, match="kinesis.stsSessionName"):
        parse_source_options({**SQL_BASE, "roleArn": ROLE, "roleSessionName": "a b"})


# -- the docs page -------------------------------------------------------------------------------
@pytest.mark.parametrize("front", FRONT_ENDS, ids=lambda front: front.name)
def test_every_option_has_documentation_text(front):
    undocumented = [option.name for option in front.options
                    if len(option.doc.strip()) < 10 or not option.type.description.strip()]
    assert not undocumented, f"options without documentation in {front.name}: {undocumented}"


def test_the_page_lists_every_option_with_its_type_default_and_aliases():
    page = _page_module().page()
    for front in FRONT_ENDS:
        assert f"## {front.name}" in page
        for option in front.options:
            row = next(line for line in page.splitlines()
                       if line.startswith(f"| `{option.name}` |"))
            assert option.type.description.split(" (")[0] in row
            assert all(f"`{alias}`" in row for alias in option.aliases)
            assert not option.default or f"`{option.default}`" in row


def test_the_committed_configuration_page_is_what_the_declarations_generate():
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == _page_module().page(), \
        "docs/configuration.md is stale: run python scripts/configuration_page.py"


def test_an_undocumented_option_is_caught():
    """The documentation check itself: an option with no text fails it."""
    bare = FrontEnd("bare", "doc", (Option("x", BOOLEAN, ""),), case_sensitive=True)
    with pytest.raises(AssertionError, match="x"):
        test_every_option_has_documentation_text(bare)


def test_the_spark_conf_names_the_awslabs_consumer_types_and_polling_stays_the_default():
    from kinesis_dstream.config import ConsumerConfig
    from kinesis_dstream.errors import ConfigurationError

    base = ConsumerConfig(application_name="app", stream_name="s", region_name="us-east-1")
    assert base.with_spark_conf({}).retrieval_mode == "POLLING"
    assert base.with_spark_conf({"spark.streaming.kinesis.consumerType": "GetRecords"}
                                ).retrieval_mode == "POLLING"
    fan_out = base.with_spark_conf({"spark.streaming.kinesis.consumerType": "subscribeToShard",
                                    "spark.streaming.kinesis.consumerName": "readers"})
    assert (fan_out.retrieval_mode, fan_out.fan_out_consumer_name) == ("FANOUT", "readers")
    assert base.with_spark_conf({"spark.streaming.kinesis.consumerType": "SubscribeToShard"}
                                ).fan_out_consumer_name == "app"
    arn = "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/c:1"
    assert base.with_spark_conf({"spark.streaming.kinesis.consumerArn": arn}).consumer_arn == arn
    with pytest.raises(ConfigurationError, match="GetRecords, SubscribeToShard"):
        base.with_spark_conf({"spark.streaming.kinesis.consumerType": "EFO"})
