"""sql.consumer_listener: which stops deregister which consumers (no Spark: events faked).

The listener itself, on a real query stopped in Spark, is in test_sql_fanout."""
from __future__ import annotations

import json
from types import SimpleNamespace as Event
from typing import Any

import pytest

from kinesis_dstream.sql import consumer_listener
from kinesis_dstream.sql.options import parse_source_options

pytestmark = pytest.mark.unit

BASE = {"streamName": "s", "region": "us-east-1", "consumerMode": "efo",
        "requireConsumerDeregistration": "true"}


def progress(run_id: str, *ends: Any) -> Event:
    return Event(progress=Event(id="query", runId=run_id, sources=[
        Event(endOffset=json.dumps(e) if e is not None else None) for e in ends]))


@pytest.fixture
def deregistered(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    calls: list[tuple[str, str | None]] = []
    monkeypatch.setattr(consumer_listener, "deregister",
                        lambda config, name: calls.append((config.stream_name, name)))
    return calls


def listening(*options: dict[str, str]) -> consumer_listener.ConsumerDeregistration:
    listener = consumer_listener.ConsumerDeregistration(spark=None)
    listener._queries["q1"] = [consumer_listener._Source(parse_source_options(o))
                               for o in options]
    return listener


def test_a_graceful_stop_deregisters_the_consumer_named_after_the_offsets_query(deregistered):
    listener = listening(BASE)
    listener.onQueryProgress(progress("q1", {"v": 1, "query": "abc", "batch": 3, "shards": {}}))
    listener.onQueryTerminated(Event(id="query", runId="q1", exception=None))
    assert deregistered == [("s", "kinesis-dstream-sql-abc")]


def test_a_query_over_several_streams_deregisters_its_consumer_on_each(deregistered):
    listener = listening({**BASE, "streamName": "s,t"})
    listener.onQueryProgress(progress("q1", {"v": 2, "query": "abc", "batch": 3,
                                             "streams": {"s": {}, "t": {}}}))
    listener.onQueryTerminated(Event(id="query", runId="q1", exception=None))
    assert deregistered == [("s", "kinesis-dstream-sql-abc"), ("t", "kinesis-dstream-sql-abc")]


def test_a_named_consumer_needs_no_progress(deregistered):
    listening({**BASE, "consumerName": "mine"}).onQueryTerminated(
        Event(id="query", runId="q1", exception=None))
    assert deregistered == [("s", "mine")]


def test_a_failed_query_keeps_its_consumer(deregistered):
    listener = listening({**BASE, "consumerName": "mine"})
    listener.onQueryTerminated(Event(id="query", runId="q1", exception="boom"))
    assert deregistered == []


def test_other_sources_offsets_are_not_taken_for_ours():
    assert consumer_listener.query_keys(progress(
        "q1", {"0": 12}, None, {"v": 1, "query": "abc", "batch": 1, "shards": {}}
    ).progress) == ["abc"]


def test_a_consumer_another_running_query_reads_by_is_kept_until_the_last_stops(deregistered):
    shared = {**BASE, "consumerName": "shared"}
    listener = listening(shared)
    listener._queries["q2"] = [consumer_listener._Source(parse_source_options(shared))]
    listener.onQueryTerminated(Event(id="query", runId="q1", exception=None))
    assert deregistered == []  # q2 still reads by it
    listener.onQueryTerminated(Event(id="query", runId="q2", exception=None))
    assert deregistered == [("s", "shared")]


def test_nothing_of_a_query_is_kept_once_it_ended(deregistered):
    listener = listening({**BASE, "consumerName": "mine"})
    listener._queries["q2"] = list(listener._queries["q1"])
    listener.onQueryTerminated(Event(id="query", runId="q1", exception=None))
    listener.onQueryTerminated(Event(id="query", runId="q2", exception="boom"))
    listener.onQueryTerminated(Event(id="query", runId="q3", exception=None))  # none of ours
    assert listener._queries == {}


def test_a_restart_started_before_its_previous_run_is_told_ended_keeps_its_sources(
        deregistered, monkeypatch: pytest.MonkeyPatch):
    """Spark calls onQueryStarted of a restart in the query's thread at once, and may deliver
    the previous run's (failed) end from its listener bus afterwards: same query id, another
    run id. The restart's consumer is still deregistered when it stops."""
    monkeypatch.setattr(consumer_listener, "our_sources",
                        lambda jquery: [parse_source_options({**BASE, "consumerName": "mine"})])
    streams = Event(get=lambda query_id: object())
    spark = Event(_jsparkSession=Event(streams=lambda: streams))
    listener = consumer_listener.ConsumerDeregistration(spark)
    listener.onQueryStarted(Event(id="query", runId="run-2"))
    listener.onQueryTerminated(Event(id="query", runId="run-1", exception="held back"))
    assert deregistered == []
    listener.onQueryTerminated(Event(id="query", runId="run-2", exception=None))
    assert deregistered == [("s", "mine")]
