"""CloudWatch metrics: buffering (stub client) and a worker run publishing to moto's CloudWatch."""
from __future__ import annotations

import logging
import threading
import time

import pytest

import emulators

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.worker import metrics as m
from kinesis_dstream.worker.metrics import MetricsPublisher
from kinesis_dstream.worker.processor import RecordProcessor
from kinesis_dstream.worker.scheduler import Scheduler


class StubCloudWatch:
    def __init__(self, fail: BaseException | None = None):
        self.calls: list[dict] = []
        self.fail = fail

    def put_metric_data(self, **kwargs):
        self.calls.append(kwargs)
        if self.fail is not None:
            raise self.fail


def config(level: str = "DETAILED", **overrides) -> ConsumerConfig:
    return ConsumerConfig(application_name="metrics-app", stream_name="s", region_name="us-east-1",
                          metrics_level=level, **overrides)


def publisher(level: str, client) -> MetricsPublisher:
    # An hour between background flushes: the test flushes by hand.
    return MetricsPublisher(config(level), client, flush_interval_s=3600)


def dims(datum: dict) -> dict[str, str]:
    return {d["Name"]: d["Value"] for d in datum["Dimensions"]}


@pytest.mark.unit
def test_values_are_aggregated_into_statistic_sets_not_one_call_per_record():
    client = StubCloudWatch()
    pub = publisher("DETAILED", client)
    for n in range(5000):
        pub.record(m.RECORDS_PROCESSED, n % 10, operation=m.PROCESS_TASK,
                   shard_id=f"shardId-00{n % 2}")
    assert client.calls == []          # nothing is sent while recording
    pub.flush()
    assert len(client.calls) == 1
    call = client.calls[0]
    assert call["Namespace"] == "metrics-app"
    by_dims = {tuple(sorted(dims(d).items())): d for d in call["MetricData"]}
    assert set(by_dims) == {(("Operation", "ProcessTask"),),
                            (("Operation", "ProcessTask"), ("ShardId", "shardId-000")),
                            (("Operation", "ProcessTask"), ("ShardId", "shardId-001"))}
    summary = by_dims[(("Operation", "ProcessTask"),)]["StatisticValues"]
    assert summary == {"SampleCount": 5000.0, "Sum": float(sum(n % 10 for n in range(5000))),
                       "Minimum": 0.0, "Maximum": 9.0}
    pub.flush()                         # nothing new: no call
    assert len(client.calls) == 1
    pub.close()


@pytest.mark.unit
def test_many_series_are_split_into_calls_of_at_most_1000_datums():
    client = StubCloudWatch()
    pub = publisher("DETAILED", client)
    for shard in range(1200):           # 1200 shard series + 1 operation series
        pub.record(m.MILLIS_BEHIND_LATEST, 5, operation=m.PROCESS_TASK, shard_id=f"s{shard}",
                   unit=m.MILLISECONDS)
    pub.flush()
    assert [len(c["MetricData"]) for c in client.calls] == [1000, 201]
    pub.close()


@pytest.mark.unit
def test_summary_drops_the_shard_dimension_and_the_detailed_metrics():
    client = StubCloudWatch()
    pub = publisher("SUMMARY", client)
    pub.record(m.RECORDS_PROCESSED, 3, operation=m.PROCESS_TASK, shard_id="shardId-000")
    m.ShardMetricsRecorder(pub, "shardId-000").get_records(True, 12.0)   # DETAILED in the KCL
    pub.flush()
    assert [(d["MetricName"], dims(d)) for d in client.calls[0]["MetricData"]] == \
        [(m.RECORDS_PROCESSED, {"Operation": "ProcessTask"})]
    pub.close()


@pytest.mark.unit
def test_none_records_nothing_and_makes_no_client(monkeypatch):
    import kinesis_dstream.aws.clients as clients

    made: list[tuple] = []
    monkeypatch.setattr(clients, "make_client",
                        lambda *args, **_k: made.append(args) or StubCloudWatch())
    publishers = {t for t in threading.enumerate() if t.name == "metrics-publisher"}
    pub = MetricsPublisher(config("NONE"))
    pub.record(m.RECORDS_PROCESSED, 1, operation=m.PROCESS_TASK)
    pub.flush()
    assert made == []  # no CloudWatch client
    assert {t for t in threading.enumerate() if t.name == "metrics-publisher"} == publishers
    pub.close()
    client = StubCloudWatch()  # given one anyway, NONE sends it nothing, now or at close
    pub = MetricsPublisher(config("NONE"), client, flush_interval_s=0.01)
    for n in range(3):
        pub.record(m.RECORDS_PROCESSED, n, operation=m.PROCESS_TASK, shard_id="shardId-000")
        m.ShardMetricsRecorder(pub, "shardId-000").get_records(True, 12.0)
    pub.flush()
    pub.close()
    assert client.calls == []


