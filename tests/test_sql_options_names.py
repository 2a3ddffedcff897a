"""format("kinesis") with other connectors' option names: Databricks' (streamName, region,
endpoint, initialPosition, awsAccessKey, ..., maxFetchRate, minFetchPeriod, fetchBufferSize)
and qubole's mean here what they mean there, or are warned about by name, once; and the
pacing and byte cap they set on a shard's reading (no emulator, no Spark)."""
from __future__ import annotations

import datetime as dt
import logging

import pytest

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.records import GetRecordsResult, Record
from kinesis_dstream.retrieval import FetchPace, StartingPosition, read_loop
from kinesis_dstream.sql import other_connectors
from kinesis_dstream.sql.options import parse_source_options
from kinesis_dstream.sql.other_connectors import MB
from kinesis_dstream.sql.reader import KinesisStreamReader

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

DATABRICKS = {"streamName": "orders", "region": "eu-west-1"}


def lowered(options: dict[str, str]) -> dict[str, str]:
    """What Spark hands a Python data source: every key lower-cased."""
    return {k.lower(): v for k, v in options.items()}


# -- the Databricks names ----------------------------------------------------------------------
def test_region_alone_gives_the_region_and_its_public_endpoint():
    for given in (DATABRICKS, lowered(DATABRICKS)):
        config = parse_source_options(given).config
        assert (config.stream_name, config.region_name, config.kinesis_endpoint) == \
            ("orders", "eu-west-1", "https://kinesis.eu-west-1.amazonaws.com")
    config = parse_source_options({"streamName": "s", "region": "cn-north-1"}).config
    assert config.kinesis_endpoint == "https://kinesis.cn-north-1.amazonaws.com.cn"


def test_endpoint_is_the_kinesis_endpoint_and_names_the_region():
    config = parse_source_options({"streamName": "s", "endpoint": "http://127.0.0.1:4567",
                                   "region": "us-west-2"}).config
    assert (config.kinesis_endpoint, config.region_name) == ("http://127.0.0.1:4567", "us-west-2")
    config = parse_source_options(
        {"streamName": "s", "endpoint": "https://kinesis.ap-south-1.amazonaws.com"}).config
    assert config.region_name == "ap-south-1"


@pytest.mark.parametrize("value,kind", [("latest", "LATEST"), ("trim_horizon", "TRIM_HORIZON"),
                                        ("earliest", "TRIM_HORIZON"), ("TRIM_HORIZON", "TRIM_HORIZON"),
                                        (" Latest ", "LATEST")])
def test_initial_position_words(value, kind):
    for key in ("initialPosition", "initialposition", "INITIALPOSITION"):
        parsed = parse_source_options({**DATABRICKS, key: value})
        assert parsed.starting_position.type == kind and parsed.unknown == ()


@pytest.mark.parametrize("value,expected", [
    # Databricks' default format, MM/dd/yyyy HH:mm:ss ZZZ, with a zone abbreviation.
    ('{"at_timestamp": "06/25/2020 10:23:45 PDT"}', dt.datetime(2020, 6, 25, 17, 23, 45)),
    ('{"at_timestamp": "06/25/2020 10:23:45 PDT", "format": "MM/dd/yyyy HH:mm:ss ZZZ"}',
     dt.datetime(2020, 6, 25, 17, 23, 45)),
    ('{"at_timestamp": "2024-05-01 10:00:00.250 +0200", "format": "yyyy-MM-dd HH:mm:ss.SSS Z"}',
     dt.datetime(2024, 5, 1, 8, 0, 0, 250_000)),
    ('{"at_timestamp": "01/05/2024 09:30 PM", "format": "dd/MM/yyyy hh:mm a"}',
     dt.datetime(2024, 5, 1, 21, 30)),
    ('{"at_timestamp": "2024-05-01T10:00:00", "format": "yyyy-MM-dd\'T\'HH:mm:ss"}',
     dt.datetime(2024, 5, 1, 10, 0)),
    ('{"at_timestamp": "2024-05-01T10:00:00Z"}', dt.datetime(2024, 5, 1, 10, 0)),
    ("AT_TIMESTAMP 2024-05-01T10:00:00Z", dt.datetime(2024, 5, 1, 10, 0)),
])
def test_initial_position_at_timestamp_json(value, expected):
    parsed = parse_source_options({**DATABRICKS, "initialPosition": value})
    assert parsed.starting_position.type == "AT_TIMESTAMP"
    assert parsed.starting_position.timestamp == expected.replace(tzinfo=dt.timezone.utc).timestamp()


