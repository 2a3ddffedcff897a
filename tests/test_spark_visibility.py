"""Spark's own UI, REST API and listeners see the Kinesis input (issue 9, part 1).

Real Spark (the session's local-cluster context, UI on), kinesis-local, moto's DynamoDB.
"""
from __future__ import annotations

import json
import urllib.request
import warnings

import pytest
from pyspark.streaming.listener import StreamingListener

from spark_helpers import collected, create, make_ssc, wait_until

pytestmark = pytest.mark.spark

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)


class Batches(StreamingListener):
    def __init__(self) -> None:
        super().__init__()
        self.records: dict[int, int] = {}

    def onBatchCompleted(self, batchCompleted) -> None:
        info = batchCompleted.batchInfo()
        self.records[int(info.batchTime().milliseconds())] = int(info.numRecords())


def rest_batches(sc) -> list[dict]:
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/streaming/batches"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.load(answer)


def rest_input_size(sc) -> int:
    """The records the REST API counts; 0 while a loaded UI does not answer (asked again)."""
    try:
        return sum(b["inputSize"] for b in rest_batches(sc))
    except TimeoutError:
        return 0


@pytest.mark.matrix
def test_rest_api_and_listeners_count_the_records_processed(sc, env, make_stream, put_records,
                                                            unique_app_name):
    stream = make_stream(2)
    total = 500
    put_records(stream, [(f"pk{i}", f"r{i}") for i in range(total)])
    ssc = make_ssc(sc)
    listener = Batches()
    ssc.addStreamingListener(listener)
    rows = collected(create(ssc, unique_app_name, stream, env))
    ssc.start()
    try:
        wait_until(lambda: len(rows) >= total, 60, "every record")
        wait_until(lambda: rest_input_size(sc) >= total, 60, "the REST API to count them")
        batches = rest_batches(sc)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    processed = len(rows)
    reported = sum(b["inputSize"] for b in batches)
    assert abs(reported - processed) <= processed * 0.01, (reported, processed)
    assert sum(listener.records.values()) == processed


@pytest.mark.parametrize("level", ["DETAILED", "NONE"])
def test_cloudwatch_gets_the_kcl_metrics_from_a_dstream(sc, env, make_stream, put_records,
                                                        unique_app_name, level):
    from emulators import client
    from test_metrics import listed

    from kinesis_dstream import MetricsLevel
    from kinesis_dstream.worker import metrics as m

    stream = make_stream(2)
    put_records(stream, [(f"pk{i}", f"r{i}") for i in range(100)])
    ssc = make_ssc(sc)
    rows = collected(create(ssc, unique_app_name, stream, env,
                            metricsLevel=getattr(MetricsLevel, level),
                            cloudWatchEndpoint=env["dynamodb"],  # moto serves CloudWatch too
                            configOverrides={"metrics_buffer_time_ms": 200}))
    ssc.start()
    try:
        wait_until(lambda: len(rows) >= 100, 60, "every record")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)  # flushes the metrics
    metrics = listed(client("cloudwatch", env["dynamodb"]), unique_app_name)
    if level == "NONE":
        assert metrics == {}
        return
    shards = {"shardId-000000000000", "shardId-000000000001"}
    for name in (m.RECORDS_PROCESSED, m.DATA_BYTES_PROCESSED, m.MILLIS_BEHIND_LATEST,
                 m.GET_RECORDS_SUCCESS, m.GET_RECORDS_TIME):
        assert {"Operation": "ProcessTask"} in metrics[name], name
        assert {d["ShardId"] for d in metrics[name] if "ShardId" in d} == shards, name
    assert metrics[m.CURRENT_LEASES] == [{"Operation": "RenewAllLeases"}]
    assert {"Operation": "TakeLeases"} in metrics[m.TOTAL_LEASES]
    # The application's lag: the KCL's name and operation, no shard, so one alarm outlives
    # a reshard.
    assert {"Operation": m.APPLICATION_TRACKER} in metrics[m.MILLIS_BEHIND_LATEST]
    assert all("ShardId" not in d for d in metrics[m.MILLIS_BEHIND_LATEST]
               if d.get("Operation") == m.APPLICATION_TRACKER)
