"""What the SQL source does without register(spark), decided in its own processes (no Spark).

sql.source_stop: which ends of the source's driver-side process deregister which fan-out
consumers. sql.executor_guard: what a worker without the package is told as it unpickles
our objects. On a real query: tests/test_sql_no_register.py.
"""
from __future__ import annotations

import signal
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark import cloudpickle

from kinesis_dstream.aws import stream_consumer
from kinesis_dstream.sql import executor_guard, source_stop
from kinesis_dstream.sql.datasource import KinesisDataSource
from kinesis_dstream.sql.options import parse_source_options
from kinesis_dstream.sql.reader import KinesisStreamReader

pytestmark = pytest.mark.unit

AWSLABS = {"kinesis.streamName": "s", "kinesis.region": "us-east-1",
           "kinesis.consumerType": "SubscribeToShard", "kinesis.consumerName": "mine"}
DATABRICKS = {"streamName": "s", "region": "us-east-1", "consumerMode": "efo",
              "consumerName": "theirs"}


class FakeDriver:
    """The reader's driver state as far as stop() uses it."""

    def __init__(self) -> None:
        self.consumers = {"s": ("mine", "arn:consumer/mine")}
        self.stopped = False

    def kinesis_of(self, stream: str) -> str:
        return f"client of {stream}"

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def deregistered(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, str]]:
    calls: list[tuple[Any, str]] = []
    # reader.py imports it where a stop deregisters (stream_consumer's, looked up then)
    monkeypatch.setattr(stream_consumer, "deregister_stream_consumer",
                        lambda kinesis, arn: calls.append((kinesis, arn)) or True)
    return calls


def stopped(options: dict[str, str], monkeypatch: pytest.MonkeyPatch, *, by_spark: bool,
            listener: bool = False) -> FakeDriver:
    monkeypatch.setattr(source_stop, "_stopped_by_spark", by_spark)
    monkeypatch.setenv(source_stop.LISTENER_ENV, "1" if listener else "0")
    source = KinesisStreamReader(parse_source_options(options))
    driver = source._driver = FakeDriver()  # type: ignore[assignment]
    source.stop()
    assert driver.stopped and source._driver is None
    return driver


def test_a_stop_by_spark_deregisters_the_awslabs_consumer(deregistered, monkeypatch):
    stopped(AWSLABS, monkeypatch, by_spark=True)
    assert deregistered == [("client of s", "arn:consumer/mine")]


def test_the_source_failing_by_itself_keeps_its_consumer(deregistered, monkeypatch):
    stopped(AWSLABS, monkeypatch, by_spark=False)
    assert deregistered == []


def test_the_driver_listener_of_register_decides_instead(deregistered, monkeypatch):
    stopped(AWSLABS, monkeypatch, by_spark=True, listener=True)
    assert deregistered == []


def test_databricks_names_keep_the_consumer_unless_deregistration_is_required(
        deregistered, monkeypatch):
    stopped(DATABRICKS, monkeypatch, by_spark=True)
    assert deregistered == []
    stopped({**DATABRICKS, "requireConsumerDeregistration": "true"}, monkeypatch, by_spark=True)
    assert deregistered == [("client of s", "arn:consumer/mine")]
    stopped({**AWSLABS, "requireConsumerDeregistration": "false"}, monkeypatch, by_spark=True)
    assert len(deregistered) == 1


def test_spark_s_sigterm_unwinds_the_main_thread_once(monkeypatch):
    handlers: list[Any] = []
    monkeypatch.setattr(signal, "signal", lambda signum, handler: handlers.append(handler))
    monkeypatch.setattr(source_stop, "_stopped_by_spark", False)
    with pytest.raises(SourceStoppedType):
        source_stop._on_sigterm(signal.SIGTERM, None)
    # a second is noted only
    assert source_stop.stopped_by_spark() and handlers == [source_stop._note_sigterm]


SourceStoppedType = source_stop.SourceStopped

def test_no_handler_outside_the_source_process(monkeypatch):
    """pytest (or a user's driver) is not PySpark's source runner: its SIGTERM stays."""
    before = signal.getsignal(signal.SIGTERM)
    assert not source_stop.in_source_process()
    assert source_stop.install(1, lambda: None) is False
    assert signal.getsignal(signal.SIGTERM) is before and 1 not in source_stop._on_exit


def test_the_source_process_is_told_apart_by_its_main_module(monkeypatch):
    main = SimpleNamespace(__spec__=SimpleNamespace(name=source_stop.SOURCE_RUNNER))
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert source_stop.in_source_process()


# -- executor_guard ----------------------------------------------------------------------------
def test_the_source_and_its_reader_survive_pickling_through_the_guard():
    source = KinesisDataSource({"kinesis.streamName": "s", "kinesis.region": "us-east-1"})
    stream_reader = source.streamReader(source.schema())
    stream_reader._driver = FakeDriver()  # type: ignore[assignment]
    copy, reader_copy = cloudpickle.loads(cloudpickle.dumps((source, stream_reader)))
    assert type(copy) is KinesisDataSource and dict(copy.options) == dict(source.options)
    assert type(reader_copy) is KinesisStreamReader and reader_copy._driver is None
    assert reader_copy.options == stream_reader.options


def test_a_worker_that_cannot_import_a_module_is_told_its_interpreter_and_the_fix():
    source = KinesisDataSource({"kinesis.streamName": "s"})
    reduced = executor_guard.guarded_reduce(source, dict(source.__dict__), "the reads")
    assert reduced is not None
    rebuild, args = reduced
    # by value: no worker has to import the module it was compiled in
    assert rebuild.__module__ not in sys.modules
    with pytest.raises(Exception) as raised:
        rebuild(("kinesis_dstream_no_such_module",), *args[1:])
    assert type(raised.value).__name__ == "ExecutorEnvironmentError"
    message = str(raised.value)
    assert f"run {sys.executable}" in message
    assert "cannot import kinesis_dstream_no_such_module" in message
    assert "the reads run there" in message and "spark.sql.execution.pyspark.python" in message


class Elsewhere(KinesisDataSource):
    """A subclass in a module the workers may not import (a test's, a user's)."""


def test_a_subclass_defined_elsewhere_pickles_as_python_would():
    source = Elsewhere({"kinesis.streamName": "s"})
    assert executor_guard.guarded_reduce(source, {}, "the reads") is None
    assert type(cloudpickle.loads(cloudpickle.dumps(source))) is Elsewhere