def test_the_parsed_start_is_the_one_every_read_starts_from():
    """The options parser returns retrieval's StartingPosition, so a query's start is the
    request a read sends; its time is passed by keyword, never taken for a sequence number."""
    parsed = parse_source_options({**DATABRICKS,
                                   "initialPosition": "AT_TIMESTAMP 2024-05-01T10:00:00Z"})
    assert isinstance(parsed.starting_position, StartingPosition)
    assert parsed.starting_position.as_request() == {
        "Type": "AT_TIMESTAMP", "Timestamp": dt.datetime(2024, 5, 1, 10, tzinfo=dt.timezone.utc)}
    assert parse_source_options(DATABRICKS).starting_position.as_request() == {"Type": "LATEST"}
    with pytest.raises(TypeError):
        StartingPosition("AT_TIMESTAMP", 1_714_557_600.0)  # type: ignore[misc]


@pytest.mark.parametrize("value", [
    "trim-horizon", "now", "", "at_timestamp", '{"at_timestamp": 5}', '{"timestamp": "x"}',
    '{"at_timestamp": "06/25/2020"}', '{"at_timestamp": "2020", "format": "yyyy QQ"}',
    '{"at_timestamp": "06/25/2020 10:23:45 XYZ"}', "{not json",
])
def test_an_unreadable_initial_position_is_refused_naming_it_never_latest(value):
    with pytest.raises(ConfigurationError, match=r"initialPosition"):
        parse_source_options({**DATABRICKS, "initialPosition": value})


def test_keys_and_roles_reach_the_reader_config():
    config = parse_source_options(lowered({
        **DATABRICKS, "awsAccessKey": "AK", "awsSecretKey": "SK",
        "roleArn": "arn:aws:iam::1:role/r", "roleExternalId": "ext",
        "roleSessionName": "reader", "stsEndpoint": "http://127.0.0.1:2"})).config
    assert (config.aws_access_key_id, config.aws_secret_key) == ("AK", "SK")
    assert (config.sts_assume_role_arn, config.sts_external_id, config.sts_session_name,
            config.sts_endpoint) == ("arn:aws:iam::1:role/r", "ext", "reader",
                                     "http://127.0.0.1:2")
    with pytest.raises(ConfigurationError, match="awsAccessKey"):
        parse_source_options({**DATABRICKS, "awsAccessKey": "AK"})  # without its secret


def test_fetch_sizes_durations_and_tasks():
    parsed = parse_source_options(lowered({
        **DATABRICKS, "maxRecordsPerFetch": "500", "maxFetchRate": "1.5",
        "minFetchPeriod": "400ms", "maxFetchDuration": "10s", "fetchBufferSize": "20gb",
        "shardsPerTask": "5", "shardFetchInterval": "2s", "consumerMode": "polling"}))
    assert parsed.config.max_records == 500
    assert parsed.max_fetch_rate_mb_s == 1.5 and parsed.min_fetch_period_s == 0.4
    assert parsed.max_fetch_time_per_shard_s == 10.0
    assert parsed.fetch_buffer_size_bytes == 20 * 1024 ** 3
    assert parsed.config.shards_per_task == 5 and parsed.describe_shard_interval_s == 2.0
    assert parsed.unknown == ()
    default = parse_source_options(DATABRICKS)
    assert (default.max_fetch_rate_mb_s, default.min_fetch_period_s,
            default.fetch_buffer_size_bytes) == (None, 0.0, None)
    for key, value in (("maxFetchRate", "0"), ("maxFetchRate", "fast"),
                       ("fetchBufferSize", "lots"), ("minFetchPeriod", "soon"),
                       ("maxRecordsPerFetch", "20000")):
        with pytest.raises(ConfigurationError, match=key):
            parse_source_options({**DATABRICKS, key: value})
    with pytest.raises(ConfigurationError, match="consumerMode"):
        parse_source_options({**DATABRICKS, "consumerMode": "push"})


