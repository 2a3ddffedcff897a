"""Runs in the driver's Python: deregisters a query's fan-out consumer when it stops.

A Python source has no hook that runs when its query stops: PySpark ends the source's
process with SIGTERM, and the ``finally`` that would call the reader's ``stop()`` is skipped
or cut short. Spark does tell its query listeners, in the driver, and says whether the query
stopped or failed: ``ConsumerDeregistration`` is such a listener, added by ``register()``.

When a query starts, the listener finds our sources in its analyzed plan (their format and
options, as the user gave them) and keeps those that are to deregister (see
``SourceOptions.deregisters_consumer``). A consumer named after the query id (the Databricks
default) is known from the offsets the query's progress reports. When the query stops
without an error (``stop()``, or ``Trigger.AvailableNow`` done), the consumers are
deregistered; a query that failed keeps its consumer, as the awslabs connector's does. A
consumer another running query of this session reads by (the same name on the same
stream) is kept for it: the last of them to stop deregisters it. What the listener keeps
of a query is dropped when the query ends, however it ends.

A query is known by its run id: a restarted query keeps its id, and Spark tells the restart's
start (synchronously, in the query's thread) before it may tell the previous run's end (on its
listener bus), which must not take the restart's sources with it.

``listen()`` adds it to the session through ``QueryEvents``, not ``spark.streams.addListener``:
PySpark turns every progress event of every query into Python objects field by field over
py4j, a median 0.24 s of the driver's time per event on 2 quiet cores, 0.66 s on busy ones
(``bench/bench_query_listener.py``). Behind a 1 s trigger the events queue up on Spark's
listener bus, and a stop is told, and its consumer deregistered, that much later.
``QueryEvents`` reads a progress as its JSON, in one call (1.5 ms).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from ..aws.kinesis import KinesisClient
from ..aws.stream_consumer import consumer_arn_named, deregister_stream_consumer
from ..config import ConsumerConfig
from ..errors import KinesisDStreamError
from .options import SourceOptions, parse_source_options

log = logging.getLogger(__name__)

FORMATS = ("aws-kinesis", "kinesis")


@dataclass
class _Source:
    options: SourceOptions
    query_key: str | None = None  # the id our offsets carry, for a consumer named after it

    @property
    def consumer_name(self) -> str | None:
        if self.options.consumer_name is None and self.query_key is None:
            return None
        return self.options.consumer_name_for(self.query_key or "")


def our_sources(jquery: Any) -> list[SourceOptions]:
    """The options of the query's ``aws-kinesis`` / ``kinesis`` sources that read by fan-out
    and deregister on stop, from the JVM query's analyzed plan (its ``StreamingRelationV2``
    leaves keep the format name and the options as given)."""
    found = []
    leaves = jquery.streamingQuery().analyzedPlan().collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        if not leaf.getClass().getName().endswith("StreamingRelationV2") or \
                str(leaf.sourceName()) not in FORMATS:
            continue
        given = {str(k): str(v) for k, v in leaf.extraOptions().asCaseSensitiveMap().items()}
        options = parse_source_options(given)
        if options.fan_out and options.deregisters_consumer:
            found.append(options)
    return found


def query_keys(progress: Any) -> list[str]:
    """The query ids our offsets carry, in the order of the progress' sources (an end offset
    as its JSON text, or parsed as a progress' JSON has it)."""
    keys = []
    for source in progress.sources:
        offset = source.endOffset
        try:
            if offset is None or isinstance(offset, str):
                offset = json.loads(offset or "null")
        except (TypeError, ValueError):
            continue
        if isinstance(offset, dict) and "query" in offset and \
                ("shards" in offset or "streams" in offset):  # one stream, or several
            keys.append(str(offset["query"]))
    return keys


