"""What production throws at a running job: a DynamoDB outage is waited out, a deleted stream
stops the job naming it. DStream and Structured Streaming, end to end.

Real Spark (the session's local-cluster context), kinesis-local, moto's DynamoDB. A DynamoDB
outage is the fault proxy in front of moto, dropping every connection unanswered (a Kinesis
outage has its own proxy, in front of kinesis-local: tests/test_spark_errors.py).
"""
from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import Counter
from typing import Any, Callable

import pytest

from emulators import client
from spark_helpers import collected, create, make_ssc, wait_until
from test_sql_source import Batches, options, start_query

pytestmark = pytest.mark.spark

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

OUTAGE_S = 20
# Longer than the outage: the leases outlive it. With a shorter one they lapse, the reads
# stop (as the KCL's do), and they are taken back untouched (tests/test_lease_renewal.py).
PATIENT_FAILOVER_MS = 60_000




class Traffic:
    """Records put every 0.5 s from a thread until stopped: traffic flowing through an outage."""

    def __init__(self, put: Callable[[list[tuple[str, str]]], Any], prefix: str) -> None:
        self.sent: list[str] = []
        self._put, self._prefix = put, prefix
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            batch = [f"{self._prefix}{len(self.sent) + i}" for i in range(10)]
            self._put([(f"k{i}", data) for i, data in enumerate(batch)])
            self.sent.extend(batch)

    def __enter__(self) -> "Traffic":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def outage(proxy: Any, seconds: float = OUTAGE_S) -> None:
    proxy.dropping = True
    began = time.monotonic()
    wait_until(lambda: time.monotonic() - began >= seconds, seconds + 10, f"{seconds} s of outage")
    assert proxy.dropped > 0
    proxy.dropping = False


@pytest.mark.parametrize("failover_ms", [PATIENT_FAILOVER_MS, 3000], ids=["leases-outlive-it",
                                                                       "leases-lapse"])
def test_a_dynamodb_outage_of_20_s_during_a_dstream_run_is_waited_out_exactly(
        sc, env, make_stream, put_records, unique_app_name, make_fault_proxy, caplog, failover_ms):
    """With failover shorter than the outage the leases lapse and the reads stop; nobody else
    takes them, so they are taken back where they stood: nothing doubled either way."""
    stream = make_stream(2)
    proxy = make_fault_proxy(share=0.0, upstream=env["dynamodb"])
    put_records(stream, [(f"k{i}", f"a{i}") for i in range(100)])
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, dynamodb=proxy.endpoint),
                     configOverrides=dict(failover_time_ms=failover_ms))
    rows = collected(kstream)
    caplog.set_level(logging.WARNING, logger="kinesis_dstream")
    ssc.start()
    try:
        wait_until(lambda: len(rows) >= 100, 90, "the first records")
        with Traffic(lambda records: put_records(stream, records), "b") as traffic:
            outage(proxy)
            time.sleep(2)  # traffic after the outage too
        expected = [f"a{i}" for i in range(100)] + traffic.sent
        wait_until(lambda: len(rows) >= len(expected), 120, "the records put during the outage")
        time.sleep(3)  # what would come twice comes by now
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert Counter(rows) == Counter(expected)
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # Waited out, not failed: no read-ahead failed, no lease was lost to another worker.
    assert not [m for m in messages if "ahead failed" in m or "lost the lease" in m], messages
    if failover_ms < OUTAGE_S * 1000:
        assert [m for m in messages if "lapsed" in m]
        assert [m for m in messages if "took the lease of shard" in m and "back" in m]


def test_a_dynamodb_outage_of_20_s_during_a_sql_query_is_waited_out_exactly(
        spark, env, make_stream, put_records, unique_app_name, make_fault_proxy, tmp_path):
    stream = make_stream(2)
    proxy = make_fault_proxy(share=0.0, upstream=env["dynamodb"])
    put_records(stream, [(f"k{i}", f"a{i}") for i in range(100)])
    sink = Batches()
    query = start_query(spark, options(stream, env["kinesis"], proxy.endpoint, unique_app_name),
                        str(tmp_path / "checkpoint"), sink)
    try:
        wait_until(lambda: sum(sink.data().values()) >= 100, 120, "the first records")
        with Traffic(lambda records: put_records(stream, records), "b") as traffic:
            outage(proxy)
            time.sleep(2)
        expected = Counter(d.encode() for d in [f"a{i}" for i in range(100)] + traffic.sent)
        wait_until(lambda: sum(sink.data().values()) >= sum(expected.values()) or
                   query.exception() is not None, 120, "the records put during the outage")
        assert query.exception() is None, query.exception()
        assert query.isActive
    finally:
        query.stop()
    assert sink.data() == expected
    assert not sink.reruns_differing


def _delete_stream(kinesis: str, stream: str) -> None:
    client("kinesis", kinesis).delete_stream(StreamName=stream, EnforceConsumerDeletion=True)


def test_a_stream_deleted_while_a_dstream_job_runs_fails_it_naming_the_stream(
        sc, env, make_stream, put_records, unique_app_name):
    stream = make_stream(2)
    put_records(stream, [(f"k{i}", f"a{i}") for i in range(20)])
    ssc = make_ssc(sc)
    rows = collected(create(ssc, unique_app_name, stream, env))
    ssc.start()
    try:
        wait_until(lambda: len(rows) >= 20, 90, "the first records")
        _delete_stream(env["kinesis"], stream)
        with pytest.raises(Exception) as failure:  # py4j's wrapper of Spark's own error
            # Generous for a loaded machine; the job must stop on its own, not time out here.
            ssc.awaitTerminationOrTimeout(120)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    message = str(failure.value)
    assert "StreamNotFoundError" in message and f"'{stream}'" in message, message[-2000:]


def test_a_stream_deleted_during_a_sql_query_fails_it_naming_the_stream(
        spark, env, make_stream, put_records, unique_app_name, tmp_path):
    stream = make_stream(2)
    put_records(stream, [(f"k{i}", f"a{i}") for i in range(20)])
    sink = Batches()
    query = start_query(spark, options(stream, env["kinesis"], env["dynamodb"], unique_app_name),
                        str(tmp_path / "checkpoint"), sink)
    try:
        wait_until(lambda: sum(sink.data().values()) >= 20, 120, "the first records")
        _delete_stream(env["kinesis"], stream)
        with pytest.raises(Exception) as failure:
            query.awaitTermination(120)  # generous; the query stops on its own
    finally:
        query.stop()
    message = str(failure.value)
    assert "StreamNotFoundError" in message and f"'{stream}'" in message, message[-2000:]
