"""The awslabs connector's options that used to be parsed and dropped, or warned about as
unknown: kinesis.getRecords.fetchIntervalMs, kinesis.maxFetchTimePerShardSec,
kinesis.sessionToken, kinesis.credentialProviderClass/Param, and the sink's recordTtl and
proxy options. Each is followed from the option to what it does (tier 1: fakes, no I/O)."""
from __future__ import annotations

import logging
import time
import types
from typing import Any

import botocore.awsrequest
import pytest

from kinesis_dstream.aws.clients import make_client
from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.records import GetRecordsResult, Record
from kinesis_dstream.retrieval import FetchPace, read_loop
from kinesis_dstream.retrieval.model import MAX_FETCH_TIME_PER_SHARD_S
from kinesis_dstream.retry import Deadline
from kinesis_dstream.sql.options import SinkOptions, parse_options, parse_source_options
from kinesis_dstream.sql.reader import KinesisStreamReader

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

AWSLABS = {"kinesis.streamName": "orders", "kinesis.region": "eu-west-1",
           "kinesis.endpointUrl": "http://127.0.0.1:9"}
KEYS = {"kinesis.awsAccessKeyId": "AKIDEXAMPLE", "kinesis.awsSecretKey": "secret"}


def lowered(options: dict[str, str]) -> dict[str, str]:
    return {key.lower(): value for key, value in options.items()}  # as Spark hands them


class Endless:
    """A record source with a page of one record on every call, never at the tip."""

    shard_id = "shardId-0"
    shard_iterator_calls = 0
    data_lost = None
    iterator = None
    pushes = False  # polled: its calls are paced

    def __init__(self, on_call: Any = None) -> None:
        self.calls = 0
        self.on_call = on_call

    def initialize(self, checkpoint: ESN) -> None:
        pass

    def get_records(self) -> GetRecordsResult:
        self.calls += 1
        if self.on_call:
            self.on_call()
        return GetRecordsResult([Record(b"x", "k", str(10 + self.calls), shard_id="shardId-0")],
                                5000)

    def close(self) -> None:
        pass


