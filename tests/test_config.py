"""ConsumerConfig: cross-field validation, Spark conf keys, dict round trip (tier 1, no I/O)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from kinesis_dstream.config import (
    SPARK_FAIL_ON_DATA_LOSS,
    SPARK_RETRY_MAX_ATTEMPTS,
    SPARK_RETRY_WAIT_TIME,
    ConsumerConfig,
    default_sts_session_name,
)
from kinesis_dstream.errors import ConfigurationError


def make(**overrides) -> ConsumerConfig:
    settings = dict(application_name="app", stream_name="stream", region_name="eu-west-1",
                    worker_id="w1")
    settings.update(overrides)
    return ConsumerConfig(**settings)


@pytest.mark.unit
def test_defaults_are_the_kcl_and_spark_ones():
    config = make()
    assert config.initial_position == "LATEST"
    assert config.failover_time_ms == 10000
    assert config.max_leases_to_steal_at_one_time == 1
    assert config.max_records == 10000
    assert config.retry_wait_time_ms == 100
    assert config.retry_max_attempts == 3
    assert config.lease_table_name == "app"
    # The KCL renews every failover / 3 minus an epsilon.
    assert 3000 <= config.renew_interval_ms + 25 <= 3334
    assert config.renew_interval_ms < config.failover_time_ms / 3


@pytest.mark.unit
def test_explicit_taker_interval_wins():
    assert make(lease_taker_interval_ms=1234).taker_interval_ms == 1234
    # Whatever the default is, a worker must look for leases well within failover time.
    assert 0 < make().taker_interval_ms < make().failover_time_ms


@pytest.mark.unit
def test_region_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    config = ConsumerConfig(application_name="a", stream_name="s")
    assert config.region_name == "ap-south-1"


@pytest.mark.unit
def test_worker_ids_are_unique_by_default():
    a = ConsumerConfig(application_name="a", stream_name="s", region_name="r")
    b = ConsumerConfig(application_name="a", stream_name="s", region_name="r")
    assert a.worker_id and b.worker_id and a.worker_id != b.worker_id


@pytest.mark.unit
@pytest.mark.parametrize("name", ["application_name", "stream_name", "region_name"])
def test_required_names(name):
    with pytest.raises(ConfigurationError, match=name):
        make(**{name: ""})


@pytest.mark.unit
def test_initial_position_must_be_known():
    with pytest.raises(ConfigurationError, match="initial_position") as info:
        make(initial_position="EARLIEST")
    assert "EARLIEST" in str(info.value)
    for ok in ("LATEST", "TRIM_HORIZON"):
        assert make(initial_position=ok).initial_position == ok


@pytest.mark.unit
def test_at_timestamp_needs_a_timestamp():
    with pytest.raises(ConfigurationError, match="initial_position_timestamp"):
        make(initial_position="AT_TIMESTAMP")
    config = make(initial_position="AT_TIMESTAMP", initial_position_timestamp=1700000000.5)
    assert config.initial_position_timestamp == 1700000000.5


@pytest.mark.unit
def test_metrics_level_must_be_known():
    with pytest.raises(ConfigurationError, match="metrics_level"):
        make(metrics_level="VERBOSE")
    assert make(metrics_level="NONE").metrics_level == "NONE"


@pytest.mark.unit
@pytest.mark.parametrize("given", [dict(aws_access_key_id="AKIA"), dict(aws_secret_key="secret")])
def test_key_and_secret_come_as_a_pair(given):
    with pytest.raises(ConfigurationError) as info:
        make(**given)
    assert "aws_access_key_id" in str(info.value) and "aws_secret_key" in str(info.value)
    assert make(aws_access_key_id="AKIA", aws_secret_key="secret").aws_secret_key == "secret"


@pytest.mark.unit
@pytest.mark.parametrize("given,named", [
    (dict(sts_session_name="sess"), ("sts_session_name", "sts_assume_role_arn")),
    (dict(sts_external_id="x"), ("sts_external_id", "sts_assume_role_arn")),
    (dict(sts_session_name="sess", sts_external_id="x"),
     ("sts_session_name", "sts_external_id", "sts_assume_role_arn")),
    (dict(sts_assume_role_arn="arn:aws:iam::1:role/r", sts_session_name="sess", sts_external_id=""),
     ("sts_external_id",)),
    (dict(sts_assume_role_arn="arn:aws:iam::1:role/r", sts_session_name=""),
     ("sts_session_name",)),
    (dict(sts_assume_role_arn="arn:aws:iam::1:role/r", sts_session_name="has space"),
     ("sts_session_name", "RoleSessionName")),
    (dict(sts_assume_role_arn="arn:aws:iam::1:role/r", sts_session_name="x" * 65),
     ("sts_session_name",)),
    (dict(sts_assume_role_arn=""), ("sts_assume_role_arn",)),
])
def test_sts_arguments_without_a_role_or_empty_are_refused(given, named):
    with pytest.raises(ConfigurationError) as info:
        make(**given)
    for name in named:
        assert name in str(info.value)


@pytest.mark.unit
def test_a_role_alone_is_accepted_and_named_by_default():
    """Databricks makes roleSessionName optional: a role alone is assumed under a session
    name of ours (kinesis-dstream-<epoch seconds>)."""
    config = make(sts_assume_role_arn="arn:aws:iam::1:role/r")
    assert (config.sts_session_name, config.sts_external_id) == (None, None)
    assert default_sts_session_name(1_700_000_000.9) == "kinesis-dstream-1700000000"
    make(sts_assume_role_arn="arn:aws:iam::1:role/r", sts_external_id="x")
    make(sts_assume_role_arn="arn:aws:iam::1:role/r", sts_session_name="a.b@c-d_e=f,g+h")


@pytest.mark.unit
def test_a_role_without_an_external_id_is_accepted():
    config = make(sts_assume_role_arn="arn:aws:iam::1:role/r", sts_session_name="sess")
    assert (config.sts_session_name, config.sts_external_id) == ("sess", None)


@pytest.mark.unit
def test_all_three_sts_arguments_accepted():
    config = make(sts_assume_role_arn="arn:aws:iam::1:role/r", sts_session_name="sess",
                  sts_external_id="x")
    assert config.sts_external_id == "x"


@pytest.mark.unit
@pytest.mark.parametrize("name", ["max_records", "failover_time_ms", "shard_sync_interval_ms",
                                  "retry_max_attempts", "max_leases_to_steal_at_one_time",
                                  "max_leases_for_worker", "retry_wait_time_ms"])
@pytest.mark.parametrize("value", [0, -1])
def test_positive_settings(name, value):
    with pytest.raises(ConfigurationError, match=name) as info:
        make(**{name: value})
    assert str(value) in str(info.value)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["idle_time_between_reads_ms",
                                  "checkpoint_interval_ms", "shutdown_grace_ms",
                                  "parent_shard_poll_interval_ms"])
def test_non_negative_settings(name):
    with pytest.raises(ConfigurationError, match=name):
        make(**{name: -1})
    assert getattr(make(**{name: 0}), name) == 0


@pytest.mark.unit
def test_max_records_is_capped_at_the_kinesis_limit():
    with pytest.raises(ConfigurationError, match="max_records"):
        make(max_records=10001)
    assert make(max_records=1).max_records == 1


@pytest.mark.unit
def test_config_is_frozen():
    config = make()
    with pytest.raises(dataclasses.FrozenInstanceError, match="max_records"):
        config.max_records = 5  # type: ignore[misc]


@pytest.mark.unit
def test_replace_validates_and_rejects_unknown_names():
    config = make()
    assert config.replace(max_records=50).max_records == 50
    assert config.max_records == 10000
    with pytest.raises(ConfigurationError, match="maxRecords"):
        config.replace(maxRecords=50)
    with pytest.raises(ConfigurationError, match="max_records"):
        config.replace(max_records=0)


# -- Spark conf ---------------------------------------------------------------------------------
@pytest.mark.unit
def test_with_spark_conf_reads_the_kinesis_asl_keys():
    config = make().with_spark_conf({SPARK_RETRY_WAIT_TIME: "250ms", SPARK_RETRY_MAX_ATTEMPTS: "5"})
    assert config.retry_wait_time_ms == 250
    assert config.retry_max_attempts == 5
    assert make().with_spark_conf({SPARK_RETRY_WAIT_TIME: "2s"}).retry_wait_time_ms == 2000


@pytest.mark.unit
def test_with_spark_conf_ignores_other_keys_and_returns_self_when_nothing_applies():
    config = make()
    assert config.with_spark_conf({"spark.app.name": "x"}) is config


@pytest.mark.unit
@pytest.mark.parametrize("conf, key", [
    ({SPARK_RETRY_WAIT_TIME: "soon"}, SPARK_RETRY_WAIT_TIME),
    ({SPARK_RETRY_MAX_ATTEMPTS: "three"}, SPARK_RETRY_MAX_ATTEMPTS),
    ({SPARK_RETRY_MAX_ATTEMPTS: "2.5"}, SPARK_RETRY_MAX_ATTEMPTS),
    ({SPARK_FAIL_ON_DATA_LOSS: "maybe"}, SPARK_FAIL_ON_DATA_LOSS),
])
def test_with_spark_conf_bad_values_name_the_key(conf, key):
    with pytest.raises(ConfigurationError) as info:
        make().with_spark_conf(conf)
    assert key in str(info.value)


@pytest.mark.unit
def test_fail_on_data_loss_defaults_to_going_on_as_the_kcl_does():
    assert make().fail_on_data_loss is False
    assert make().with_spark_conf({SPARK_FAIL_ON_DATA_LOSS: "True"}).fail_on_data_loss is True
    assert make().with_spark_conf({SPARK_FAIL_ON_DATA_LOSS: "false"}).fail_on_data_loss is False


@pytest.mark.unit
def test_with_spark_conf_values_are_validated():
    with pytest.raises(ConfigurationError, match="retry_max_attempts"):
        make().with_spark_conf({SPARK_RETRY_MAX_ATTEMPTS: "0"})
    with pytest.raises(ConfigurationError, match="retry_wait_time_ms"):
        make().with_spark_conf({SPARK_RETRY_WAIT_TIME: "-5ms"})


# -- dict round trip ----------------------------------------------------------------------------
@pytest.mark.unit
def test_to_dict_from_dict_round_trip_through_json():
    config = make(initial_position="AT_TIMESTAMP", initial_position_timestamp=1.5,
                  aws_access_key_id="k", aws_secret_key="s", max_records=77,
                  lease_taker_interval_ms=500, kinesis_endpoint="http://127.0.0.1:1")
    data = json.loads(json.dumps(config.to_dict()))
    again = ConsumerConfig.from_dict(data)
    assert again == config
    assert again.worker_id == "w1"


@pytest.mark.unit
def test_from_dict_rejects_unknown_keys_by_name():
    data = make().to_dict()
    data["streamName"] = "x"
    data["bogus_ms"] = 1
    with pytest.raises(ConfigurationError) as info:
        ConsumerConfig.from_dict(data)
    assert "streamName" in str(info.value) and "bogus_ms" in str(info.value)


@pytest.mark.unit
def test_from_dict_validates():
    data = make().to_dict()
    data["max_records"] = 0
    with pytest.raises(ConfigurationError, match="max_records"):
        ConsumerConfig.from_dict(data)


@pytest.mark.unit
def test_repr_hides_the_secret_key_and_the_external_id():
    config = make(aws_access_key_id="AKIDEXAMPLE", aws_secret_key="s3cr3t-KEY-value",
                  sts_assume_role_arn="arn:aws:iam::1:role/r", sts_session_name="sess",
                  sts_external_id="ext-id-secret")
    text = repr(config) + str(config)
    assert "s3cr3t-KEY-value" not in text and "ext-id-secret" not in text
    assert "AKIDEXAMPLE" in text  # the key id says which credentials, and is no secret


@pytest.mark.emulator
def test_worker_ids_of_other_processes_and_proof_of_death():
    """A recovered driver's pickled worker id is another process's; it is proven dead only
    when it ran on this host and its pid is gone. A user's own id is never replaced."""
    import os
    import socket
    import subprocess
    import sys

    from kinesis_dstream.worker_id import default_worker_id, made_by_another_process, proven_dead

    mine = default_worker_id()
    assert not made_by_another_process(mine) and not proven_dead(mine)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = f"{socket.gethostname()}:{gone.pid}:0123abcd"
    assert made_by_another_process(dead) and proven_dead(dead)
    alive = f"{socket.gethostname()}:{os.getppid()}:0123abcd"
    assert made_by_another_process(alive) and not proven_dead(alive)
    elsewhere = f"some-other-host:{gone.pid}:0123abcd"
    assert made_by_another_process(elsewhere) and not proven_dead(elsewhere)
    assert not made_by_another_process("my-worker") and not proven_dead("my-worker")
