"""The worker and the multilang daemon reading by enhanced fan-out, through the local fan-out
front (SubscribeToShard served to boto3 in front of kinesis-local) and moto's DynamoDB.

Subscriptions are given short lifetimes so resubscription happens within a test; the
front counts every call per shard, so "no GetRecords" and "about one SubscribeToShard per
subscription lifetime" are counted, not assumed.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

import emulators
from test_multilang_daemon import RECORDER, Daemon, read_log, wait_for_records
from waiting import wait_for

from kinesis_dstream.errors import ConsumerRegistrationError
from kinesis_dstream.records import ExtendedSequenceNumber
from kinesis_dstream.worker.processor import RecordProcessor
from kinesis_dstream.worker.scheduler import Scheduler

pytestmark = pytest.mark.emulator

LIFETIME_S = 6.0  # beyond the 5 s rule, so a resubscription is never refused by it
# The id of the variants that count SubscribeToShard over the 60 s of reading with
# 20 s lifetimes (the version matrix in the Makefile leaves them out by it).
COUNTED_OVER_60_S = "60s-of-20s-lifetimes"


def counted_over_60_s(*values: Any) -> Any:
    """The ``slow`` variant of a test counting SubscribeToShard per lifetime: ``values`` are
    its parameters for 60 s of reading with 20 s lifetimes."""
    return pytest.param(*values, marks=pytest.mark.slow, id=COUNTED_OVER_60_S)


def rounds_while(started: float, run_s: float, every_s: float) -> Iterator[int]:
    """Round numbers, each after ``every_s``, while ``run_s`` has not passed since
    ``started`` (monotonic): a producer's rounds while subscriptions are renewed."""
    round_ = 0
    while time.monotonic() - started < run_s:
        time.sleep(every_s)
        yield round_
        round_ += 1


class Recorder(RecordProcessor):
    """Every record delivered, in order, with the worker that delivered it; checkpoints each
    batch; marks the shard's end."""

    def __init__(self, out: list, lock: threading.Lock, shard_id: str, worker: str) -> None:
        self.out, self.lock, self.shard_id, self.worker = out, lock, shard_id, worker

    def process_records(self, process_records_input) -> None:
        records = process_records_input.records
        with self.lock:
            self.out.extend((self.worker, self.shard_id, r, time.monotonic()) for r in records)
        if records:
            last = records[-1]
            process_records_input.checkpointer.checkpoint(last.sequence_number,
                                                          last.sub_sequence_number)

    def shard_ended(self, shard_ended_input) -> None:
        with self.lock:
            self.out.append((self.worker, self.shard_id, "SHARD_END", time.monotonic()))
        shard_ended_input.checkpointer.checkpoint()


def recorder(out: list, lock: threading.Lock, worker: str):
    return lambda shard_id: Recorder(out, lock, shard_id, worker)


def put_mixed(endpoint: str, stream: str, prefix: str, total: int) -> set[str]:
    """Half in KPL aggregates, half plain; the user records' data."""
    data = [f"{prefix}-{i}" for i in range(total)]
    half = total // 2
    emulators.put_aggregated(endpoint, stream, [(f"pk-{i}", d) for i, d in
                                                enumerate(data[:half])], per_aggregate=25)
    emulators.put_records(endpoint, stream, [(f"pk-{i}", d) for i, d in enumerate(data[half:])])
    return set(data)


def assert_pushed_by_live_subscriptions(front: Any, delivered: list, data: set[str],
                                        put_epoch: float) -> None:
    """The records of ``data`` came by the subscriptions open when they were put: each of
    their shards had an event with records pushed after the put, and no SubscribeToShard
    call on those shards came between the put and the push (not a resubscription's read)."""
    shards = {shard for _, shard, r, _ in delivered
              if r != "SHARD_END" and r.binary_data.decode() in data}
    pushed_at = front.pushed_since(put_epoch, shards)
    between = [(at, shard) for at, shard in front.subscribed
               if shard in shards and put_epoch <= at <= pushed_at]
    assert not between, f"subscribed between the put and its push: {between}"


