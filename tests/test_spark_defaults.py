"""createStream's Spark-path defaults for fetching (pages and read interval) and who overrides them."""
from __future__ import annotations

from kinesis_dstream.spark.kinesis_utils import (
    SPARK_IDLE_TIME_BETWEEN_READS_MS,
    SPARK_MAX_RECORDS,
    _build_config,
)

SETTINGS = dict(application_name="app-defaults", stream_name="stream-defaults",
                region_name="us-east-1", initial_position="TRIM_HORIZON")


def test_without_a_properties_file_pages_are_smaller_than_the_kcls():
    config = _build_config(dict(SETTINGS), None, None)
    assert config.max_records == SPARK_MAX_RECORDS == 5000
    assert config.idle_time_between_reads_ms == SPARK_IDLE_TIME_BETWEEN_READS_MS


def test_config_overrides_win_over_the_spark_defaults():
    config = _build_config(dict(SETTINGS), None, {"max_records": 10_000})
    assert config.max_records == 10_000


def test_a_properties_file_keeps_its_own_max_records(tmp_path):
    path = tmp_path / "app.properties"
    path.write_text("streamName = stream-defaults\napplicationName = app-defaults\n"
                    "regionName = us-east-1\nmaxRecords = 7000\n")
    assert _build_config(dict(SETTINGS), str(path), None).max_records == 7000
    path.write_text("streamName = stream-defaults\napplicationName = app-defaults\n"
                    "regionName = us-east-1\n")
    assert _build_config(dict(SETTINGS), str(path), None).max_records == 10_000  # the KCL's