def test_fan_out_names_of_both_connectors_and_their_lifecycles():
    efo = parse_source_options(lowered({**DATABRICKS, "consumerMode": "EFO"}))
    # Databricks: the consumer is named after the query and kept unless asked otherwise.
    assert efo.fan_out and efo.config.retrieval_mode == "FANOUT"
    assert efo.consumer_name is None and efo.consumer_name_for("q1") == "kinesis-dstream-sql-q1"
    assert not efo.deregisters_consumer
    kept = parse_source_options(lowered({**DATABRICKS, "consumerMode": "efo",
                                         "consumerName": "c1",
                                         "requireConsumerDeregistration": "true"}))
    assert kept.consumer_name_for("q1") == "c1" and kept.deregisters_consumer
    # awslabs: the name is required, and the consumer deregistered on stop().
    awslabs = parse_source_options(lowered({
        **DATABRICKS, "kinesis.consumerType": "subscribetoshard", "kinesis.consumerName": "c2"}))
    assert awslabs.fan_out and awslabs.consumer_name_for("q") == "c2"
    assert awslabs.deregisters_consumer and awslabs.config.consumer_name == "c2"
    with pytest.raises(ConfigurationError, match=r"kinesis\.consumerName is required"):
        parse_source_options({**DATABRICKS, "kinesis.consumerType": "SubscribeToShard"})
    with pytest.raises(ConfigurationError, match="not a valid Kinesis consumer name"):
        parse_source_options({**DATABRICKS, "consumerMode": "efo", "consumerName": "a b"})
    polling = parse_source_options(DATABRICKS)
    assert not polling.fan_out and polling.config.retrieval_mode == "POLLING"


def test_a_query_named_consumer_is_registered_only_under_the_query_id_spark_logged(
        monkeypatch):
    """consumerMode efo without consumerName: the consumer is named after the query id, so it
    is registered only once Spark's offset log holds that id (planning the reading it ends).
    A stop before that registers nothing, and a restart that re-runs the first reading asks
    initialOffset() again (a new id): it reads by the consumer of the logged id, not a new one.
    A consumer given by name is registered as the query starts, as the connectors do."""
    from kinesis_dstream.aws.kinesis import Shard
    from kinesis_dstream.sql.driver_state import DriverState

    registered: list[tuple[str, str]] = []

    def a_reader(**extra: str) -> KinesisStreamReader:
        options = parse_source_options({**DATABRICKS, "consumerMode": "efo", **extra})
        reader = KinesisStreamReader(options)
        reader._driver = driver = DriverState(options.config)
        shard = Shard("shardId-0", None, None, "0", "1", "1", None)
        monkeypatch.setattr(driver, "list_shards", lambda: {"orders": [shard]})
        monkeypatch.setattr(driver, "prepare_ranges", lambda: None)
        driver.__dict__["ranges"] = None  # the range table is not needed to plan
        monkeypatch.setattr(driver, "consumer_arn",
                            lambda stream, name, query: registered.append((stream, name)) or "arn")
        monkeypatch.setattr(reader.driver, "recorded_ranges", lambda query, batch, keys: {})
        return reader

    first = a_reader()
    try:
        end = first.latestOffset(first.initialOffset(), None)
        assert int(end["batch"]) == 1
        assert registered == []  # a stop here leaves no consumer behind
    finally:
        first.stop()
    restarted = a_reader()
    try:
        again = restarted.initialOffset()  # Spark re-runs reading 1, logged and not committed
        assert again["query"] != end["query"] and registered == []
        assert restarted.partitions(again, end)
        assert registered == [("orders", f"kinesis-dstream-sql-{end['query']}")]
    finally:
        restarted.stop()
    registered.clear()
    named = a_reader(consumerName="c1")
    try:
        named.initialOffset()
        assert registered == [("orders", "c1")]
    finally:
        named.stop()