def planned_ranges(options: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The shard ranges a polling reader plans for its first reading of one shard."""
    from kinesis_dstream.aws.kinesis import Shard
    from kinesis_dstream.sql.driver_state import DriverState

    parsed = parse_source_options(lowered(options))
    reader = KinesisStreamReader(parsed)
    reader._driver = driver = DriverState(parsed.config)
    shard = Shard("shardId-0", None, None, "0", "1", "1", None)
    monkeypatch.setattr(driver, "list_shards", lambda: {"orders": [shard]})
    monkeypatch.setattr(driver, "prepare_ranges", lambda: None)
    driver.__dict__["ranges"] = None
    monkeypatch.setattr(reader.driver, "recorded_ranges", lambda query, batch, keys: {})
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        return [r for partition in reader.partitions(start, end) for r in partition.ranges]
    finally:
        reader.stop()


# -- 1. kinesis.getRecords.fetchIntervalMs -----------------------------------------------------
def test_fetch_interval_is_the_least_period_of_the_planned_ranges(monkeypatch, aws_env):
    assert parse_source_options(AWSLABS).fetch_interval_s == 0.2  # awslabs' default, 200 ms
    [planned] = planned_ranges({**AWSLABS, "kinesis.getRecords.fetchIntervalMs": "750"},
                               monkeypatch)
    assert planned.min_fetch_period_s == 0.75
    # Databricks' minFetchPeriod is a least period too: the longer one holds.
    [both] = planned_ranges({**AWSLABS, "kinesis.getRecords.fetchIntervalMs": "100",
                             "minFetchPeriod": "300ms"}, monkeypatch)
    assert both.min_fetch_period_s == 0.3
    with pytest.raises(ConfigurationError, match=r"kinesis\.getRecords\.fetchIntervalMs"):
        parse_source_options({**AWSLABS, "kinesis.getRecords.fetchIntervalMs": "-1"})


def calls_in_one_reading(fetch_interval_ms: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """GetRecords calls of one shard's reading over a 1 s budget, paced as the option says."""
    source = Endless()
    monkeypatch.setattr(read_loop, "open_source", lambda *a, **k: source)
    pacing = KinesisStreamReader(parse_source_options(
        {**AWSLABS, "kinesis.getRecords.fetchIntervalMs": fetch_interval_ms}))._pacing(1)
    parsed = parse_source_options(AWSLABS)
    read_loop.read(None, parsed.config, "shardId-0", ESN("4"), None,  # type: ignore[arg-type]
                   max_records=10_000, time_budget_s=1.0,
                   pace=FetchPace(pacing["max_bytes_per_s"], pacing["min_fetch_period_s"]))
    return source.calls


def test_fetch_interval_spaces_the_getrecords_calls_of_a_reading(monkeypatch):
    # Within 1 s, a least period p allows at most 1 + 1/p calls (real sleeps, instant calls).
    fast, slow = (calls_in_one_reading(ms, monkeypatch) for ms in ("50", "400"))
    assert slow <= 3 and fast >= 2 * slow, (fast, slow)


# -- 2. kinesis.maxFetchTimePerShardSec --------------------------------------------------------
def test_max_fetch_time_per_shard_sec_is_each_planned_ranges_time_budget(monkeypatch, aws_env):
    assert parse_source_options(AWSLABS).max_fetch_time_per_shard_s == MAX_FETCH_TIME_PER_SHARD_S
    [planned] = planned_ranges({**AWSLABS, "kinesis.maxFetchTimePerShardSec": "12"}, monkeypatch)
    assert planned.time_budget_s == 12.0
    with pytest.raises(ConfigurationError, match=r"kinesis\.maxFetchTimePerShardSec.*at least 10"):
        parse_source_options({**AWSLABS, "kinesis.maxFetchTimePerShardSec": "9"})
    with pytest.raises(ConfigurationError, match="keep one"):
        parse_source_options({**AWSLABS, "kinesis.maxFetchTimePerShardSec": "12",
                              "kinesis.maxFetchTimePerShardMs": "12000"})


def test_the_read_loop_stops_a_backlog_read_at_the_time_budget(monkeypatch, aws_env):
    """The budget of kinesis.maxFetchTimePerShardSec ends a read that never reaches the tip:
    each call takes a second on a fake clock, so a 12 s budget reads 12 pages, 20 s 20."""
    def pages_read(seconds: str) -> int:
        now = [0.0]

        def one_second_later() -> None:
            now[0] += 1.0

        source = Endless(on_call=one_second_later)
        monkeypatch.setattr(read_loop, "open_source", lambda *a, **k: source)
        monkeypatch.setattr(read_loop, "time", types.SimpleNamespace(
            monotonic=lambda: now[0], perf_counter=time.perf_counter, time=time.time))
        monkeypatch.setattr(read_loop, "Deadline", lambda s: Deadline(s, clock=lambda: now[0]))
        [planned] = planned_ranges({**AWSLABS, "kinesis.maxFetchTimePerShardSec": seconds},
                                   monkeypatch)
        reading = read_loop.read(None, parse_source_options(AWSLABS).config,  # type: ignore[arg-type]
                                 "shardId-0", ESN("4"), None, max_records=100_000,
                                 time_budget_s=planned.time_budget_s)
        assert reading.more_left
        return len(reading.records)

    assert (pages_read("12"), pages_read("20")) == (12, 20)


# -- 3. kinesis.sessionToken ---------------------------------------------------------------------
def test_the_session_token_goes_with_the_static_keys():
    parsed = parse_options({**AWSLABS, **KEYS, "kinesis.sessionToken": "TOKEN"})
    assert parsed.config.aws_session_token == "TOKEN"
    assert "TOKEN" not in repr(parsed.config)  # a config is logged; secrets never are
    source = parse_source_options(lowered({**AWSLABS, **KEYS, "kinesis.sessionToken": "T2"}))
    assert source.config.aws_session_token == "T2"
    with pytest.raises(ConfigurationError, match=r"kinesis\.sessionToken given without "
                                                 r"kinesis\.awsAccessKeyId"):
        parse_source_options({**AWSLABS, "kinesis.sessionToken": "TOKEN"})


def signed_headers(config: Any, service: str = "kinesis") -> dict[str, str]:
    """The headers of the first request a client of ``config`` signs (never sent)."""
    client = make_client(config, service)  # type: ignore[call-overload]
    seen: dict[str, str] = {}

    def capture(request: Any, **kwargs: Any) -> botocore.awsrequest.AWSResponse:
        seen.update({k: v.decode() if isinstance(v, bytes) else v
                     for k, v in request.headers.items()})
        return botocore.awsrequest.AWSResponse(request.url, 200, {}, _Raw(b"{}"))

    client.meta.events.register("before-send", capture)
    client.list_streams()
    return seen


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **kwargs: Any) -> Any:
        yield self.body


