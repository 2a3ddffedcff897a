"""One grammar of position text: the SQL options, ``leases reset --to`` and the properties
files read a position, and a time, the same way."""
from __future__ import annotations

import datetime as dt
import time

import pytest

from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.multilang.property_keys import _timestamp
from kinesis_dstream.operations.connection import BadInput
from kinesis_dstream.operations.positions import parse_position
from kinesis_dstream.position_text import TimeTextError, iso_time, parse_position_text
from kinesis_dstream.sql.starting_position import parse_starting_position

pytestmark = pytest.mark.unit

UTC_18 = dt.datetime(2026, 11, 25, 18, 0, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("text", [
    "AT_TIMESTAMP 2026-11-25T18:00:00Z", "AT_TIMESTAMP:2026-11-25T18:00:00Z",
    "at_timestamp  2026-11-25T18:00:00", "AT_TIMESTAMP:2026-11-25T19:00:00+01:00",
    "AT_TIMESTAMP 2026-11-25T18:00:00z"])
def test_a_time_reads_the_same_in_the_sql_options_and_on_the_command_line(text):
    assert parse_position(text).timestamp == UTC_18
    sql = parse_starting_position(text, "kinesis.startingPosition")
    assert (sql.type, sql.timestamp) == ("AT_TIMESTAMP", UTC_18.timestamp())


@pytest.mark.parametrize(("text", "kind"), [
    ("trim_horizon", "TRIM_HORIZON"), ("EARLIEST", "TRIM_HORIZON"), ("Latest", "LATEST")])
def test_words_read_the_same_everywhere(text, kind):
    assert parse_position(text).kind == kind
    assert parse_starting_position(text, "startingPosition").type == kind


def test_a_sequence_number_is_a_checkpoint_not_a_query_start():
    assert str(parse_position("4959/7").position) == "4959/7"
    assert parse_position_text("4959", sequences=True).kind == "SEQUENCE"
    with pytest.raises(ValueError, match="is not a position"):
        parse_position_text("4959", sequences=False)
    with pytest.raises(ConfigurationError, match="startingPosition: expected latest"):
        parse_starting_position("4959", "startingPosition")


def test_an_unreadable_time_is_named_as_a_time_everywhere():
    with pytest.raises(TimeTextError, match="'yesterday' is not an ISO 8601 time"):
        parse_position_text("AT_TIMESTAMP yesterday", sequences=False)
    with pytest.raises(BadInput, match="--to: 'yesterday' is not an ISO 8601 time"):
        parse_position("AT_TIMESTAMP:yesterday")
    with pytest.raises(ConfigurationError,
                       match="initialPosition: 'yesterday' is not an ISO 8601 time"):
        parse_starting_position("AT_TIMESTAMP yesterday", "initialPosition")


def test_a_time_without_a_zone_is_utc_in_the_properties_files_too(monkeypatch):
    monkeypatch.setenv("TZ", "America/Los_Angeles")  # not the machine's zone, nor UTC
    time.tzset()
    try:
        _check_properties_times()
    finally:
        monkeypatch.undo()
        time.tzset()


def _check_properties_times() -> None:
    assert iso_time("2026-11-25T18:00:00") == UTC_18
    assert _timestamp("initialPositionInStreamExtended", "2026-11-25T18:00:00") == \
        UTC_18.timestamp()
    assert _timestamp("timestamp", "1764093600") == 1764093600.0
