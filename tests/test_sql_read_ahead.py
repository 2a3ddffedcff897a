"""The SQL source reads a backlog ahead between micro-batches (retrieval.prefetch), end to end.

Real Spark on the session's local-cluster (two executors in processes of their own, so a
shard's next task often runs in another process than the one that read its page ahead),
kinesis-local behind the limits proxy (tests/fault_proxy.py: Kinesis' 2 MiB/s and 5 calls a
second per shard), the moto server for the range table.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from fault_proxy import ShardLimits
from spark_helpers import table_items, wait_until
from test_sql_source import Batches, options, start_query, stop

from kinesis_dstream.aws.range_table import range_table_name

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

RECORDS, SIZE = 6000, 1000


def test_a_backlog_is_read_ahead_and_handed_to_the_next_task_exactly_once(
        spark: Any, aws_env: dict[str, str], dynamodb: str, make_stream: Any,
        make_fault_proxy: Any, put_records: Any, unique_app_name: str, tmp_path: Any) -> None:
    """Two shards of 3,000 records of 1,000 bytes each, read 1,000 records a micro-batch.
    Each task that leaves its shard on the backlog reads the next page ahead in its Python
    worker; the next task of the shard, wherever Spark runs it, takes that page from the
    process (over the peer port) instead of calling Kinesis. So every record comes once,
    and Kinesis serves each record's bytes once: a page read ahead and then read again by a
    task that did not get it would be served twice (and, at the limits, refused). The
    ranges name the process holding the next page (``subscriber``), which polling ranges
    did not before read-ahead."""
    stream = make_stream(2)
    sent = [f"{i:05d}".ljust(SIZE, "x").encode() for i in range(RECORDS)]
    put_records(stream, [(f"pk{i}", v.decode()) for i, v in enumerate(sent)])
    limits = ShardLimits()
    proxy = make_fault_proxy(share=0.0, limits=limits)
    sink = Batches()
    opts = options(stream, proxy.endpoint, dynamodb, unique_app_name,
                   **{"kinesis.maxFetchRecordsPerShard": "1000"})
    query = start_query(spark, opts, str(tmp_path / "checkpoint"), sink)
    try:
        wait_until(lambda: sum(sink.data().values()) >= RECORDS or query.exception(), 300,
                   "every record")
    finally:
        stop(query)
    assert sink.data() == Counter(sent) and not sink.reruns_differing
    served = sum(limits.served_bytes.values())
    probes = 4 * SIZE * 10  # the first reading's probes: a record or a few a shard
    assert RECORDS * SIZE <= served <= RECORDS * SIZE + probes, (served, RECORDS * SIZE)
    refused = {k: n for k, n in limits.refused.items() if k[0] == "GetRecords"}
    assert not refused, refused
    ranges = table_items(dynamodb, range_table_name(unique_app_name))
    held = [r for r in ranges if "subscriber" in r and int(r["records"]["N"]) > 0]
    assert held, "no range names a process holding its shard's next page"
