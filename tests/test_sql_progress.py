"""What the SQL source shows in the query progress (``sql.progress``), on its own: Databricks'
lag metrics, what the last reading cost, and the range item that carries the costs from the
tasks to the driver; and the small first reading. No Spark, no emulator (test_sql_source
checks both in a real query)."""
from __future__ import annotations

import pytest

from kinesis_dstream.aws.range_table import BatchRange, _item, _range
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.sql.progress import lag_metrics, progress_report, reading_metrics

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def a_range(shard: str, records: int, **costs: float) -> BatchRange:
    return BatchRange("sql/s/q", shard, 3, ESN("1"), end=ESN("9") if records else None,
                      records=records, **costs)


def test_lag_metrics_take_databricks_names_over_the_shards_whose_lag_is_known():
    assert lag_metrics({"a": 100, "b": 400, "c": None}) == {
        "avgMsBehindLatest": 250.0, "maxMsBehindLatest": 400, "minMsBehindLatest": 100}
    assert lag_metrics({"a": None}) == {} and lag_metrics({}) == {}


def test_a_reading_reports_its_records_and_its_slowest_shard_read_wait_and_convert():
    ranges = {"a": a_range("a", 10, read_ms=120.0, wait_ms=0.0, convert_ms=4.5),
              "b": a_range("b", 5, read_ms=80.0, wait_ms=1000.0, convert_ms=9.25),
              "c": None,  # read nothing, recorded nothing
              "d": a_range("d", 0)}  # recorded by a version that kept no costs
    assert reading_metrics(3, ranges) == {"reading": 3, "shards": 3, "records": 15,
                                          "readMs": 120.0, "waitMs": 1000.0,
                                          "convertMs": 9.2}
    assert reading_metrics(4, {"d": a_range("d", 2)})["readMs"] is None


def test_the_progress_report_carries_lag_and_the_last_reading():
    last = {"reading": 2, "shards": 1, "records": 7, "readMs": 5.0, "waitMs": 0.0,
            "convertMs": 1.0}
    report = progress_report({"b": 20, "a": 10}, [], 0, last)
    assert report == {"millisBehindLatest": {"a": 10, "b": 20}, "maxMillisBehindLatest": 20,
                      "avgMsBehindLatest": 15.0, "maxMsBehindLatest": 20,
                      "minMsBehindLatest": 10, "stalledShards": [], "stalls": 0,
                      "lastReading": last}
    assert progress_report({}, [], 0, None) is None


def test_a_range_item_carries_the_read_costs_and_an_old_item_has_none():
    costly = a_range("a", 10, read_ms=120.04, wait_ms=1000.0, convert_ms=4.56)
    back = _range(_item(costly))
    assert (back.read_ms, back.wait_ms, back.convert_ms) == (120.0, 1000.0, 4.6)
    plain = _range(_item(a_range("a", 10)))
    assert (plain.read_ms, plain.wait_ms, plain.convert_ms) == (None, None, None)
    assert "readMs" not in _item(a_range("a", 10))


def test_the_first_reading_a_reader_plans_is_small_and_the_next_ones_are_not(monkeypatch):
    """A query started on a backlog shows rows within seconds: its first reading reads one
    small page a shard, not a 10 MB one (converted and handed to Spark before any row)."""
    from kinesis_dstream.sql.driver_state import DriverState
    from kinesis_dstream.sql.offsets import make_offset
    from kinesis_dstream.sql.options import parse_source_options
    from kinesis_dstream.sql.prober import Probe
    from kinesis_dstream.sql.reader import FIRST_READING_MAX_RECORDS, KinesisStreamReader

    options = parse_source_options({"kinesis.streamName": "s", "kinesis.region": "us-east-1"})
    reader = KinesisStreamReader(options)
    reader._driver = driver = DriverState(options.config)
    try:
        monkeypatch.setattr(reader, "_shards", lambda force=False: None)
        monkeypatch.setattr(reader.driver, "recorded_ranges", lambda query, batch, keys: {})
        monkeypatch.setattr(driver.prober, "probed",
                            lambda shards, target: {s: Probe(True, 5) for s in shards})
        start = make_offset("q", 0, 100_000, {"shardId-0": {"at": "TRIM_HORIZON"},
                                              "shardId-1": {"at": "TRIM_HORIZON"}})
        assert reader.latestOffset(start, None)["limit"] == FIRST_READING_MAX_RECORDS < 100_000
        assert reader.latestOffset(start, None)["limit"] == 100_000  # kinesis.maxFetch...
    finally:
        reader.stop()