def test_the_session_token_reaches_the_signed_request():
    parsed = parse_options({**AWSLABS, **KEYS, "kinesis.sessionToken": "TOKEN"})
    headers = signed_headers(parsed.config)
    assert headers["X-Amz-Security-Token"] == "TOKEN"
    assert "Credential=AKIDEXAMPLE/" in headers["Authorization"]
    assert "X-Amz-Security-Token" not in signed_headers(parse_options({**AWSLABS, **KEYS}).config)


# -- 4. kinesis.credentialProviderClass / kinesis.credentialProviderParam ------------------------
AWSLABS_CLASS = "org.apache.spark.sql.connector.kinesis."
SDK_CLASS = "software.amazon.awssdk.auth.credentials."


def credentials(provider: str, param: str | None = None, **env: str) -> dict[str, Any]:
    options = {**AWSLABS, "kinesis.credentialProviderClass": provider}
    if param is not None:
        options["kinesis.credentialProviderParam"] = param
    config = parse_source_options(lowered(options)).config
    return {name: getattr(config, name) for name in (
        "aws_access_key_id", "aws_secret_key", "aws_session_token", "aws_profile",
        "sts_assume_role_arn", "sts_session_name")
        if getattr(config, name) is not None}


def test_awslabs_provider_classes_mean_the_credentials_we_have(monkeypatch):
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    assert credentials(AWSLABS_CLASS + "ConnectorDefaultCredentialsProvider") == {}
    assert credentials(SDK_CLASS + "DefaultCredentialsProvider") == {}
    assert credentials(AWSLABS_CLASS + "BasicAwsCredentials", "AK, SK") == {
        "aws_access_key_id": "AK", "aws_secret_key": "SK"}
    assert credentials(AWSLABS_CLASS + "BasicAwsSessionCredentials", "AK,SK,TOK") == {
        "aws_access_key_id": "AK", "aws_secret_key": "SK", "aws_session_token": "TOK"}
    role = "arn:aws:iam::123456789012:role/reader"
    assert credentials(AWSLABS_CLASS + "ConnectorSTSCredentialsProvider", f"{role},job-1") == {
        "sts_assume_role_arn": role, "sts_session_name": "job-1"}
    assert credentials(AWSLABS_CLASS + "ConnectorSTSCredentialsProvider", role) == {
        "sts_assume_role_arn": role}
    assert credentials(SDK_CLASS + "ProfileCredentialsProvider", "etl") == {"aws_profile": "etl"}
    assert credentials(SDK_CLASS + "ProfileCredentialsProvider") == {"aws_profile": "default"}
    monkeypatch.setenv("AWS_PROFILE", "ops")
    assert credentials(SDK_CLASS + "ProfileCredentialsProvider") == {"aws_profile": "ops"}


def test_the_sink_takes_the_provider_class_too():
    parsed = parse_options({**AWSLABS, "kinesis.credentialProviderClass":
                            AWSLABS_CLASS + "BasicAwsCredentials",
                            "kinesis.credentialProviderParam": "AK,SK"})
    assert (parsed.config.aws_access_key_id, parsed.config.aws_secret_key) == ("AK", "SK")


@pytest.mark.parametrize("options, named", [
    ({"kinesis.credentialProviderClass": "com.example.MyProvider"},
     r"kinesis\.credentialProviderClass: 'com\.example\.MyProvider' is not a provider.*"
     r"accepted: org\.apache\.spark\.sql\.connector\.kinesis\.ConnectorDefaultCredentialsProvider"),
    ({"kinesis.credentialProviderParam": "x"},
     r"kinesis\.credentialProviderParam given without kinesis\.credentialProviderClass"),
    ({"kinesis.credentialProviderClass": AWSLABS_CLASS + "BasicAwsCredentials",
      "kinesis.credentialProviderParam": "AK"},
     r"kinesis\.credentialProviderParam for .*BasicAwsCredentials: expected "
     r"<access key id>,<secret key>"),
    ({"kinesis.credentialProviderClass": AWSLABS_CLASS + "ConnectorDefaultCredentialsProvider",
      "kinesis.credentialProviderParam": "x"}, r"expected no param"),
    ({"kinesis.credentialProviderClass": AWSLABS_CLASS + "ConnectorSTSCredentialsProvider"},
     r"expected <role ARN>\[,<session name>\]"),
    ({"kinesis.credentialProviderClass": AWSLABS_CLASS + "ConnectorDefaultCredentialsProvider",
      **KEYS}, r"kinesis\.credentialProviderClass .* and kinesis\.awsAccessKeyId, "
               r"kinesis\.awsSecretKey both give credentials"),
])
def test_other_provider_classes_and_bad_params_are_refused_by_name(options, named):
    for parse in (parse_source_options, parse_options):
        with pytest.raises(ConfigurationError, match=named):
            parse(lowered({**AWSLABS, **options}))