class ConsumerDeregistration(StreamingQueryListener):
    """Deregisters the fan-out consumers of our sources when their query stops gracefully."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self._queries: dict[str, list[_Source]] = {}

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - PySpark's name
        try:
            jquery = self._spark._jsparkSession.streams().get(str(event.id))
            sources = our_sources(jquery) if jquery is not None else []
        except Exception:  # noqa: BLE001 - a listener must not fail the query's events
            log.warning("could not read the sources of query %s; its fan-out consumer will "
                        "not be deregistered on stop()", event.id, exc_info=True)
            return
        if sources:
            self._queries[str(event.runId)] = [_Source(o) for o in sources]

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 - PySpark's name
        sources = self._queries.get(str(event.progress.runId))
        if not sources:
            return
        keys = query_keys(event.progress)
        unnamed = [s for s in sources if s.options.consumer_name is None]
        for source, key in zip(unnamed, keys, strict=False):  # a query not started yet: no key
            source.query_key = key

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802 - PySpark's name
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 - PySpark's name
        sources = self._queries.pop(str(event.runId), [])
        if event.exception is not None:
            if sources:
                log.info("query %s failed: its fan-out consumers are kept", event.id)
            return
        in_use = {(stream, other.consumer_name) for others in self._queries.values()
                  for other in others for stream in other.options.stream_configs}
        for source in sources:
            for stream, config in source.options.stream_configs.items():  # registered on each
                if (stream, source.consumer_name) in in_use and source.consumer_name:
                    log.info("aws-kinesis: fan-out consumer %s of stream %s is kept: another "
                             "running query reads by it", source.consumer_name, stream)
                    continue
                deregister(config, source.consumer_name)


def deregister(config: ConsumerConfig, name: str | None) -> bool:
    """Deregister the consumer ``name`` of the config's stream (logged); False if it was not
    found or could not be deregistered."""
    stream = config.stream_name
    if name is None:
        log.warning("aws-kinesis: the query on stream %s stopped before its first batch "
                    "completed; its fan-out consumer (named after the query id) is kept",
                    stream)
        return False
    try:
        kinesis = KinesisClient(config)
        arn = consumer_arn_named(kinesis, name)
        if arn is None or not deregister_stream_consumer(kinesis, arn):
            return False
    except KinesisDStreamError as exc:
        log.warning("aws-kinesis: could not deregister fan-out consumer %s of stream %s: %s",
                    name, stream, exc)
        return False
    log.info("aws-kinesis: deregistered fan-out consumer %s of stream %s as the query stopped",
             name, stream)
    return True


# -- what Spark tells, as the listener reads it ------------------------------------------------
@dataclass(frozen=True)
class QueryStarted:
    id: str
    runId: str  # noqa: N815 - PySpark's name


@dataclass(frozen=True)
class SourceProgress:
    endOffset: Any  # noqa: N815 - PySpark's name; parsed JSON, or the text if not JSON


@dataclass(frozen=True)
class QueryProgress:
    runId: str  # noqa: N815 - PySpark's name
    sources: list[SourceProgress] = field(default_factory=list)

    @classmethod
    def from_json(cls, text: str) -> QueryProgress:
        progress = json.loads(text)
        return cls(str(progress.get("runId")),
                   [SourceProgress(s.get("endOffset")) for s in progress.get("sources") or []])


@dataclass(frozen=True)
class QueryProgressed:
    progress: QueryProgress


@dataclass(frozen=True)
class QueryTerminated:
    id: str
    runId: str  # noqa: N815 - PySpark's name
    exception: str | None


class QueryEvents:
    """The JVM side's ``PythonStreamingQueryListener``: hands the listener each event with
    only what it reads, in a few py4j calls (a progress in one, as JSON)."""

    def __init__(self, listener: ConsumerDeregistration) -> None:
        self._listener = listener

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - Spark's name
        self._listener.onQueryStarted(QueryStarted(str(jevent.id().toString()),
                                                   str(jevent.runId().toString())))

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802 - Spark's name
        try:
            progress = QueryProgress.from_json(str(jevent.progress().json()))
        except (TypeError, ValueError, AttributeError):
            log.warning("a query progress that is not JSON was ignored", exc_info=True)
            return
        self._listener.onQueryProgress(QueryProgressed(progress))

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802 - Spark's name
        pass

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802 - Spark's name
        failed = jevent.exception()
        self._listener.onQueryTerminated(QueryTerminated(
            str(jevent.id().toString()), str(jevent.runId().toString()),
            str(failed.get()) if failed.isDefined() else None))

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def add_java_listener(spark: Any, java_side: Any) -> Any:
    """Add ``java_side`` (an object implementing Spark's ``PythonStreamingQueryListener``,
    given each event as the JVM's object) to ``spark``'s query listeners, as
    ``spark.streams.addListener`` does without PySpark's conversion of each event. Returns
    the JVM's listener, for ``removeListener``."""
    from py4j.java_gateway import java_import
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    java_import(gateway.jvm, "org.apache.spark.sql.streaming.*")
    ensure_callback_server_started(gateway)
    wrapper = gateway.jvm.PythonStreamingQueryListenerWrapper(java_side)
    spark._jsparkSession.streams().addListener(wrapper)
    return wrapper


def listen(spark: Any) -> ConsumerDeregistration:
    """Add a ``ConsumerDeregistration`` to ``spark``'s query listeners, through
    ``QueryEvents``."""
    listener = ConsumerDeregistration(spark)
    add_java_listener(spark, QueryEvents(listener))
    return listener
