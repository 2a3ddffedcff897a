"""``createStream`` with ``stsAssumeRoleArn``, end to end on local-cluster[2,1,1024] (issue 39:
an STS role for the DStream as for the SQL source, the worker and the daemon).

The SQL source's cross-account tests (test_sql_cross_account.py) count AssumeRole calls per
process at a proxy before moto's STS; this is the same check for the DStream: the driver
(which lists shards and keeps the leases) and the executors' Python workers (which read)
each assume the role once, however many batches and tasks they run, and every Kinesis call
is signed by a session of that role.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

import sts_proxies as sts
from spark_helpers import create, make_ssc, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


class Partitions:
    """foreachRDD target: each batch's rows, kept per partition (one action a batch, so no
    batch is read twice), and how many partitions brought rows."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: Counter[str] = Counter()
        self.with_rows = 0

    def __call__(self, rdd: Any) -> None:
        parts = rdd.mapPartitions(lambda rows: [list(rows)]).collect()
        with self.lock:
            for part in parts:
                self.rows.update(part)
            self.with_rows += sum(1 for part in parts if part)

    def total(self) -> int:
        with self.lock:
            return sum(self.rows.values())


def test_dstream_role_reads_every_record_once_assuming_once_per_process(
        sc, aws_env, kinesis_local, dynamodb, make_stream, put_records, make_fault_proxy,
        unique_app_name):
    """createStream(stsAssumeRoleArn=..., stsSessionName=...): every record once, every
    Kinesis call (the driver's ListShards, the executors' GetRecords) signed by the role's
    session, and STS asked once per process that uses the role, not once per batch or
    task."""
    proxies = sts.Proxies(make_fault_proxy, dynamodb)
    role = sts.role_of(unique_app_name)
    stream = make_stream(2)
    ssc = make_ssc(sc)
    sink = Partitions()
    create(ssc, unique_app_name, stream, {"kinesis": proxies.kinesis.endpoint,
                                          "dynamodb": dynamodb},
           stsAssumeRoleArn=role, stsSessionName="dstream-reader",
           configOverrides={"sts_endpoint": proxies.sts.endpoint}).foreachRDD(lambda rdd: sink(rdd))
    expected: Counter[str] = Counter()
    executors: dict[int, bool] = {}
    ssc.start()
    try:
        for wave in range(sts.WAVES):
            expected.update(p.data.decode() for p in put_records(
                stream, [(f"k{wave}-{i}", f"w{wave}-{i}") for i in range(sts.PER_WAVE)]))
            wait_until(lambda: sink.total() >= sum(expected.values()), 90,
                       f"wave {wave} of the records")
        executors.update(sts.executors_of(proxies))
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    assert sink.rows == expected  # every record once
    sts.assert_signed_by_role_sessions(proxies, dynamodb, role, lambda name: name == "dstream-reader")
    sts.assert_assumed_once_per_process(proxies, sink.with_rows, executors)