def test_no_credential_option_is_warned_about_as_unknown(caplog):
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream"):
        parse_source_options(lowered({
            **AWSLABS, **KEYS, "kinesis.sessionToken": "T",
            "kinesis.getRecords.fetchIntervalMs": "100",
            "kinesis.maxFetchTimePerShardSec": "10"}))
        parse_options(lowered({**AWSLABS, "kinesis.sink.recordTtl": "5000",
                               "kinesis.sink.proxyAddress": "proxy.local",
                               "kinesis.sink.proxyPort": "3128",
                               "kinesis.sink.proxyUsername": "u",
                               "kinesis.sink.proxyPassword": "p",
                               "kinesis.credentialProviderClass":
                               AWSLABS_CLASS + "ConnectorDefaultCredentialsProvider"}))
    assert "unknown" not in caplog.text and "ignored" not in caplog.text, caplog.text


# -- 5. the sink's kinesis.sink.recordTtl and proxy ----------------------------------------------
def test_record_ttl_is_the_deadline_of_the_sinks_retries(aws_env):
    from kinesis_dstream.sql.sink import make_producer

    assert parse_options(AWSLABS).sink.record_ttl_ms == 30_000  # awslabs' default
    producer = make_producer(parse_options({**AWSLABS, "kinesis.sink.recordTtl": "12000"}))
    assert producer.retry.deadline_ms == 12_000
    # Tries enough for the deadline, not their count, to end them: waits of at most 5 s,
    # of which jitter keeps at least half.
    assert producer.retry.max_attempts * producer.retry.max_wait_ms / 2 >= 12_000
    with pytest.raises(ConfigurationError, match=r"kinesis\.sink\.recordTtl"):
        parse_options({**AWSLABS, "kinesis.sink.recordTtl": "0"})


def test_the_proxy_options_make_the_sinks_client_go_through_the_proxy(aws_env):
    from kinesis_dstream.sql.sink import make_producer

    parsed = parse_options(lowered({**AWSLABS, "kinesis.sink.proxyAddress": "proxy.local",
                                    "kinesis.sink.proxyPort": "3128",
                                    "kinesis.sink.proxyUsername": "me@corp",
                                    "kinesis.sink.proxyPassword": "p:w"}))
    url = "http://me%40corp:p%3Aw@proxy.local:3128"
    assert parsed.sink.proxies == {"http": url, "https": url}
    assert make_producer(parsed)._client.meta.config.proxies == {"http": url, "https": url}
    assert "p:w" not in repr(parsed.sink)
    # awslabs' earlier releases read the keys unprefixed; the KPL's default port is 443.
    old = parse_options(lowered({**AWSLABS, "proxyAddress": "10.0.0.1"}))
    assert old.sink.proxies == {"http": "http://10.0.0.1:443", "https": "http://10.0.0.1:443"}
    assert parse_options(AWSLABS).sink.proxies is None
    assert make_producer(parse_options(AWSLABS))._client.meta.config.proxies is None


@pytest.mark.parametrize("sink, named", [
    (dict(proxy_username="u", proxy_password="p"), r"kinesis\.sink\.proxyAddress"),
    (dict(proxy_address="h", proxy_username="u"), "give both or neither"),
    (dict(proxy_address="http://h:80"), r"not a host name.*kinesis\.sink\.proxyPort"),
])
def test_incomplete_proxy_options_are_refused_by_name(sink, named):
    with pytest.raises(ConfigurationError, match=named):
        SinkOptions(**sink)
    with pytest.raises(ConfigurationError, match=r"kinesis\.sink\.proxyPort"):
        parse_options({**AWSLABS, "kinesis.sink.proxyPort": "0"})
