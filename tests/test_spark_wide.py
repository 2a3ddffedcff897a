"""Wide streams: what a quiet shard costs per batch, and how shards are grouped into tasks.

Real Spark on ``local-cluster[2,1,1024]``, kinesis-local and moto's DynamoDB, with a counting
proxy (tests/fault_proxy.py, nothing injected) in front of each, so that every call the
driver and the executors make is counted by operation and by the shard it names.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import replace

import pytest

from spark_helpers import create, make_ssc, wait_until

from kinesis_dstream.aws.range_table import range_table_name
from kinesis_dstream.records import ExtendedSequenceNumber
from kinesis_dstream.retrieval import ShardRange, group_shards

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)


@pytest.mark.spark
def test_an_idle_shard_costs_no_get_shard_iterator_and_no_dynamodb_call_per_batch(
        sc, aws_env, kinesis_local, dynamodb, make_stream, make_fault_proxy, put_records,
        unique_app_name):
    """Once a shard has been read, each batch reads it with the iterator the last read handed
    back, and a read that found nothing records nothing: a quiet shard costs one GetRecords
    a batch, as a KCL shard consumer's poll does. Lease renewals are the lease's, not the
    batch's, and are not counted here."""
    stream = make_stream(4)
    kinesis = make_fault_proxy(share=0.0, upstream=kinesis_local)
    tables = make_fault_proxy(share=0.0, upstream=dynamodb)
    busy = put_records(stream, [("k", "first")])[0].shard_id
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream,
                     dict(kinesis=kinesis.endpoint, dynamodb=tables.endpoint))
    rows: list[str] = []
    batches = [0]
    lock = threading.Lock()

    def keep(rdd) -> None:
        got = rdd.collect()
        with lock:
            rows.extend(got)
            batches[0] += 1

    kstream.foreachRDD(keep)
    ssc.start()
    try:
        wait_until(lambda: rows == ["first"], 90, "the first record")
        wait_until(lambda: len(kstream.metrics()) == 4 and all(
            m["state"] == "processing" for m in kstream.metrics().values()), 60, "four leases")
        start = batches[0]
        wait_until(lambda: batches[0] >= start + 2, 60, "every shard read once")
        with kinesis._lock, tables._lock:
            before_kinesis = dict(kinesis.shard_calls)
            before_tables = dict(tables.shard_calls)
            before_get_records = kinesis.calls[("GetRecords", "")]
        counted_from = batches[0]
        put_records(stream, [("k", f"r{i}") for i in range(20)])  # the busy shard again
        wait_until(lambda: len(rows) >= 21 and batches[0] >= counted_from + 8, 90,
                   "eight more batches and the new records")
        with kinesis._lock, tables._lock:
            kinesis_calls = _since(before_kinesis, kinesis.shard_calls)
            table_calls = _since(before_tables, tables.shard_calls)
            get_records = kinesis.calls[("GetRecords", "")] - before_get_records
        counted = batches[0] - counted_from
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(rows) == sorted(["first"] + [f"r{i}" for i in range(20)])
    quiet = sorted({f"shardId-{i:012d}" for i in range(4)} - {busy})
    renewals = ("UpdateItem", unique_app_name)
    for shard in quiet:
        assert kinesis_calls.get(("GetShardIterator", "", shard), 0) == 0, (shard, kinesis_calls)
        dynamodb_calls = {k: n for k, n in table_calls.items()
                          if k[2] == shard and k[:2] != renewals}
        assert dynamodb_calls == {}, (shard, dynamodb_calls)
    # about one GetRecords per shard per batch (the busy shard's read may take a page more)
    assert get_records <= 4 * (counted + 2) + 4, (get_records, counted)
    ranges = range_table_name(unique_app_name)
    assert all(k[2] == busy for k in table_calls if k[1] == ranges), table_calls


def _since(before: dict, after) -> dict:
    return {k: n - before.get(k, 0) for k, n in dict(after).items() if n - before.get(k, 0)}


def _ranges(n: int) -> list[ShardRange]:
    return [ShardRange("m", f"shardId-{i:012d}", 1000, ExtendedSequenceNumber("TRIM_HORIZON"),
                       None, 1000, 100, 1.0) for i in range(n)]


@pytest.mark.unit
def test_shards_are_grouped_into_few_tasks_and_busy_shards_spread_over_the_cores() -> None:
    read = [replace(r, weight=10) for r in _ranges(64)]  # every shard read records last time
    wide = group_shards(read, shards_per_task=16, parallelism=2)
    assert [len(g) for g in wide] == [16, 16, 16, 16]
    assert sorted(r.shard_id for g in wide for r in g) == [f"shardId-{i:012d}" for i in range(64)]
    idle = group_shards(_ranges(256), shards_per_task=16, parallelism=2)  # a quarter each
    assert [len(g) for g in idle] == [16 * 4] * 4
    narrow = group_shards(_ranges(4), shards_per_task=16, parallelism=2)
    assert [len(g) for g in narrow] == [2, 2]  # a backlog on 4 shards uses both cores
    busy = {"shardId-000000000003", "shardId-000000000007", "shardId-000000000011",
            "shardId-000000000015"}
    groups = group_shards([replace(r, weight=1000 if r.shard_id in busy else 0)
                           for r in _ranges(32)], shards_per_task=3, parallelism=2)
    assert len(groups) == 4  # 4 busy shards and 28 idle ones (7 shards' worth): 11 / 3
    assert [sum(r.shard_id in busy for r in g) for g in groups] == [1, 1, 1, 1]
    assert group_shards(_ranges(3), shards_per_task=16, parallelism=8) == \
        [(r,) for r in _ranges(3)]
    assert group_shards([], shards_per_task=16, parallelism=2) == []


@pytest.mark.unit
def test_a_groups_busy_shards_start_reading_first_and_come_back_in_the_groups_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import Future

    from kinesis_dstream.retrieval import shard_groups

    started: list[str] = []

    class InOrder:  # a pool that runs each read as it is submitted
        def submit(self, fn, config, shard_range, **kwargs):
            started.append(shard_range.shard_id)
            future: Future = Future()
            future.set_result(([shard_range.shard_id], None))
            return future

    monkeypatch.setattr(shard_groups, "_threads", lambda: InOrder())
    weights = [0, 0, 40, 0, 900, 0]
    group = [replace(r, weight=w) for r, w in zip(_ranges(6), weights, strict=True)]
    results = list(shard_groups.read_shards(None, group))
    assert started[:2] == [group[4].shard_id, group[2].shard_id]
    assert sorted(started) == [r.shard_id for r in group]
    assert [records for records, _ in results] == [[r.shard_id] for r in group]
