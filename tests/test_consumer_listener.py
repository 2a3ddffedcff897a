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


# -- QueryEvents: Spark's JVM events, read in a few calls ---------------------------------------
class JavaUUID:
    def __init__(self, text: str) -> None:
        self._text = text

    def toString(self) -> str:  # noqa: N802 - Java's name
        return self._text


class JavaOption:
    def __init__(self, value: str | None) -> None:
        self._value = value

    def isDefined(self) -> bool:  # noqa: N802 - Scala's name
        return self._value is not None

    def get(self) -> str:
        assert self._value is not None, "Option.get on None"
        return self._value


def jevent(run_id: str, *, progress_json: str | None = None, failure: str | None = None) -> Any:
    """A Spark listener event as py4j hands it over: methods, no fields."""
    return Event(id=lambda: JavaUUID("query"), runId=lambda: JavaUUID(run_id),
                 progress=lambda: Event(json=lambda: progress_json),
                 exception=lambda: JavaOption(failure))


def progress_json(run_id: str, *ends: Any) -> str:
    """A progress' JSON as Spark writes it: an end offset that is JSON is embedded parsed."""
    return json.dumps({"id": "query", "runId": run_id, "batchId": 3, "numInputRows": 0,
                       "durationMs": {"triggerExecution": 4},
                       "sources": [{"description": "d", "endOffset": e} for e in ends],
                       "sink": {"description": "noop"}})


def test_query_events_carry_a_progress_key_to_the_deregistration(deregistered):
    listener = listening(BASE)
    events = consumer_listener.QueryEvents(listener)
    events.onQueryProgress(jevent("q1", progress_json=progress_json(
        "q1", 12, "not json", {"v": 1, "query": "abc", "batch": 3, "shards": {}})))
    events.onQueryTerminated(jevent("q1"))
    assert deregistered == [("s", "kinesis-dstream-sql-abc")]
    assert listener._queries == {}


def test_query_events_pass_a_failure_on_and_the_consumer_is_kept(deregistered):
    listener = listening({**BASE, "consumerName": "mine"})
    consumer_listener.QueryEvents(listener).onQueryTerminated(jevent("q1", failure="boom"))
    assert deregistered == []


def test_query_events_skip_a_progress_that_is_not_json(deregistered):
    listener = listening(BASE)
    events = consumer_listener.QueryEvents(listener)
    events.onQueryProgress(jevent("q1", progress_json="{not json"))
    events.onQueryTerminated(jevent("q1"))
    assert deregistered == [("s", None)]  # no key learnt: deregister() logs it is kept


def test_query_events_start_tracks_the_run(deregistered, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(consumer_listener, "our_sources",
                        lambda jquery: [parse_source_options({**BASE, "consumerName": "mine"})])
    streams = Event(get=lambda query_id: object())
    listener = consumer_listener.ConsumerDeregistration(
        Event(_jsparkSession=Event(streams=lambda: streams)))
    events = consumer_listener.QueryEvents(listener)
    events.onQueryStarted(jevent("run-1"))
    assert list(listener._queries) == ["run-1"]
    events.onQueryTerminated(jevent("run-1"))
    assert deregistered == [("s", "mine")]
