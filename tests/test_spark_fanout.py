"""DStreams read by enhanced fan-out: Spark on ``local-cluster[2,1,1024]``, the local fan-out
front (SubscribeToShard served in front of kinesis-local) and moto's DynamoDB.

The front counts every call per shard, so "no GetRecords while reading" and "about one
SubscribeToShard per subscription lifetime" (subscriptions held between tasks, on the
executor that reads the shard batch after batch) are counted, not assumed. Records are put
through the front, which pushes them at once.
"""
from __future__ import annotations

import logging
import math
import threading
import time
import warnings

import pytest

from spark_helpers import collected, create, make_ssc, wait_until
from test_worker_fanout import consumer_status

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

log = logging.getLogger(__name__)

LIFETIME_S = 8.0  # beyond the 5 s rule
FANOUT = {"retrieval_mode": "FANOUT"}


@pytest.fixture
def env(aws_env, kinesis_local, dynamodb):
    return dict(kinesis=kinesis_local, dynamodb=dynamodb)


def putting(put_records, stream: str, endpoint: str, waves: int, per_wave: int,
            every_s: float = 1.0) -> tuple[threading.Thread, list[str]]:
    """A producer: ``waves`` puts of ``per_wave`` records, one every ``every_s``."""
    sent: list[str] = []

    def run() -> None:
        for wave in range(waves):
            batch = [f"w{wave}-{i}" for i in range(per_wave)]
            put_records(stream, [(f"pk{i}", r) for i, r in enumerate(batch)], endpoint=endpoint)
            sent.extend(batch)
            time.sleep(every_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, sent


@pytest.mark.spark
def test_one_second_batches_read_every_record_once_by_subscriptions_held_between_tasks(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name):
    front = make_fanout_front(lifetime_s=LIFETIME_S)
    stream = make_stream(2)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     configOverrides=FANOUT)
    assert consumer_status(front.endpoint, stream, unique_app_name) == "ACTIVE"  # at createStream
    rows = collected(kstream)
    began = time.monotonic()
    ssc.start()
    producer, sent = putting(put_records, stream, front.endpoint, waves=24, per_wave=20)
    try:
        producer.join()
        wait_until(lambda: len(rows) >= len(sent), 60, "every record")
        elapsed = time.monotonic() - began
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(rows) == sorted(sent)  # each exactly once
    assert front.count("GetRecords") == 0
    lifetimes = math.ceil(elapsed / LIFETIME_S)
    log.info("%.0f s read; SubscribeToShard per shard: %s", elapsed,
             {s: n for (op, s), n in front.calls.items() if op == "SubscribeToShard"})
    for shard in ("shardId-000000000000", "shardId-000000000001"):
        subscribes = front.count("SubscribeToShard", shard)
        # one a lifetime; one more where the first batches' tasks met an executor apiece
        assert 1 <= subscribes <= lifetimes + 2, (shard, subscribes, lifetimes, front.calls)
