"""DStreams read by enhanced fan-out: Spark on ``local-cluster[2,1,1024]``, the local fan-out
front (SubscribeToShard served in front of kinesis-local) and moto's DynamoDB.

The front counts every call per shard, so "no GetRecords while reading" and "about one
SubscribeToShard per subscription lifetime" (subscriptions held between tasks, on the
executor that reads the shard batch after batch) are counted, not assumed. Records are put
through the front, which pushes them at once.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import signal
import threading
import time
import warnings
from collections import Counter

import pytest
from pyspark import TaskContext

import emulators
from spark_helpers import (
    collected,
    create,
    executor_jvm_of,
    make_ssc,
    read_rows,
    start_driver,
    wait_until,
)
from test_spark_chaos import _open_shards, _reshard, executors_alive
from test_spark_drivers import TAKEN_WITHIN_S, owners, split_between_two
from test_spark_executors import NO_CACHE, two_output_operations
from test_worker_fanout import consumer_status, counted_over_60_s

from kinesis_dstream import InitialPositionInStream

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

log = logging.getLogger(__name__)

LIFETIME_S = 8.0  # beyond the 5 s rule
IDLE_LIFETIME_S = 5.5  # two of them idle, quickly
FANOUT = {"retrieval_mode": "FANOUT"}


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


@pytest.mark.matrix
@pytest.mark.spark
@pytest.mark.parametrize("lifetime_s, waves", [
    (LIFETIME_S, 24),
    counted_over_60_s(20.0, 60),
])
def test_one_second_batches_read_every_record_once_by_subscriptions_held_between_tasks(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name,
        lifetime_s, waves):
    front = make_fanout_front(lifetime_s=lifetime_s)
    stream = make_stream(2)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     configOverrides=FANOUT)
    assert consumer_status(front.endpoint, stream, unique_app_name) == "ACTIVE"  # at createStream
    rows = collected(kstream)
    began = time.monotonic()
    ssc.start()
    producer, sent = putting(put_records, stream, front.endpoint, waves=waves, per_wave=20)
    try:
        producer.join()
        wait_until(lambda: len(rows) >= len(sent), 60, "every record")
        elapsed = time.monotonic() - began
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(rows) == sorted(sent)  # each exactly once
    assert front.count("GetRecords") == 0
    lifetimes = math.ceil(elapsed / lifetime_s)
    log.info("%.0f s read; SubscribeToShard per shard: %s", elapsed,
             {s: n for (op, s), n in front.calls.items() if op == "SubscribeToShard"})
    for shard in ("shardId-000000000000", "shardId-000000000001"):
        subscribes = front.count("SubscribeToShard", shard)
        # one a lifetime; one more where the first batches' tasks met an executor apiece
        assert 1 <= subscribes <= lifetimes + 2, (shard, subscribes, lifetimes, front.calls)


def keys_by_shard(endpoint: str, stream: str, count: int) -> dict[str, list[str]]:
    """``count`` partition keys landing on each shard (Kinesis hashes a key by MD5)."""
    shards = emulators.client("kinesis", endpoint).list_shards(StreamName=stream)["Shards"]
    found: dict[str, list[str]] = {s["ShardId"]: [] for s in shards}
    index = 0
    while any(len(keys) < count for keys in found.values()):
        key, index = f"pk{index}", index + 1
        value = int(hashlib.md5(key.encode()).hexdigest(), 16)
        for shard in shards:
            hash_range = shard["HashKeyRange"]
            if int(hash_range["StartingHashKey"]) <= value <= int(hash_range["EndingHashKey"]):
                if len(found[shard["ShardId"]]) < count:
                    found[shard["ShardId"]].append(key)
    return found


@pytest.mark.spark
def test_busy_shards_on_one_executor_are_spread_and_their_subscriptions_follow(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name):
    """Two busy shards placed on one executor: one moves to the other executor (after
    ``MOVE_EVERY_S``), whose task takes the subscription over; nothing lost, nothing
    doubled, no GetRecords."""
    from kinesis_dstream.spark import registry

    front = make_fanout_front(lifetime_s=60.0)
    stream = make_stream(4)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     configOverrides=FANOUT)
    rows = collected(kstream)
    planner = next(p for p in list(registry._planners.values())
                   if p.spec.config.get("stream_name") == stream)
    ssc.start()
    try:
        wait_until(lambda: len(planner.placement.executor_of) == 4, 60, "every shard placed")
        placed = dict(planner.placement.executor_of)
        by_executor: dict = {}
        for shard, executor in sorted(placed.items()):
            by_executor.setdefault(executor, []).append(shard)
        busy = max(by_executor.values(), key=len)[:2]  # two shards of one executor
        keys = keys_by_shard(front.endpoint, stream, 10)
        sent: list[str] = []
        began = time.monotonic()
        while time.monotonic() - began < 30 and (
                len({planner.placement.executor_of[s] for s in busy}) == 1
                or planner.placement.moving or time.monotonic() - began < 15):
            wave = [(key, f"{shard[-1]}-{len(sent) + i}")
                    for shard in busy for i, key in enumerate(keys[shard])]
            put_records(stream, wave, endpoint=front.endpoint)
            sent.extend(data for _, data in wave)
            time.sleep(0.25)
        wait_until(lambda: len(rows) >= len(sent), 60, "every record")
        read_by = {shard: set(m["read_by_pids"]) for shard, m in kstream.metrics().items()}
        periods = planner.coordinator.periods.shards
        holders = {s: periods[s].last_read.batch_range.subscriber for s in busy}
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(rows) == sorted(sent)  # each exactly once
    now = planner.placement.executor_of
    assert now[busy[0]] != now[busy[1]], (placed, now)
    assert not planner.placement.moving  # the move completed, it was not given up
    moved = next(s for s in busy if now[s] != placed[s])
    assert len(read_by[moved]) == 2, read_by  # its tasks ran in the new executor
    # and its subscription followed it: it is held there, not in the old executor
    assert holders[busy[0]] and holders[busy[1]] and holders[busy[0]] != holders[busy[1]]
    assert front.count("GetRecords") == 0


@pytest.mark.spark
def test_a_recomputed_batch_reads_the_same_records_though_more_were_pushed(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name):
    """storageLevel NONE: each output operation computes the batch. The second finds the
    range the first recorded and reads exactly it (by GetRecords), though more records were
    pushed in between; the subscription goes on from the recorded end."""
    front = make_fanout_front(lifetime_s=LIFETIME_S)
    stream = make_stream(2)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     storageLevel=NO_CACHE, configOverrides=FANOUT)
    late: list[str] = []

    def more(got):
        if got and not late:  # records pushed while the batch is between its two operations
            late.extend(f"b{i}" for i in range(100))
            put_records(stream, [(f"pk{i}", r) for i, r in enumerate(late)],
                        endpoint=front.endpoint)

    first, second = two_output_operations(kstream, more)
    ssc.start()
    early = [f"a{i}" for i in range(100)]
    put_records(stream, [(f"pk{i}", r) for i, r in enumerate(early)], endpoint=front.endpoint)
    try:
        wait_until(lambda: sum(len(v) for v in list(second.values())) >= 200, 90, "both waves")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert late
    for when, rows in first.items():
        assert sorted(second.get(when, [])) == sorted(rows), when
    for seen in (first, second):  # every record once in each output operation
        assert sorted(r for rows in seen.values() for r in rows) == sorted(early + late)
    # No read-ahead under NONE: the first output operation decides each range (by the
    # subscription), the second reads the recorded range by one GetRecords page (a recorded
    # read stops at the page holding its end); a (batch, shard) the first read nothing of is
    # not recorded, so the second reads nothing there.
    shard_of = {key: shard for shard, keys in keys_by_shard(front.endpoint, stream, 100).items()
                for key in keys}
    ranges = {(when, shard_of[f"pk{r[1:]}"]) for when, rows in first.items() for r in rows}
    assert front.count("GetRecords") == len(ranges), ranges


@pytest.mark.spark
def test_an_executor_killed_while_reading_by_fan_out_loses_nothing_and_doubles_nothing(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name):
    """kill -9 of the executor holding a shard's subscription: its shards move to the other
    executor, which subscribes at the last recorded end (the 5 s rule waited out by the
    pacer); every record comes once."""
    front = make_fanout_front(lifetime_s=LIFETIME_S)
    stream = make_stream(2)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     configOverrides=FANOUT)
    rows = collected(kstream)
    before = executors_alive(sc)
    ssc.start()
    producer, sent = putting(put_records, stream, front.endpoint, waves=20, per_wave=20)
    try:
        wait_until(lambda: len(rows) >= 100, 90, "the first records")
        pids = {pid for m in kstream.metrics().values() for pid in m["read_by_pids"]}
        jvm = executor_jvm_of(min(pids))
        os.kill(jvm, signal.SIGKILL)
        producer.join()
        wait_until(lambda: len(rows) >= len(sent), 120, "every record after the kill")
        wait_until(lambda: len(kstream.metrics()) == 2 and all(
            m["processed"] for m in kstream.metrics().values()), 30, "the batches completed")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
        wait_until(lambda: executors_alive(sc) >= before, 120, "the executor replaced")
    assert sorted(rows) == sorted(sent)  # a doubled record would show here


@pytest.mark.spark
def test_a_shard_idle_at_latest_then_split_and_merged_under_load_is_read_promptly_parents_first(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name):
    """A shard read from LATEST and idle across two subscription lifetimes, then written to:
    its records are pushed and read by the second batch after their push at the latest (the
    awslabs connector's fan-out looped silently on idle and resharded shards: its issue
    #91). Under load it is split, and its children merged: each parent's subscription ends
    with ChildShards, its children are read only in batches after the parent's last
    records, every record comes once, and records written to a child, then to the merged
    shard, once it is read, come as promptly."""
    front = make_fanout_front(lifetime_s=IDLE_LIFETIME_S)
    stream = make_stream(1)
    parent = "shardId-000000000000"
    put_records(stream, [("k", "before-start")], endpoint=front.endpoint)  # LATEST: not read
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     configOverrides=FANOUT,
                     initialPositionInStream=InitialPositionInStream.LATEST,
                     messageHandler=lambda r: (r.shard_id, r.data.decode()))
    batches: list[tuple[float, list]] = []  # (batch time, its rows)
    kstream.foreachRDD(lambda t, rdd: batches.append((t.timestamp(), rdd.collect())))
    seen = lambda: [row for _, rows in list(batches) for row in rows]  # noqa: E731
    sent: list[str] = []

    def arrive_promptly(name: str) -> None:
        """Records written now (through the front, as a producer would) are pushed by the
        shard's subscription and read by the first or the second batch whose time is at or
        after their push (the first's read may begin while the push is on its way to its
        process), whatever the machine's load: a batch of that time runs its tasks after the
        push. The put -> push -> batch times are logged (quiet: well within 2 s)."""
        late = [f"{name}-{i}" for i in range(20)]
        put_at = time.time()
        put_records(stream, [(f"pk{i}", r) for i, r in enumerate(late)],
                    endpoint=front.endpoint)
        sent.extend(late)
        wait_until(lambda: set(late) <= {d for _, d in seen()}, 10, f"the {name} records")
        pushed_at = front.pushed_at([d.encode() for d in late])
        got: set[str] = set()
        ordered = sorted(batches, key=lambda b: b[0])
        for at, rows in ordered:  # the batch that completed them
            got |= {d for _, d in rows}
            if set(late) <= got:
                passed_over = [t for t, _ in ordered if pushed_at <= t < at]
                log.info("%s: pushed %.3f s after the put, in the batch of %.3f s after it; "
                         "batches passed over after the push: %d", name, pushed_at - put_at,
                         at - put_at, len(passed_over))
                assert len(passed_over) <= 1, (name, pushed_at - put_at, at - put_at,
                                               [t - put_at for t in passed_over])
                return

    kinesis = emulators.client("kinesis", front.endpoint)
    started_at = time.time()
    ssc.start()
    try:
        wait_until(lambda: front.whole_lifetimes(parent, started_at) >= 2,
                   2 * IDLE_LIFETIME_S + 30, "two subscription lifetimes of the idle shard")
        arrive_promptly("after-idle")
        producer, loaded = putting(put_records, stream, front.endpoint, waves=60, per_wave=20,
                                   every_s=0.2)
        wait_until(lambda: len(seen()) >= len(sent) + 60, 30, "records under load")
        (whole,) = _open_shards(kinesis, stream)
        low = int(whole["HashKeyRange"]["StartingHashKey"])
        high = int(whole["HashKeyRange"]["EndingHashKey"])
        _reshard(kinesis, stream, ShardToSplit=parent, NewStartingHashKey=str((low + high) // 2))
        children = [s["ShardId"] for s in _open_shards(kinesis, stream)]
        wait_until(lambda: {s for s, _ in seen()} >= set(children), 30, "both children read")
        arrive_promptly("child")
        _reshard(kinesis, stream, ShardToMerge=children[0], AdjacentShardToMerge=children[1])
        (merged,) = [s["ShardId"] for s in _open_shards(kinesis, stream)]
        wait_until(lambda: merged in {s for s, _ in seen()}, 30, "the merged shard read")
        arrive_promptly("merged")
        producer.join()
        sent.extend(loaded)
        wait_until(lambda: len(seen()) >= len(sent), 30, "every record")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(data for _, data in seen()) == sorted(sent)  # every record once
    shards = {shard for shard, _ in seen()}
    assert shards == {parent, merged, *children}, shards

    def batches_of(shard_ids):
        return [i for i, (_, rows) in enumerate(batches) if any(s in shard_ids for s, _ in rows)]

    assert max(batches_of({parent})) < min(batches_of(set(children)))  # parents first
    assert max(batches_of(set(children))) < min(batches_of({merged}))
    assert front.count("GetRecords") == 0


@pytest.mark.spark
def test_a_task_failing_after_its_range_was_recorded_reads_the_same_records_on_retry(
        sc, env, make_stream, put_records, make_fanout_front, unique_app_name, tmp_path):
    """The read-ahead task reads its range from the subscription, records it, and dies in the
    message handler after more records were pushed. Spark retries it at once, within 5 s of
    the subscription (another subscribe is refused then): the retry reads the recorded range,
    the same records, and the pushed ones come in the next batch."""
    front = make_fanout_front(lifetime_s=LIFETIME_S)
    exchange = front.exchange

    def refusing_after_the_failure(operation, method, path, body, headers):
        # Kinesis' answer to a retry within 5 s of the subscription, every time, not only
        # when the retry is quick enough: the failing task's put comes just before it dies.
        if operation == "PutRecords" and b"k-fail" in body:
            front.refuse_next("ResourceInUseException", count=3)
        return exchange(operation, method, path, body, headers)

    front.exchange = refusing_after_the_failure
    stream = make_stream(1)
    put_records(stream, [("k", f"a{i}") for i in range(50)], endpoint=front.endpoint)
    flag = tmp_path / "more-put"  # executors and driver share the file system here
    endpoint = front.endpoint

    def fail_first_attempt(record):
        if TaskContext.get().attemptNumber() == 0 and record.data == b"a25" and not flag.exists():
            import boto3  # on the executor: tests/ is not on its path

            boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1").put_records(
                StreamName=stream, Records=[{"PartitionKey": "k-fail", "Data": f"b{i}".encode()}
                                            for i in range(50)])
            flag.touch()
            raise RuntimeError("the task dies after its range was recorded")
        return record.data.decode()

    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                     configOverrides=FANOUT, messageHandler=fail_first_attempt)
    batches: list[list[str]] = []
    kstream.foreachRDD(lambda rdd: batches.append(rdd.collect()))
    ssc.start()
    try:
        wait_until(lambda: sum(len(b) for b in list(batches)) >= 100, 60, "both waves")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert flag.exists(), "the injected failure never happened"
    assert front.refused["ResourceInUseException"] >= 1  # the retry's subscribe, refused
    got = [b for b in batches if b]
    assert got[0] == [f"a{i}" for i in range(50)]  # the retry: exactly the recorded range
    assert [r for b in got[1:] for r in b] == [f"b{i}" for i in range(50)]


@pytest.mark.spark
def test_two_drivers_register_one_consumer_at_once_and_one_takes_the_other_s_shard_over(
        sc, env, tmp_path, make_stream, put_records, make_fanout_front, unique_app_name):
    """Driver a (this process, local-cluster) and driver b (a process of its own, local[2]:
    a second local cluster's executors take minutes to start on a loaded machine) of one
    application register the consumer at the same moment: one is made, neither fails,
    and they split the shards. b reads its two shards in two Python workers of its one
    executor (two cores), a shard's task in either, batch after batch: each subscription
    stays in the worker that opened it, which serves the other's tasks, so about one
    SubscribeToShard a lifetime. b stops gracefully: a takes its leases (failover and a
    renew period, as under polling) and their subscriptions over within the 5 s rule, and
    every record comes once."""
    front = make_fanout_front(lifetime_s=LIFETIME_S)
    exchange = front.exchange
    looked_up = threading.Barrier(2, timeout=120)
    first_two: list[str] = []

    def at_once(operation, method, path, body, headers):
        # Each driver's first DescribeStreamConsumer waits for the other's: both find no
        # consumer, and both register it, whenever each driver's Spark came up.
        if operation == "DescribeStreamConsumer" and len(first_two) < 2:
            first_two.append(operation)
            looked_up.wait()
        return exchange(operation, method, path, body, headers)

    front.exchange = at_once
    stream = make_stream(4)
    dynamodb = env["dynamodb"]
    b, out_b, stop_b = start_driver(tmp_path, "b", unique_app_name, stream, front.endpoint,
                                    dynamodb, checkpoint_interval="1", fanout=True)
    batches: list[tuple[float, list]] = []  # (when driver a got it, its rows)
    mine = lambda: [(s, d) for _, rows in list(batches) for s, _, d in rows]  # noqa: E731
    theirs = lambda: [(s, d) for s, _, _, d in read_rows(out_b)]  # noqa: E731
    sent: list[str] = []
    try:
        ssc = make_ssc(sc)
        kstream = create(ssc, unique_app_name, stream, dict(env, kinesis=front.endpoint),
                         configOverrides=FANOUT,
                         messageHandler=lambda r: (r.shard_id, int(r.sequence_number),
                                                   r.data.decode()))
        kstream.foreachRDD(lambda rdd: batches.append((time.monotonic(), rdd.collect())))
        ssc.start()
        try:
            wait_until(lambda: split_between_two(dynamodb, unique_app_name, 4), 90,
                       "the two drivers splitting the shards")
            moved = set(owners(dynamodb, unique_app_name)) - {
                s for s, m in kstream.metrics().items() if m["owner"]}
            # 32 keys: every shard gets records
            first = [f"first{i}" for i in range(32)]
            put_records(stream, [(f"pk{i}", r) for i, r in enumerate(first)],
                        endpoint=front.endpoint)
            sent.extend(first)
            wait_until(lambda: {s for s, _ in theirs()} >= moved, 30, "b reading its shards")
            # Counted from here (b may have taken a shard from a within 5 s of a's
            # subscription) until the producer stops: 1 s batches of two tasks each.
            counted_from = time.monotonic()
            subscribed0 = {s: front.count("SubscribeToShard", s) for s in moved}
            producer, loaded = putting(put_records, stream, front.endpoint, waves=24,
                                       per_wave=32, every_s=0.5)
            producer.join()
            sent.extend(loaded)
            wait_until(lambda: len(mine()) + len(theirs()) >= len(sent), 60, "the first wave")
            counted_s = time.monotonic() - counted_from
            b_subscribed = {s: front.count("SubscribeToShard", s) - n
                            for s, n in subscribed0.items()}
            stop_b.touch()
            assert b.wait(60) == 0, (tmp_path / "driver-b.log").read_text()[-3000:]
            stopped = time.monotonic()
            wait_until(lambda: None not in owners(dynamodb, unique_app_name).values() and len(
                set(owners(dynamodb, unique_app_name).values())) == 1, 30, "a taking b's shards")
            taken = time.monotonic()
            print(f"b's leases taken by a {taken - stopped:.2f} s after b stopped")
            assert taken - stopped <= TAKEN_WITHIN_S, taken - stopped
            late = [f"late{i}" for i in range(100)]
            put_records(stream, [(f"pk{i}", r) for i, r in enumerate(late)],
                        endpoint=front.endpoint)
            sent.extend(late)
            wait_until(lambda: len(mine()) + len(theirs()) >= len(sent), 60, "the second wave")
        finally:
            ssc.stop(stopSparkContext=False, stopGraceFully=True)
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()
    # a's first batch of b's shard after b stopped (a may have read it before b took it)
    took_over = min(at for at, rows in list(batches)
                    if at > stopped and any(s in moved for s, _, _ in rows))
    log.info("b's shards read by a %.1f s after it took the leases", took_over - taken)
    print(f"b's shards: SubscribeToShard {b_subscribed} in {counted_s:.1f} s, "
          f"{LIFETIME_S:.0f} s lifetimes")
    # Each subscription is held by one of b's Python workers and served to the shard's
    # tasks that run in the other: about one SubscribeToShard a lifetime, not one a switch
    # (refused for 5 s after the last one, the shard's reads stalling meanwhile).
    assert all(n <= counted_s / LIFETIME_S + 2 for n in b_subscribed.values()), \
        (b_subscribed, counted_s)
    # The 5 s rule at most, then batches: 2 to 6 s measured here, 19 s once with the
    # machine's load at 20 (batches queued behind 2 s of processing each).
    assert took_over - taken < 5.0 + 10.0
    counted = Counter(d for _, d in mine() + theirs())
    assert sorted(counted) == sorted(sent) and max(counted.values()) == 1  # once each
    # b read the shards it held at the split; under load a lease may also change hands before
    # the split settles (a shard of a's read by b for a while): each record still came once
    assert {s for s, _ in theirs()} >= moved
    kinesis = emulators.client("kinesis", front.endpoint)
    stream_arn = kinesis.describe_stream_summary(StreamName=stream)[
        "StreamDescriptionSummary"]["StreamARN"]
    consumers = kinesis.list_stream_consumers(StreamARN=stream_arn)["Consumers"]
    assert [(c["ConsumerName"], c["ConsumerStatus"]) for c in consumers] == \
        [(unique_app_name, "ACTIVE")]  # one consumer, both drivers on it
    assert front.count("RegisterStreamConsumer") == 2  # both registered it, at once
    assert "ConsumerRegistrationError" not in (tmp_path / "driver-b.log").read_text()