def consumer_status(endpoint: str, stream: str, name: str) -> str:
    kinesis = emulators.client("kinesis", endpoint)
    stream_arn = kinesis.describe_stream_summary(StreamName=stream)[
        "StreamDescriptionSummary"]["StreamARN"]
    return kinesis.describe_stream_consumer(StreamARN=stream_arn, ConsumerName=name)[
        "ConsumerDescription"]["ConsumerStatus"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lifetime_s, run_s", [
    (LIFETIME_S, 4 * LIFETIME_S / 2),
    counted_over_60_s(20.0, 60.0),
])
def test_worker_reads_every_record_once_by_fan_out_without_get_records(
        aws_env, kinesis_local, make_stream, make_config, make_fanout_front, lifetime_s, run_s):
    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=lifetime_s, heartbeat_s=1)
    expected = put_mixed(kinesis_local, stream, "before", 200)
    config = make_config(stream, kinesis_endpoint=front.endpoint, retrieval_mode="FANOUT")
    delivered: list = []
    lock = threading.Lock()
    scheduler = Scheduler(config, recorder(delivered, lock, "a"))
    started = time.monotonic()
    scheduler.start()
    try:
        for round_ in rounds_while(started, run_s, LIFETIME_S / 2):
            expected |= put_mixed(kinesis_local, stream, f"during-{round_}", 40)
        wait_for(lambda: len(delivered) >= len(expected), 30, "every record")
        elapsed = time.monotonic() - started
        metrics = scheduler.metrics()
    finally:
        scheduler.shutdown(timeout_s=10)
    data = Counter(r.binary_data.decode() for _, _, r, _ in delivered)
    assert set(data) == expected and max(data.values()) == 1  # every record, exactly once
    shards = emulators.list_shard_ids(kinesis_local, stream)
    for shard_id in shards:
        assert front.count("GetRecords", shard_id) == 0, shard_id
        subscribed = front.count("SubscribeToShard", shard_id)
        # one per lifetime (the start-up before the first one is inside `elapsed`)
        lifetimes = int(elapsed // lifetime_s)
        assert lifetimes <= subscribed <= lifetimes + 1, (shard_id, subscribed, elapsed)
        # metrics() was read before the shutdown: a renewal may have come after it
        assert subscribed - 1 <= metrics[shard_id].subscriptions <= subscribed
        assert metrics[shard_id].resubscriptions == metrics[shard_id].subscriptions - 1
        assert metrics[shard_id].millis_behind_latest is not None
    assert consumer_status(kinesis_local, stream, config.application_name) == "ACTIVE"


@pytest.mark.timeout(60)
def test_a_cut_subscription_and_refused_subscribes_lose_and_repeat_nothing(
        aws_env, kinesis_local, make_stream, make_config, make_fanout_front):
    stream = make_stream(1)
    front = make_fanout_front(lifetime_s=60, heartbeat_s=1)
    config = make_config(stream, kinesis_endpoint=front.endpoint, retrieval_mode="FANOUT")
    delivered: list = []
    lock = threading.Lock()
    expected = put_mixed(kinesis_local, stream, "first", 40)
    front.cut_after(3)  # the first subscription dies after three events, mid-stream
    front.refuse_next("ResourceInUseException")
    front.refuse_next("LimitExceededException")
    scheduler = Scheduler(config, recorder(delivered, lock, "a"))
    scheduler.start()
    try:
        for round_ in range(5):
            expected |= put_mixed(kinesis_local, stream, f"more-{round_}", 10)
            time.sleep(0.3)
        wait_for(lambda: front.cuts == 1 and len(delivered) >= len(expected), 30,
                 "every record after the cut")
        # after the cut, a new subscription from the last event's continuation
        wait_for(lambda: [m.resubscriptions for m in scheduler.metrics().values()] == [1], 10,
                 "the resubscription after the cut")
        (metrics,) = scheduler.metrics().values()
    finally:
        scheduler.shutdown(timeout_s=10)
    data = Counter(r.binary_data.decode() for _, _, r, _ in delivered)
    assert set(data) == expected and max(data.values()) == 1
    assert front.refused == {"ResourceInUseException": 1, "LimitExceededException": 1}
    assert metrics.subscriptions == 2
    assert front.count("GetRecords") == 0


@pytest.mark.timeout(60)
def test_a_consumer_deregistered_behind_the_worker_stalls_the_shard_but_never_ends_it(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, make_fanout_front):
    """ResourceNotFound on a subscribe ends a shard, as the KCL reads it; but when the gone
    resource is our consumer, ending would checkpoint an open shard at SHARD_END for good."""
    stream = make_stream(1)
    front = make_fanout_front(lifetime_s=60, heartbeat_s=1)
    config = make_config(stream, kinesis_endpoint=front.endpoint, retrieval_mode="FANOUT")
    delivered: list = []
    expected = put_mixed(kinesis_local, stream, "before", 20)
    scheduler = Scheduler(config, recorder(delivered, threading.Lock(), "a"))
    scheduler.start()
    try:
        wait_for(lambda: len(delivered) >= len(expected), 30, "the first records")
        subscribed = front.count("SubscribeToShard")
        front.deregister_behind(scheduler.consumer_arn)
        # subscribes refused with ResourceNotFound, waited out, the shard never ended
        wait_for(lambda: front.count("SubscribeToShard") >= subscribed + 3, 20,
                 "resubscriptions after the deregistration")
        (metrics,) = scheduler.metrics().values()
    finally:
        scheduler.shutdown(timeout_s=10)
    (shard_id,) = emulators.list_shard_ids(kinesis_local, stream)
    lease = emulators.client("dynamodb", dynamodb).get_item(
        TableName=config.application_name, Key={"leaseKey": {"S": shard_id}},
        ConsistentRead=True)["Item"]
    assert lease["checkpoint"]["S"] != "SHARD_END"
    assert metrics.state == "processing"
    assert not [r for _, _, r, _ in delivered if r == "SHARD_END"]


@pytest.mark.timeout(120)
def test_a_lease_moved_to_another_worker_hands_the_subscription_over_losing_nothing(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, make_fanout_front):
    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=60, heartbeat_s=1)
    delivered: list = []
    lock = threading.Lock()
    configs = {name: make_config(stream, kinesis_endpoint=front.endpoint, worker_id=name,
                                 retrieval_mode="FANOUT") for name in ("a", "b")}
    first = Scheduler(configs["a"], recorder(delivered, lock, "a"))
    second = Scheduler(configs["b"], recorder(delivered, lock, "b"))
    expected: set[str] = set()
    first.start()
    try:
        expected |= put_mixed(kinesis_local, stream, "a-only", 60)
        wait_for(lambda: len(delivered) >= len(expected), 30, "worker a's records")
        second.start()  # takes one of a's two leases
        wait_for(lambda: second.metrics(), 30, "worker b taking a lease")
        moved_at = time.monotonic()
        (moved,) = second.metrics()
        for round_ in range(6):
            expected |= put_mixed(kinesis_local, stream, f"both-{round_}", 20)
            time.sleep(0.5)
        wait_for(lambda: {r.binary_data.decode() for _, _, r, _ in delivered
                          if r != "SHARD_END"} >= expected, 30, "every record")
        b_metrics = second.metrics()
        a_metrics = first.metrics()
    finally:
        second.shutdown(timeout_s=10)
        first.shutdown(timeout_s=10)
    # Stopped workers close their subscriptions (60 s lifetimes would outlast the test).
    wait_for(lambda: not front.subscriptions(), 5, "the subscriptions closed")
    # Nothing lost; a record delivered twice only on the moved shard, after its checkpoint.
    data = Counter(r.binary_data.decode() for _, _, r, _ in delivered if r != "SHARD_END")
    assert set(data) == expected
    twice = {d for d, n in data.items() if n > 1}
    assert all(shard == moved for _, shard, r, _ in delivered
               if r != "SHARD_END" and r.binary_data.decode() in twice)
    # b's subscription took the shard over (the 5 s rule at most) and read it ...
    b_first = min(at for worker, shard, _, at in delivered if worker == "b" and shard == moved)
    assert b_first - moved_at < 10
    assert b_metrics[moved].subscriptions >= 1
    # ... and a let go of it: its consumer of the moved shard is gone, and after b's first
    # record a delivered nothing more of that shard.
    assert moved not in a_metrics
    assert not [at for worker, shard, _, at in delivered
                if worker == "a" and shard == moved and at > b_first]
    assert sum(front.count("GetRecords", s)
               for s in emulators.list_shard_ids(kinesis_local, stream)) == 0


