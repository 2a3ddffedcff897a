"""Bad configuration stops the job with an error naming what is wrong; an outage is waited out.

Real Spark (the session's local-cluster context), kinesis-local, moto's DynamoDB.
"""
from __future__ import annotations

import logging
import time
import warnings

import pytest

from spark_helpers import collected, create, make_ssc, wait_until

from kinesis_dstream.errors import ConfigurationError, CredentialsError

pytestmark = pytest.mark.spark

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)


@pytest.mark.matrix
def test_a_missing_stream_fails_await_termination_within_30_s_naming_it(sc, env, unique_app_name):
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, "no-such-stream-7f3a", env)
    kstream.foreachRDD(lambda rdd: rdd.count())
    began = time.monotonic()
    ssc.start()
    try:
        with pytest.raises(Exception) as failure:  # py4j's wrapper of Spark's own error
            ssc.awaitTerminationOrTimeout(30)
        took = time.monotonic() - began
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    message = str(failure.value)
    assert "StreamNotFoundError" in message and "'no-such-stream-7f3a'" in message, message[-2000:]
    assert "us-east-1" in message and env["kinesis"] in message
    assert took < 30


@pytest.mark.matrix
def test_missing_credentials_are_named_when_the_stream_is_created(sc, env, unique_app_name,
                                                                  monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    ssc = make_ssc(sc)
    with pytest.raises(CredentialsError, match="AWS_ACCESS_KEY_ID"):
        create(ssc, unique_app_name, "any-stream", env)


@pytest.mark.matrix
def test_a_malformed_endpoint_is_named(sc, env, unique_app_name):
    ssc = make_ssc(sc)
    with pytest.raises(ConfigurationError, match="not a url"):
        create(ssc, unique_app_name, "any-stream", dict(env, kinesis="not a url"))


def test_a_kinesis_outage_of_20_s_is_waited_out_and_loses_nothing(
        sc, env, make_stream, put_records, unique_app_name, make_fault_proxy, caplog):
    stream = make_stream(2)
    proxy = make_fault_proxy(share=0.0)
    put_records(stream, [(f"k{i}", f"a{i}") for i in range(100)])
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=proxy.endpoint))
    rows = collected(kstream)
    caplog.set_level(logging.WARNING, logger="kinesis_dstream")
    ssc.start()
    try:
        wait_until(lambda: len(rows) >= 100, 60, "the first records")
        proxy.dropping = True
        outage_began = time.monotonic()
        put_records(stream, [(f"k{i}", f"b{i}") for i in range(100)])
        wait_until(lambda: time.monotonic() - outage_began >= 20, 30, "20 s of outage")
        assert proxy.dropped > 0
        proxy.dropping = False
        wait_until(lambda: len(rows) >= 200, 90, "the records put during the outage")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(rows) == sorted([f"a{i}" for i in range(100)] + [f"b{i}" for i in range(100)])
    faults = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(faults) <= 10, [r.getMessage() for r in faults]
    # Waited out, not failed: no batch and no read-ahead failed during the outage.
    assert not [r.getMessage() for r in faults if "failed" in r.getMessage()]