@pytest.mark.unit
def test_failures_are_logged_boundedly_and_never_raise(caplog):
    client = StubCloudWatch(fail=RuntimeError("endpoint down"))
    pub = publisher("SUMMARY", client)
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.worker.metrics"):
        for _ in range(50):
            pub.record(m.RECORDS_PROCESSED, 1, operation=m.PROCESS_TASK)
            pub.flush()
    assert len(client.calls) == 50
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    assert "endpoint down" in caplog.records[0].getMessage()
    pub.close()


@pytest.mark.unit
def test_the_background_thread_publishes_and_close_flushes_the_rest():
    client = StubCloudWatch()
    published = threading.Event()
    original = client.put_metric_data

    def put(**kwargs):
        original(**kwargs)
        published.set()

    client.put_metric_data = put
    pub = MetricsPublisher(config("SUMMARY"), client, flush_interval_s=0.05)
    pub.record(m.RECORDS_PROCESSED, 1, operation=m.PROCESS_TASK)
    assert published.wait(10)
    pub.record(m.RECORDS_PROCESSED, 7, operation=m.PROCESS_TASK)
    pub.close()
    sums = [d["StatisticValues"]["Sum"] for c in client.calls for d in c["MetricData"]]
    assert sum(sums) == 8


class Quiet(RecordProcessor):
    def process_records(self, process_records_input):
        process_records_input.checkpointer.checkpoint()


def listed(cloudwatch, namespace: str) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for page in cloudwatch.get_paginator("list_metrics").paginate(Namespace=namespace):
        for metric in page["Metrics"]:
            out.setdefault(metric["MetricName"], []).append(
                {d["Name"]: d["Value"] for d in metric["Dimensions"]})
    return out


def run_worker(make_config, stream: str, level: str, dynamodb: str, wait) -> None:
    config = make_config(stream, metrics_level=level, cloudwatch_endpoint=dynamodb,
                         metrics_buffer_time_ms=200)
    scheduler = Scheduler(config, lambda shard_id: Quiet())
    scheduler.start()
    try:
        wait(scheduler)
    finally:
        scheduler.shutdown()


def _processed_everything(total: int):
    def wait(scheduler: Scheduler) -> None:
        deadline = time.monotonic() + 60
        while sum(s.records for s in scheduler.metrics().values()) < total:
            assert time.monotonic() < deadline, "the worker did not read every record"
            time.sleep(0.1)
    return wait


@pytest.mark.emulator
@pytest.mark.timeout(120)
def test_a_worker_publishes_the_kcl_metrics_per_shard_and_per_operation(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, put_records, unique_app_name):
    stream = make_stream(2)
    put_records(stream, [(f"pk-{i}", f"data-{i}") for i in range(40)])
    run_worker(make_config, stream, "DETAILED", dynamodb, _processed_everything(40))
    cloudwatch = emulators.client("cloudwatch", dynamodb)
    metrics = listed(cloudwatch, unique_app_name)
    shards = {f"shardId-00000000000{i}" for i in range(2)}
    for name in (m.RECORDS_PROCESSED, m.DATA_BYTES_PROCESSED, m.MILLIS_BEHIND_LATEST,
                 m.GET_RECORDS_SUCCESS, m.GET_RECORDS_TIME):
        assert {"Operation": "ProcessTask"} in metrics[name], name
        assert {d["ShardId"] for d in metrics[name] if "ShardId" in d} == shards, name
        assert all(set(d) <= {"Operation", "ShardId"} for d in metrics[name])
    assert metrics[m.CURRENT_LEASES] == [{"Operation": "RenewAllLeases"}]
    assert {"Operation": "TakeLeases"} in metrics[m.TOTAL_LEASES]
    per_shard = 0.0
    for shard in shards:  # moto matches dimension supersets, so ask with both dimensions
        per_shard += sum(p["Sum"] for p in cloudwatch.get_metric_statistics(
            Namespace=unique_app_name, MetricName=m.RECORDS_PROCESSED,
            Dimensions=[{"Name": "Operation", "Value": "ProcessTask"},
                        {"Name": "ShardId", "Value": shard}],
            StartTime=time.time() - 600, EndTime=time.time() + 600, Period=60,
            Statistics=["Sum"])["Datapoints"])
    assert per_shard == 40


@pytest.mark.emulator
@pytest.mark.timeout(120)
def test_metrics_level_none_publishes_nothing(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, put_records, unique_app_name):
    stream = make_stream(1)
    put_records(stream, [(f"pk-{i}", f"data-{i}") for i in range(10)])
    run_worker(make_config, stream, "NONE", dynamodb, _processed_everything(10))
    assert listed(emulators.client("cloudwatch", dynamodb), unique_app_name) == {}