@pytest.mark.timeout(90)
def test_kill_9_of_a_fan_out_worker_moves_its_shards_and_subscriptions_without_loss(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, make_fanout_front,
        tmp_path):
    """Worker processes (`kinesis-dstream worker`): the survivor takes the dead one's leases
    and subscribes at their checkpoints; nothing at or before a checkpoint comes again."""
    from recording_processor import read_events, start_worker

    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=60, heartbeat_s=1)
    expected = put_mixed(kinesis_local, stream, "before", 100)
    config = make_config(stream, kinesis_endpoint=front.endpoint, retrieval_mode="FANOUT")
    log_path = tmp_path / "events.jsonl"
    workers = {name: start_worker(config.replace(worker_id=name), log_path, tmp_path, name)
               for name in ("worker-a", "worker-b")}

    def records() -> list[dict]:
        return [e for e in read_events(str(log_path)) if e["event"] == "record"]

    def owners() -> set[str]:
        ddb = emulators.client("dynamodb", dynamodb)
        try:
            items = ddb.scan(TableName=config.application_name, ConsistentRead=True)["Items"]
        except ddb.exceptions.ResourceNotFoundException:  # not created yet
            return set()
        return {item.get("leaseOwner", {}).get("S") for item in items}

    try:
        wait_for(lambda: owners() == {"worker-a", "worker-b"}, 30, "a 1/1 split")
        expected |= put_mixed(kinesis_local, stream, "split", 100)
        wait_for(lambda: {e["data"] for e in records()} >= expected, 30, "the first records")
        victim = workers["worker-b"]
        wait_for(lambda: any(e["event"] == "checkpoint" and e["pid"] == victim.pid
                             for e in read_events(str(log_path))), 10, "worker-b's checkpoint")
        # What worker-a read of worker-b's shard before the split (it may have held both
        # shards first) is not a repeat: only what comes after the kill counts.
        before_kill = len(read_events(str(log_path)))
        victim.kill()
        victim.wait(timeout=10)
        expected |= put_mixed(kinesis_local, stream, "after", 100)
        wait_for(lambda: owners() == {"worker-a"}, 30, "worker-a owning both shards")
        wait_for(lambda: {e["data"] for e in records()} >= expected, 30, "every record")
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
    events = read_events(str(log_path))
    dead = workers["worker-b"].pid
    checkpoints = {e["shard"]: ExtendedSequenceNumber(e["seq"], e["sub"])
                   for e in events if e["pid"] == dead and e["event"] == "checkpoint"}
    assert checkpoints, "worker-b checkpointed nothing before it was killed"
    for shard, checkpoint in checkpoints.items():
        again = [e for e in events[before_kill:] if e["event"] == "record"
                 and e["shard"] == shard and e["pid"] != dead
                 and ExtendedSequenceNumber(e["seq"], e["sub"]) <= checkpoint]
        assert not again, f"{len(again)} records of {shard} at or before {checkpoint} again"
    assert front.count("GetRecords") == 0