def test_subscription_knobs_of_awslabs_are_warned_about_by_name(caplog, monkeypatch):
    monkeypatch.setattr(other_connectors, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.sql"):
        parse_source_options({**DATABRICKS, "kinesis.consumerType": "SubscribeToShard",
                              "kinesis.consumerName": "c",
                              "kinesis.subscribeToShard.timeoutSec": "60",
                              "kinesis.subscribeToShard.maxRetries": "10"})
    lines = " ".join(r.getMessage() for r in caplog.records)
    assert "kinesis.subscribeToShard.timeoutSec" in lines and "maxFetchTimePerShardMs" in lines
    assert "kinesis.subscribeToShard.maxRetries" in lines and "would have" in lines


def test_the_reading_is_paced_and_capped_as_the_options_say():
    reader = KinesisStreamReader(parse_source_options({
        **DATABRICKS, "maxFetchRate": "1.5", "minFetchPeriod": "400ms",
        "fetchBufferSize": "10mb"}))
    assert reader._pacing(4) == {"max_bytes": 10 * MB // 4, "max_bytes_per_s": 1.5 * MB,
                                 "min_fetch_period_s": 0.4}
    # kinesis.getRecords.fetchIntervalMs' 200 ms (awslabs' default) is the least period
    # when nothing names one (Databricks' own minFetchPeriod default is longer: 400 ms).
    plain = KinesisStreamReader(parse_source_options(DATABRICKS))
    assert plain._pacing(4) == {"max_bytes": 0, "max_bytes_per_s": 0.0,
                                "min_fetch_period_s": 0.2}


def test_an_option_without_effect_here_is_warned_about_once_by_name(caplog, monkeypatch):
    monkeypatch.setattr(other_connectors, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.sql"):
        for _ in range(3):  # Spark parses a source's options several times
            parsed = parse_source_options({**DATABRICKS, "coalesceBinSize": "128000000",
                                           "coalesceThresholdBlockSize": "1000"})
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and parsed.unknown == ()
    assert "'coalesceBinSize' is the Databricks connector's" in lines[0]
    assert "would have" in lines[0] and "coalesceThresholdBlockSize" in lines[1]


# -- the qubole names --------------------------------------------------------------------------
def test_qubole_names_map_where_they_do_not_collide(caplog, monkeypatch):
    parsed = parse_source_options(lowered({
        "streamName": "s", "endpointUrl": "http://127.0.0.1:1",
        "kinesis.executor.maxFetchTimeInMs": "3000",
        "kinesis.executor.maxFetchRecordsPerShard": "700",
        "kinesis.executor.maxRecordPerRead": "250",
        "kinesis.client.describeShardInterval": "5s", "kinesis.client.numRetries": "2",
        "kinesis.client.retryIntervalMs": "300", "failOnDataLoss": "true",
        "kinesis.executor.addIdleTimeBetweenReads": "true",
        "kinesis.executor.idleTimeBetweenReadsInMs": "250"}))
    assert parsed.max_fetch_time_per_shard_s == 3.0 and parsed.max_fetch_records_per_shard == 700
    assert parsed.config.max_records == 250 and parsed.describe_shard_interval_s == 5.0
    assert (parsed.config.retry_max_attempts, parsed.config.retry_wait_time_ms) == (3, 300)
    assert parsed.fail_on_data_loss and parsed.min_fetch_period_s == 0.25
    assert parsed.unknown == ()
    idle_off = parse_source_options({"streamName": "s", "endpointUrl": "http://127.0.0.1:1",
                                     "kinesis.executor.idleTimeBetweenReadsInMs": "250"})
    assert idle_off.min_fetch_period_s == 0.0  # qubole waits only when asked to
    monkeypatch.setattr(other_connectors, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.sql"):
        parse_source_options({**DATABRICKS, "kinesis.client.avoidEmptyBatches": "true"})
    assert "'kinesis.client.avoidEmptyBatches' is the qubole connector's" in caplog.text


# -- pacing and the byte cap in the read loop --------------------------------------------------
def test_fetch_pace_waits_for_the_rate_and_the_least_period():
    pace = FetchPace(max_bytes_per_s=1000.0, min_period_s=0.4)
    # 100 bytes in 0.1 s: the period is what holds the next call back.
    assert pace.wait_s(began=0.0, bytes_read=100, last_call=0.0, now=0.1) == pytest.approx(0.3)
    # 2000 bytes: the rate holds it until 2 s after the reading began.
    assert pace.wait_s(began=0.0, bytes_read=2000, last_call=0.5, now=0.6) == pytest.approx(1.4)
    assert pace.wait_s(began=0.0, bytes_read=2000, last_call=0.5, now=3.0) == 0.0
    assert not FetchPace().paces and FetchPace().wait_s(began=0, bytes_read=10 ** 9,
                                                        last_call=0, now=0) == 0.0


class Pages:
    """A record source handing out the given pages, none at the tip."""

    shard_id = "shardId-0"
    shard_iterator_calls = 0
    data_lost = None
    iterator = None
    pushes = False  # polled: its calls are paced

    def __init__(self, pages: list[list[Record]]) -> None:
        self.pages = pages

    def initialize(self, checkpoint: ESN) -> None:
        pass

    def get_records(self) -> GetRecordsResult:
        return GetRecordsResult(self.pages.pop(0), 5000)

    def close(self) -> None:
        pass


CONFIG = ConsumerConfig(application_name="names", stream_name="s", region_name="us-east-1",
                        kinesis_endpoint="http://127.0.0.1:9")


def pages(n: int, size: int) -> list[list[Record]]:
    return [[Record(b"x" * size, "k", str(10 + i), shard_id="shardId-0")] for i in range(n)]


def test_the_read_loop_spaces_its_calls_and_stops_at_the_byte_cap(monkeypatch):
    monkeypatch.setattr(read_loop, "open_source", lambda *a, **k: Pages(pages(10, 500)))
    slept: list[float] = []
    reading = read_loop.read(None, CONFIG, "shardId-0", ESN("4"), None, max_records=100,
                             time_budget_s=30.0, max_bytes=1500, sleep=slept.append,
                             pace=FetchPace(max_bytes_per_s=1000.0))  # type: ignore[arg-type]
    assert len(reading.records) == 3 and reading.more_left and reading.bytes_read == 1500
    # 500 bytes at 1000 B/s: each next call waits until half a second a page has passed.
    assert [round(w, 1) for w in slept] == [0.5, 1.0]


def test_a_pace_wait_past_the_time_budget_ends_the_reading_there(monkeypatch):
    monkeypatch.setattr(read_loop, "open_source", lambda *a, **k: Pages(pages(10, 500)))
    slept: list[float] = []
    reading = read_loop.read(None, CONFIG, "shardId-0", ESN("4"), None, max_records=100,
                             time_budget_s=1.0, sleep=slept.append,
                             pace=FetchPace(min_period_s=5.0))  # type: ignore[arg-type]
    assert len(reading.records) == 1 and reading.more_left and slept == []


