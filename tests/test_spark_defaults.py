"""createStream's settings: a properties file < createStream's arguments < configOverrides."""
from __future__ import annotations

import pytest

from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.spark.kinesis_utils import _build_config

pytestmark = pytest.mark.unit

SETTINGS = dict(application_name="app-defaults", stream_name="stream-defaults",
                region_name="us-east-1", initial_position="TRIM_HORIZON")


def test_pages_are_the_kcls_and_overrides_win():
    assert _build_config(dict(SETTINGS), None, None).max_records == 10_000
    assert _build_config(dict(SETTINGS), None, {"max_records": 2_000}).max_records == 2_000


def test_an_unknown_override_is_refused_by_name():
    with pytest.raises(ConfigurationError, match="max_recrods"):
        _build_config(dict(SETTINGS), None, {"max_recrods": 2_000})


def test_a_properties_file_keeps_its_own_max_records(tmp_path):
    path = tmp_path / "app.properties"
    path.write_text("streamName = stream-defaults\napplicationName = app-defaults\n"
                    "regionName = us-east-1\nmaxRecords = 7000\nfailoverTimeMillis = 4000\n")
    config = _build_config(dict(SETTINGS), str(path), {"failover_time_ms": 5000})
    assert (config.max_records, config.failover_time_ms) == (7000, 5000)