@pytest.mark.timeout(120)
def test_a_split_ends_the_parent_by_child_shards_and_children_follow_it(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, make_fanout_front, caplog):
    caplog.set_level(logging.INFO, logger="kinesis_dstream.retrieval.fanout")
    stream = make_stream(1)
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1)
    kinesis = emulators.client("kinesis", kinesis_local)
    config = make_config(stream, kinesis_endpoint=front.endpoint, retrieval_mode="FANOUT")
    delivered: list = []
    lock = threading.Lock()
    scheduler = Scheduler(config, recorder(delivered, lock, "a"))
    scheduler.start()
    try:
        expected = put_mixed(kinesis_local, stream, "parent", 100)
        (parent,) = kinesis.list_shards(StreamName=stream)["Shards"]
        low = int(parent["HashKeyRange"]["StartingHashKey"])
        high = int(parent["HashKeyRange"]["EndingHashKey"])
        kinesis.split_shard(StreamName=stream, ShardToSplit=parent["ShardId"],
                            NewStartingHashKey=str((low + high) // 2))
        emulators.wait_stream_active(kinesis, stream)
        expected |= put_mixed(kinesis_local, stream, "child", 100)
        wait_for(lambda: {r.binary_data.decode() for _, _, r, _ in delivered
                          if r != "SHARD_END"} >= expected, 60, "parent and children")
        # The children are subscribed now: what is written to them arrives within 2 s.
        put_at, put_epoch = time.monotonic(), time.time()
        late = put_mixed(front.endpoint, stream, "late", 20)  # as a producer on the front
        expected |= late
        wait_for(lambda: {r.binary_data.decode() for _, _, r, _ in delivered
                          if r != "SHARD_END"} >= expected, 10, "the late child records")
        late_at = max(at for _, _, r, at in delivered
                      if r != "SHARD_END" and r.binary_data.decode() in late)
        assert_pushed_by_live_subscriptions(front, delivered, late, put_epoch)
        print(f"the late child records in the worker {late_at - put_at:.2f} s after the put")
        assert late_at - put_at < 2.0  # docs/enhanced-fan-out.md's promise
    finally:
        scheduler.shutdown(timeout_s=10)
    data = Counter(r.binary_data.decode() for _, _, r, _ in delivered if r != "SHARD_END")
    assert set(data) == expected and max(data.values()) == 1
    order = [(shard, r) for _, shard, r, _ in delivered]
    parent_end = order.index((parent["ShardId"], "SHARD_END"))
    children = {shard for shard, _ in order} - {parent["ShardId"]}
    assert len(children) == 2
    assert all(index > parent_end for index, (shard, _) in enumerate(order)
               if shard in children)  # parents before children
    lease = emulators.client("dynamodb", config.dynamodb_endpoint).get_item(
        TableName=config.application_name, Key={"leaseKey": {"S": parent["ShardId"]}},
        ConsistentRead=True)["Item"]
    assert lease["checkpoint"]["S"] == "SHARD_END"
    assert set(lease["childShardIds"]["SS"]) == children
    # the parent's end came from its last event: a null continuation and ChildShards
    assert f"shard {parent['ShardId']} reached its end; children {sorted(children)}" in caplog.text
    assert front.count("GetRecords") == 0


@pytest.mark.timeout(60)
def test_a_shard_idle_at_latest_for_two_lifetimes_gets_its_first_records_within_2_s(
        aws_env, kinesis_local, make_stream, make_config, make_fanout_front):
    """The awslabs connector's fan-out looped silently on idle shards (its issue #91): here a
    shard read from LATEST, idle across two subscription lifetimes, is read at once."""
    stream = make_stream(1)
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1)
    put_mixed(kinesis_local, stream, "before-start", 10)  # LATEST: never delivered
    # polling's pause at the tip means nothing to a pushed shard
    config = make_config(stream, kinesis_endpoint=front.endpoint, retrieval_mode="FANOUT",
                         initial_position="LATEST", idle_time_between_reads_ms=5000)
    delivered: list = []
    scheduler = Scheduler(config, recorder(delivered, threading.Lock(), "a"))
    scheduler.start()
    try:
        (shard_id,) = emulators.list_shard_ids(kinesis_local, stream)
        started = time.time()
        wait_for(lambda: front.whole_lifetimes(shard_id, started) >= 2, 3 * LIFETIME_S + 10,
                 "two whole subscription lifetimes")
        put_at, put_epoch = time.monotonic(), time.time()
        expected = put_mixed(front.endpoint, stream, "after-idle", 10)  # as a producer would
        wait_for(lambda: len(delivered) >= len(expected), 10, "the records after the idle time")
    finally:
        scheduler.shutdown(timeout_s=10)
    assert {r.binary_data.decode() for _, _, r, _ in delivered} == expected
    assert_pushed_by_live_subscriptions(front, delivered, expected, put_epoch)
    print(f"the records after the idle time in the worker "
          f"{max(at for _, _, _, at in delivered) - put_at:.2f} s after the put")
    assert max(at for _, _, _, at in delivered) - put_at < 2.0  # the docs' promise


@pytest.mark.timeout(60)
def test_two_workers_registering_one_consumer_at_once_share_it(
        aws_env, kinesis_local, make_stream, make_config, make_fanout_front):
    from kinesis_dstream.aws.kinesis import KinesisClient
    from kinesis_dstream.aws.stream_consumer import register_stream_consumer

    stream = make_stream(1)
    front = make_fanout_front()
    config = make_config(stream, kinesis_endpoint=front.endpoint, retrieval_mode="FANOUT")
    arns: list[str] = []
    start = threading.Barrier(2)

    def register() -> None:
        kinesis = KinesisClient(config)
        start.wait()
        arns.append(register_stream_consumer(kinesis, "shared-name"))

    threads = [threading.Thread(target=register) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(arns) == 2 and arns[0] == arns[1]
    assert consumer_status(kinesis_local, stream, "shared-name") == "ACTIVE"


@pytest.mark.timeout(90)
def test_a_consumer_that_cannot_be_registered_is_a_clear_error_in_bounded_time(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, make_fanout_front):
    stream = make_stream(1)
    front = make_fanout_front()
    for index in range(20):  # the stream's limit
        emulators.register_consumer(kinesis_local, stream, f"other-{index}")
    config = make_config(stream, kinesis_endpoint=front.endpoint, retrieval_mode="FANOUT")
    scheduler = Scheduler(config, recorder([], threading.Lock(), "a"))
    started = time.monotonic()
    with pytest.raises(ConsumerRegistrationError) as failed:
        scheduler.start()
    assert time.monotonic() - started < 20
    message = str(failed.value)
    assert repr(config.application_name) in message and repr(stream) in message
    assert "20 consumers" in message


@pytest.mark.timeout(200)
@pytest.mark.parametrize("lifetime_s, run_s", [
    (LIFETIME_S, 0.0),
    counted_over_60_s(20.0, 60.0),
])
def test_kclpy_sample_properties_without_retrieval_mode_read_by_fan_out(
        local_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name,
        tmp_path: Path, make_fanout_front, daemons, lifetime_s, run_s) -> None:
    """amazon-kclpy's own samples/sample.properties (no retrievalMode, no polling key): the
    daemon registers a consumer named after the application and reads by fan-out, about
    one SubscribeToShard per shard and subscription lifetime."""
    import samples

    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=lifetime_s, heartbeat_s=1)
    puts = put_records(stream, [f"sample-{i}".encode() for i in range(120)])
    shipped = (Path(samples.__file__).parent / "sample.properties").read_text()
    keys = [line.split("=")[0].strip() for line in shipped.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    assert not {"retrievalMode", "maxRecords", "idleTimeBetweenReadsInMillis"} & set(keys)
    text = (shipped.replace("executableName = sample_kclpy_app.py",
                            f"executableName = {RECORDER}")
            .replace("stream/kclpysample", f"stream/{stream}")
            .replace("streamName = kclpysample", f"streamName = {stream}")
            .replace("applicationName = PythonKCLSample", f"applicationName = {unique_app_name}"))
    assert text.count(unique_app_name) == 1 and str(RECORDER) in text
    properties = tmp_path / "sample.properties"
    properties.write_text(text)
    log = tmp_path / "records.jsonl"
    started = time.monotonic()
    daemon = Daemon(properties, tmp_path, "fanout", KCLPY_RECORD_LOG=str(log),
                    AWS_ENDPOINT_URL_KINESIS=front.endpoint)
    daemons.append(daemon)
    for round_ in rounds_while(started, run_s, LIFETIME_S / 2):
        puts += put_records(stream, [f"during-{round_}-{i}".encode() for i in range(20)])
    wait_for_records(log, {p.sequence_number for p in puts}, daemon, timeout=60)
    elapsed = time.monotonic() - started
    subscribed = {s: front.count("SubscribeToShard", s)
                  for s in emulators.list_shard_ids(kinesis_local, stream)}
    logging.getLogger(__name__).info("%.0f s read; SubscribeToShard per shard: %s", elapsed,
                                     subscribed)
    assert daemon.stop() == 0, daemon.log()[-3000:]
    seen = Counter(r["seq"] for r in read_log(log))
    assert set(seen) == {p.sequence_number for p in puts} and max(seen.values()) == 1
    assert front.count("GetRecords") == 0
    # one per lifetime (the daemon's start-up is inside `elapsed`)
    assert all(1 <= n <= math.ceil(elapsed / lifetime_s) for n in subscribed.values()), (
        subscribed, f"{elapsed:.1f} s")
    assert consumer_status(kinesis_local, stream, unique_app_name) == "ACTIVE"
    assert "reads by enhanced fan-out" in daemon.log()
    # CloudWatch (moto): the KCL's ProcessTask metrics, and none of polling's GetRecords ones
    cloudwatch = emulators.client("cloudwatch", local_env["AWS_ENDPOINT_URL_CLOUDWATCH"])
    names = {m["MetricName"] for m in cloudwatch.list_metrics(
        Namespace=unique_app_name)["Metrics"]}
    assert {"RecordsProcessed", "MillisBehindLatest"} <= names, names
    assert not [name for name in names if name.startswith("KinesisDataFetcher")], names
