"""The stalled-shard rule (worker/stall.py) on an injected clock: no sleeps."""
from __future__ import annotations

import logging

import pytest

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.worker.stall import ShardsView, StallWatch, largest_lag

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watch(clock: Clock, lag_ms: int = 1000, time_ms: int = 60_000) -> StallWatch:
    return StallWatch(lag_ms, time_ms, "app", clock)


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_lagging_shard_that_stands_still_is_warned_about_once_naming_it(caplog):
    clock = Clock()
    stalls = watch(clock)
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.worker.stall"):
        assert not stalls.observe("shardId-1", 5000, "seq-10")
        clock.now += 59.9
        assert not stalls.observe("shardId-1", 5000, "seq-10")  # not long enough yet
        clock.now += 0.1
        assert stalls.observe("shardId-1", 6000, "seq-10")
        for _ in range(5):  # still stalled: no second warning
            clock.now += 30
            assert not stalls.observe("shardId-1", 7000, "seq-10")
    assert len(warnings(caplog)) == 1
    assert "shardId-1" in warnings(caplog)[0] and "stalled" in warnings(caplog)[0]
    assert stalls.stalls == 1 and stalls.stalled == ["shardId-1"]


def test_it_warns_again_only_after_it_moved_and_stalled_again():
    clock = Clock()
    stalls = watch(clock)
    stalls.observe("s", 5000, "seq-10")
    clock.now += 60
    assert stalls.observe("s", 5000, "seq-10")
    clock.now += 1
    assert not stalls.observe("s", 5000, "seq-11")  # moved
    assert stalls.stalled == []
    clock.now += 59
    assert not stalls.observe("s", 5000, "seq-11")
    clock.now += 1
    assert stalls.observe("s", 5000, "seq-11")
    assert stalls.stalls == 2


def test_a_shard_that_moves_or_keeps_up_is_never_stalled():
    clock = Clock()
    stalls = watch(clock)
    for n in range(100):  # lagging, but reading on
        clock.now += 30
        assert not stalls.observe("busy", 50_000, f"seq-{n}")
    for _ in range(100):  # standing still at the tip: nothing to read, not stalled
        clock.now += 30
        assert not stalls.observe("idle", 0, "seq-5")
        assert not stalls.observe("unknown", None, None)
    assert stalls.stalls == 0 and stalls.stalled == []


def test_a_stalled_shard_that_catches_up_leaves_the_list_and_retain_forgets_shards():
    clock = Clock()
    stalls = watch(clock, lag_ms=0, time_ms=1000)
    stalls.observe("a", 10, 1)
    stalls.observe("b", 10, 1)
    clock.now += 1
    assert stalls.observe("a", 10, 1) and stalls.observe("b", 10, 1)
    stalls.observe("a", 0, 1)  # at the tip now (its lag was stale): not stalled any more
    assert stalls.stalled == ["b"]
    stalls.retain(["a"])  # b's lease went elsewhere
    assert stalls.stalled == [] and stalls.stalls == 2


def test_the_settings_come_from_the_config_and_every_front_end():
    from kinesis_dstream.multilang.property_keys import PROPERTIES
    from kinesis_dstream.sql.options import parse_source_options

    config = ConsumerConfig(application_name="a", stream_name="s", region_name="us-east-1")
    assert (config.stalled_shard_lag_ms, config.stalled_shard_time_ms) == (60_000, 300_000)
    stalls = StallWatch.of(config.replace(stalled_shard_lag_ms=5, stalled_shard_time_ms=7))
    assert (stalls.lag_threshold_ms, stalls.stall_time_ms) == (5, 7)
    conf = config.with_spark_conf({"spark.streaming.kinesis.stalledShardLag": "2s",
                                   "spark.streaming.kinesis.stalledShardTime": "1min"})
    assert (conf.stalled_shard_lag_ms, conf.stalled_shard_time_ms) == (2000, 60_000)
    read = PROPERTIES.read({"stalledShardLagMillis": "1500", "stalledShardTimeMillis": "PT2M"},
                           source="test").of("config")
    assert read == {"stalled_shard_lag_ms": 1500, "stalled_shard_time_ms": 120_000}
    sql = parse_source_options({"kinesis.streamName": "s", "kinesis.region": "us-east-1",
                                "kinesis.stalledShardTime": "30s"}).config
    assert sql.stalled_shard_time_ms == 30_000


def test_largest_lag_and_the_view_keep_the_per_shard_shape():
    assert largest_lag([None, 3, 10, None]) == 10 and largest_lag([None]) is None
    view = ShardsView({"s1": {"records": 1}}, 10, ["s1"], 1)
    assert dict(view) == {"s1": {"records": 1}} and list(view.values()) == [{"records": 1}]
    assert (view.millis_behind_latest, view.stalled_shards, view.stalls) == (10, ["s1"], 1)


def test_the_sql_progress_reports_the_largest_lag_and_the_stalled_shards():
    from kinesis_dstream.sql.driver_state import DriverState
    from kinesis_dstream.sql.options import parse_source_options
    from kinesis_dstream.sql.reader import KinesisStreamReader

    options = parse_source_options({"kinesis.streamName": "s", "kinesis.region": "us-east-1"})
    reader = KinesisStreamReader(options)
    assert reader.reportLatestOffset() is None
    reader._driver = driver = DriverState(options.config)
    try:
        clock = Clock()
        driver.stalls = watch(clock)
        driver.lag = {"shardId-1": 300, "shardId-2": 90_000, "shardId-3": None}
        driver.stalls.observe("shardId-2", 90_000, "p")
        clock.now += 60
        driver.stalls.observe("shardId-2", 90_000, "p")
        assert reader.reportLatestOffset() == {
            "millisBehindLatest": {"shardId-1": 300, "shardId-2": 90_000, "shardId-3": None},
            "maxMillisBehindLatest": 90_000, "avgMsBehindLatest": 45_150.0,
            "maxMsBehindLatest": 90_000, "minMsBehindLatest": 300,
            "stalledShards": ["shardId-2"], "stalls": 1}
    finally:
        reader.stop()