@pytest.mark.unit
@pytest.mark.parametrize("level", ["SUMMARY", "DETAILED"])
def test_millis_behind_latest_also_goes_to_the_application_series_without_a_shard(level):
    client = StubCloudWatch()
    pub = publisher(level, client)
    m.ShardMetricsRecorder(pub, "shardId-000").processed(3, 30, 1200, 5.0)
    m.ShardMetricsRecorder(pub, "shardId-001").processed(3, 30, 4500, 5.0)
    m.ShardMetricsRecorder(pub, "shardId-002").processed(3, 30, None, 5.0)
    pub.flush()
    lag = [d for d in client.calls[0]["MetricData"] if d["MetricName"] == m.MILLIS_BEHIND_LATEST]
    application = [d for d in lag if dims(d) == {"Operation": "ApplicationTracker"}]
    assert len(application) == 1 and application[0]["Unit"] == "Milliseconds"
    assert application[0]["StatisticValues"] == {"SampleCount": 2.0, "Sum": 5700.0,
                                                 "Minimum": 1200.0, "Maximum": 4500.0}
    assert all("ShardId" not in dims(d) for d in lag if "ApplicationTracker" in dims(d).values())
    pub.close()


@pytest.mark.emulator
@pytest.mark.timeout(120)
def test_the_application_lag_reaches_cloudwatch_under_the_kcl_name_without_a_shard(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, put_records, unique_app_name):
    stream = make_stream(2)
    put_records(stream, [(f"pk-{i}", f"early-{i}") for i in range(20)])
    time.sleep(1.5)  # the records put later are this much newer: reading the early ones lags
    put_records(stream, [(f"pk-{i}", f"late-{i}") for i in range(20)])
    largest: list[int | None] = []

    def wait(scheduler: Scheduler) -> None:
        _processed_everything(40)(scheduler)
        largest.append(scheduler.metrics().millis_behind_latest)

    config = make_config(stream, metrics_level="SUMMARY", cloudwatch_endpoint=dynamodb,
                         metrics_buffer_time_ms=200, max_records=2)
    scheduler = Scheduler(config, lambda shard_id: Quiet())
    scheduler.start()
    try:
        wait(scheduler)
    finally:
        scheduler.shutdown()
    cloudwatch = emulators.client("cloudwatch", dynamodb)
    series = listed(cloudwatch, unique_app_name)[m.MILLIS_BEHIND_LATEST]
    assert {"Operation": "ApplicationTracker"} in series
    assert all("ShardId" not in d for d in series)  # SUMMARY: no shard series at all

    def maximum(operation: str) -> float:
        points = cloudwatch.get_metric_statistics(
            Namespace=unique_app_name, MetricName=m.MILLIS_BEHIND_LATEST,
            Dimensions=[{"Name": "Operation", "Value": operation}],
            StartTime=time.time() - 600, EndTime=time.time() + 600, Period=60,
            Statistics=["Maximum"])["Datapoints"]
        return max(p["Maximum"] for p in points)

    assert maximum("ApplicationTracker") == maximum("ProcessTask") >= 1000
    assert largest[0] is not None  # metrics(): the largest of the shards' last lags


class Stuck(RecordProcessor):
    """Hangs in its first processRecords until released: its shard stops moving."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def process_records(self, process_records_input):
        self.release.wait(60)
        process_records_input.checkpointer.checkpoint()


@pytest.mark.emulator
@pytest.mark.timeout(120)
def test_a_worker_warns_once_about_a_stalled_shard_and_counts_it(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, put_records, caplog):
    stream = make_stream(1)
    put_records(stream, [(f"pk-{i}", f"early-{i}") for i in range(3)])
    time.sleep(1.5)
    put_records(stream, [(f"pk-{i}", f"late-{i}") for i in range(3)])
    release = threading.Event()
    config = make_config(stream, max_records=1, stalled_shard_lag_ms=500,
                         stalled_shard_time_ms=1000)
    scheduler = Scheduler(config, lambda shard_id: Stuck(release))

    def stall_warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == "kinesis_dstream.worker.stall" and r.levelno == logging.WARNING]

    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.worker.stall"):
        scheduler.start()
        try:
            deadline = time.monotonic() + 30
            while scheduler.metrics().stalls < 1:
                assert time.monotonic() < deadline, "no stall found"
                time.sleep(0.1)
            view = scheduler.metrics()
            assert view.stalled_shards == ["shardId-000000000000"] and view.stalls == 1
            assert view.millis_behind_latest is not None and view.millis_behind_latest > 500
            # Still stuck for several more stall times and scheduler passes: one warning.
            until = time.monotonic() + 3
            while time.monotonic() < until:
                assert scheduler.metrics().stalls == 1
                time.sleep(0.2)
            assert len(stall_warnings()) == 1 and "shardId-000000000000" in stall_warnings()[0]
            release.set()  # it moves: no longer stalled
            deadline = time.monotonic() + 30
            while scheduler.metrics().stalled_shards:
                assert time.monotonic() < deadline, "the shard never moved on"
                time.sleep(0.1)
        finally:
            release.set()
            scheduler.shutdown()
