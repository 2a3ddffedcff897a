"""readStream.format("aws-kinesis") / format("kinesis") reading by enhanced fan-out.

Real Spark on the session's local-cluster (two executor processes: subscriptions live on
executors), the local fan-out front in front of kinesis-local (it counts every call per
shard, so "no GetRecords" and "SubscribeToShard per subscription lifetime" are counted),
moto for the range table. Records are put through the front, which pushes them at once.
Lifetimes stay above the 5 s takeover rule.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

import emulators
import test_sql_source
from spark_helpers import executor_jvm_of, listeners_caught_up, wait_until
from test_spark_chaos import executors_alive
from test_sql_source import (
    Batches,
    FailsFirstBatchOnce,
    FaultySource,
    KeyedProducer,
    ancestors_of,
    assert_parents_first,
    offsets_logged,
    open_shards,
    options,
    read_on_exactly_once,
    reshard,
    split_and_merge,
    stop,
)
from test_worker_fanout import counted_over_60_s
from waiting import wait_for

from kinesis_dstream.aws.range_table import range_table_name
from kinesis_dstream.sql.options import QUERY_CONSUMER_PREFIX

pytestmark = pytest.mark.spark

LIFETIME_S = 6.0  # beyond the 5 s rule: a renewal is never refused by it
TRIGGER = {"processingTime": "1 second"}
PRODUCER_EVERY_S = 0.5  # 10 records each time: 20 a second
BATCHES = 15  # batches over which subscriptions are counted


def consumers(endpoint: str, stream: str) -> dict[str, str]:
    """The stream's consumers by name, with their status."""
    kinesis = emulators.client("kinesis", endpoint)
    arn = kinesis.describe_stream_summary(StreamName=stream)[
        "StreamDescriptionSummary"]["StreamARN"]
    listed = kinesis.list_stream_consumers(StreamARN=arn)["Consumers"]
    return {c["ConsumerName"]: c["ConsumerStatus"] for c in listed}


def wait_deregistered(spark: Any, gone: Callable[[], bool], what: str, endpoint: str,
                      stream: str, timeout_s: float = 30.0) -> None:
    """A graceful stop() deregisters the consumer (the driver's query listener does it). On
    timeout: the stream's consumers then, and whether Spark's listener bus had told every
    event by then (a listener slow with events leaves the stop's untold)."""

    def state() -> str:
        try:
            listeners_caught_up(spark, 0)
            told = "every event told"
        except Exception as exc:  # noqa: BLE001 - a TimeoutException through py4j
            told = f"events still queued ({type(exc).__name__})"
        return f"consumers: {consumers(endpoint, stream)}; listener bus: {told}"

    wait_for(gone, timeout_s, f"{what} within {timeout_s:.0f} s of stop()", state,
             interval=0.2)


def start(spark: Any, fmt: str, opts: dict[str, str], checkpoint: str, sink: Batches) -> Any:
    df = spark.readStream.format(fmt).options(**opts).load()
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
            .trigger(**TRIGGER).start())


@pytest.mark.matrix
@pytest.mark.timeout(420)  # the session's Spark may start inside it (90 s loaded)
@pytest.mark.parametrize("lifetime_s, run_s", [
    (LIFETIME_S, 0.0),  # BATCHES batches
    counted_over_60_s(20.0, 60.0),
])
def test_aws_kinesis_reads_every_record_once_by_fan_out_and_deregisters_on_stop(
        spark, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path, lifetime_s: float, run_s: float):
    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=lifetime_s, heartbeat_s=1)
    before = emulators.put_records(front.endpoint, stream,
                                   [(f"pk-{i}", f"before-{i}") for i in range(100)])
    opts = options(stream, front.endpoint, dynamodb, unique_app_name,
                   **{"kinesis.consumerType": "SubscribeToShard",
                      "kinesis.consumerName": f"{unique_app_name}-c"})
    sink = Batches()
    query = start(spark, "aws-kinesis", opts, str(tmp_path / "cp"), sink)
    shards = emulators.list_shard_ids(kinesis_local, stream)
    producer = KeyedProducer(front.endpoint, stream, prefix="during", every_s=PRODUCER_EVERY_S)
    try:
        # registered when the query starts, ACTIVE before any task subscribes
        wait_until(lambda: consumers(kinesis_local, stream).get(f"{unique_app_name}-c")
                   == "ACTIVE", 30, "the consumer registered")
        wait_until(lambda: set(sink.data()) >= {r.data for r in before}, 120,
                   "the records put before the query")  # its Python workers have started
        producer.start()
        # Counted from here: BATCHES 1 s batches at least (and run_s), each a chance for a
        # shard's task to land on the other executor.
        counted_from, batch0 = time.monotonic(), len(sink.by_batch)
        counted_at = time.time()  # the clock of front.pushed
        subscribed0 = {s: front.count("SubscribeToShard", s) for s in shards}
        wait_until(lambda: len(sink.by_batch) >= batch0 + BATCHES
                   and time.monotonic() - counted_from >= run_s, 120 + run_s,
                   f"{BATCHES} batches and {run_s:.0f} s")
    except BaseException:
        producer.halt.set()
        stop(query)
        raise
    # every record once (those put before included)
    read_on_exactly_once(query, producer, sink, len(producer.sent) + 10,
                         also=[r.data for r in before])
    counted_s = time.monotonic() - counted_from
    subscribed = {s: front.count("SubscribeToShard", s) - subscribed0[s] for s in shards}
    print(f"SubscribeToShard per shard over {len(sink.by_batch) - batch0} batches in "
          f"{counted_s:.1f} s with {lifetime_s:.0f} s lifetimes: {subscribed}")
    for shard_id in shards:
        assert front.count("GetRecords", shard_id) == 0, shard_id
        # Each push came in a subscription, and the front ends each after lifetime_s (the
        # one held when counting began, by counted_at + lifetime_s): at least as many
        # subscribes as lifetime-long spans it takes to cover the shard's pushes since then.
        assert subscribed[shard_id] >= lifetimes_covering(
            [at for at, s in front.pushed if s == shard_id], counted_at, lifetime_s), \
            (shard_id, subscribed)
    # subscriptions outlive tasks wherever Spark places them: about one per lifetime, not
    # one each time a shard's task lands on another executor
    bound = counted_s / lifetime_s + 2
    assert all(n <= bound for n in subscribed.values()), (subscribed, f"{counted_s:.1f} s")
    # a graceful stop() deregisters the consumer, as the awslabs connector does
    wait_deregistered(spark, lambda: consumers(kinesis_local, stream).get(f"{unique_app_name}-c")
                      in (None, "DELETING"), "the consumer deregistered",
                      kinesis_local, stream)



def lifetimes_covering(pushed: list[float], since: float, lifetime_s: float) -> int:
    """How many subscriptions, none longer than ``lifetime_s``, the pushes after ``since``
    took at least, besides one begun before ``since`` (greedily: each push past the
    current span begins a new one)."""
    count, covered_to = 0, since + lifetime_s
    for at in sorted(at for at in pushed if at > since):
        if at > covered_to:
            count, covered_to = count + 1, at + lifetime_s
    return count


def query_named(endpoint: str, stream: str) -> set[str]:
    """The stream's consumers named after a query id (consumerMode efo, no consumerName)."""
    return {n for n, status in consumers(endpoint, stream).items()
            if n.startswith(QUERY_CONSUMER_PREFIX) and status != "DELETING"}


@pytest.mark.timeout(300)  # the session's Spark may start inside it (90 s loaded)
def test_a_query_stopped_between_its_first_plan_and_commit_keeps_its_one_query_named_consumer(
        spark, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    """consumerMode efo without consumerName: the consumer is named after the query id the
    checkpoint keeps, kept when the query ends (Databricks' default), used again by the
    restarted query (which reads every record once), and deregistered when
    requireConsumerDeregistration asks for it. The query ends in the window a user's stop may
    land in, held open: batch 0 in the offset log and not in the commit log. Spark then asks
    the restarted source for an initial offset again, whose new query id must not name (and
    register) a second consumer."""
    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1)
    opts = {"streamName": stream, "endpointUrl": front.endpoint, "region": "us-east-1",
            "kinesis.dynamodb.endpointUrl": dynamodb,
            "kinesis.dynamodb.tableName": unique_app_name,
            "initialPosition": "TRIM_HORIZON", "consumerMode": "efo",
            "kinesis.clientRetryIntervalsMs": "100"}
    checkpoint = str(tmp_path / "cp")
    sink = FailsFirstBatchOnce()
    producer = KeyedProducer(front.endpoint, stream, prefix="held", every_s=PRODUCER_EVERY_S)
    producer.start()
    query = start(spark, "kinesis", opts, checkpoint, sink)
    try:
        wait_until(lambda: not query.isActive, 120, "batch 0 to fail the query")
    finally:
        query.stop()
    assert "batch 0 held back" in str(query.exception()), query.exception()
    folder = Path(checkpoint)
    assert (folder / "offsets" / "0").exists() and not (folder / "commits" / "0").exists()
    named = {QUERY_CONSUMER_PREFIX + o["query"] for o in offsets_logged(checkpoint)}
    assert len(named) == 1 and query_named(kinesis_local, stream) == named
    # Kept (Databricks' default). The query ended before its first progress, which is where
    # the listener learns a query's sources, so this checks that nothing deregisters by the
    # name alone; whatever the listener does with the end (posted to its bus before stop()
    # returned) is done after this wait. The listener's own keep/deregister choice, for
    # queries past their first progress: test_sql_no_register.py and the restart below.
    listeners_caught_up(spark)
    assert consumers(kinesis_local, stream)[next(iter(named))] == "ACTIVE"
    shards = emulators.list_shard_ids(kinesis_local, stream)
    for shard_id in shards:  # read normally: by the subscription only
        assert front.count("GetRecords", shard_id) == 0, shard_id
    before = {s: (front.count("GetShardIterator", s), front.count("GetRecords", s))
              for s in shards}
    query = start(spark, "kinesis", {**opts, "requireConsumerDeregistration": "true"},
                  checkpoint, sink)
    try:
        wait_until(lambda: 0 in sink.by_batch or not query.isActive, 120,
                   "batch 0 run again")
    except BaseException:
        producer.halt.set()
        stop(query)
        raise
    assert query_named(kinesis_local, stream) == named  # no second consumer
    read_on_exactly_once(query, producer, sink, len(producer.sent) + 30, read_within_s=60)
    assert {o["query"] for o in offsets_logged(checkpoint)} == {n[len(QUERY_CONSUMER_PREFIX):]
                                                                for n in named}
    for shard_id in shards:
        # The restart recomputes batch 0, planned but not committed: that one recorded range
        # is read exactly, by GetRecords (one iterator, a page or two); the rest by the
        # subscription.
        iterators = front.count("GetShardIterator", shard_id) - before[shard_id][0]
        pages = front.count("GetRecords", shard_id) - before[shard_id][1]
        assert iterators <= 1 and pages <= 2 * iterators, (shard_id, iterators, pages)
    wait_deregistered(spark, lambda: not query_named(kinesis_local, stream),
                      "the query's one consumer deregistered (requireConsumerDeregistration)",
                      kinesis_local, stream)


# The timeout counts the fixtures too: the session's Spark start may fall in this test when it
# runs first on its worker. The bound the test is about is asserted from its own start.
@pytest.mark.timeout(240)
def test_a_consumer_that_cannot_be_registered_fails_the_query_naming_it(
        spark, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    stream = make_stream(1)
    front = make_fanout_front()
    for index in range(20):  # the stream's limit
        emulators.register_consumer(kinesis_local, stream, f"other-{index}")
    opts = options(stream, front.endpoint, dynamodb, unique_app_name,
                   **{"kinesis.consumerType": "SubscribeToShard",
                      "kinesis.consumerName": "one-too-many"})
    started = time.monotonic()
    query = start(spark, "aws-kinesis", opts, str(tmp_path / "cp"), Batches())
    try:
        wait_until(lambda: not query.isActive, 60, "the query to fail")
    finally:
        query.stop()
    assert time.monotonic() - started < 60
    message = str(query.exception())
    assert "'one-too-many'" in message and repr(stream) in message
    assert "20 consumers" in message


def fan_out(app: str, consumer: str | None = None) -> dict[str, str]:
    return {"kinesis.consumerType": "SubscribeToShard",
            "kinesis.consumerName": consumer or f"{app}-c"}


@pytest.mark.timeout(300)  # the session's Spark may start inside it (90 s loaded)
def test_a_task_retry_and_a_split_and_merge_under_load_by_fan_out_read_every_record_once(
        spark, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    """One query by fan-out through: a task that fails after recording its range (its retry
    hands out exactly what the failed one read, by GetRecords of that range), then a split
    and a merge under load (ChildShards end each parent's subscription; parents' records
    come in batches before their children's). Every record once."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(test_sql_source)
    spark.dataSource.register(FaultySource)
    stream = make_stream(1)
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1)
    opts = options(stream, front.endpoint, dynamodb, unique_app_name,
                   **fan_out(unique_app_name), **{"kinesis.test.faultDir": str(tmp_path)})
    sink = Batches()
    query = start(spark, "aws-kinesis-faulty", opts, str(tmp_path / "cp"), sink)
    producer = KeyedProducer(front.endpoint, stream, prefix="load", every_s=0.2)
    producer.start()
    failed = tmp_path / "failed.json"
    try:
        wait_until(failed.exists, 120, "the injected fault")
        split_and_merge(kinesis_local, stream, sink, within_s=60)
    except BaseException:
        producer.halt.set()
        stop(query)
        raise
    read_on_exactly_once(query, producer, sink, len(producer.sent) + 20, read_within_s=60)
    assert_parents_first(sink, ancestors_of(kinesis_local, stream))
    fault = json.loads(failed.read_text())
    shards = {row[0] for row in fault["rows"]}
    # Reading n is micro-batch n - 1: the retry delivered exactly what the failed task read.
    delivered = sorted((s, q, u) for s, q, u, _, _ in sink.by_batch[fault["reading"] - 1]
                       if s in shards)
    assert delivered == sorted(tuple(r) for r in fault["rows"])
    # The recorded range read again exactly, by one GetRecords page a shard (a recorded read
    # stops at the page holding its end); everything else pushed, each shard's records in
    # subscriptions of at most lifetime_s: at least one a lifetime-long span of its pushes.
    assert {s: front.count("GetRecords", s) for s in ancestors_of(kinesis_local, stream)} == \
        {s: int(s in shards) for s in ancestors_of(kinesis_local, stream)}, (shards, front.calls)
    for shard_id in ancestors_of(kinesis_local, stream):
        pushes = [at for at, s in front.pushed if s == shard_id]
        assert pushes and front.count("SubscribeToShard", shard_id) >= 1 + lifetimes_covering(
            pushes, min(pushes), LIFETIME_S), (shard_id, front.calls)


def listening_pid(port: int) -> int:
    """The process listening on TCP ``port`` (from /proc: the socket's inode, then the
    process holding it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in {f"socket:[{i}]" for i in inodes}:
                    return int(proc.name)
        except OSError:
            continue
    raise AssertionError(f"no process listens on port {port}")


def subscribers(dynamodb: str, app: str) -> set[str]:
    """The processes the recorded ranges name as holding their shard's subscription."""
    table = emulators.client("dynamodb", dynamodb)
    items = table.scan(TableName=range_table_name(app))["Items"]
    return {i["subscriber"]["S"] for i in items if "subscriber" in i}


@pytest.mark.timeout(300)  # the session's Spark may start inside it (90 s loaded)
def test_an_executor_killed_while_it_holds_a_subscription_loses_and_doubles_nothing(
        spark, sc, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    """kill -9 of the executor whose Python worker holds a shard's subscription (and serves
    it to the shard's tasks on the other executor): the interrupted task is retried on the
    other executor and reads its recorded range; the next task finds the holder gone and
    subscribes where it runs. Every record once."""
    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1)
    opts = options(stream, front.endpoint, dynamodb, unique_app_name, **fan_out(unique_app_name))
    sink = Batches()
    before = executors_alive(sc)
    producer = KeyedProducer(front.endpoint, stream, prefix="kill", every_s=0.2)
    query = start(spark, "aws-kinesis", opts, str(tmp_path / "cp"), sink)
    try:
        producer.start()
        wait_until(lambda: len(sink.data()) >= 50 and subscribers(dynamodb, unique_app_name),
                   90, "records read by a subscription")
        holder = sorted(subscribers(dynamodb, unique_app_name))[0]
        os.kill(executor_jvm_of(listening_pid(int(holder.rpartition(":")[2]))), signal.SIGKILL)
        sent_at_kill = len(producer.sent)
        read_on_exactly_once(query, producer, sink, sent_at_kill + 100, read_within_s=90)
    finally:
        producer.halt.set()
        if query.isActive:
            stop(query)
        wait_until(lambda: executors_alive(sc) >= before, 120, "the executor replaced")
    assert not any(front.count("GetRecords", s) > 2 * front.count("GetShardIterator", s)
                   for s in emulators.list_shard_ids(kinesis_local, stream))


class ArrivalTimes(Batches):
    """``Batches`` that also note when each record first reached the driver (epoch s), and
    in which micro-batch."""

    def __init__(self) -> None:
        super().__init__()
        self.seen_at: dict[bytes, float] = {}
        self.batch_of: dict[bytes, int] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        super().__call__(df, batch_id)
        now = time.time()
        for data in self.data():
            self.seen_at.setdefault(data, now)
            self.batch_of.setdefault(data, batch_id)


def put_timed(endpoint: str, stream: str, prefix: str, n: int = 12) -> tuple[list[bytes], float]:
    """``n`` records over a spread of keys (every shard of a split gets some); their data
    and when they were put (epoch s, as the call starts: a live subscription may push them
    before it returns)."""
    put_at = time.time()
    put = emulators.put_records(endpoint, stream, [(f"{prefix}-key{i}", f"{prefix}-{i}")
                                                   for i in range(n)])
    return [r.data for r in put], put_at


def promptness(query: Any, sink: ArrivalTimes, data: list[bytes], put_at: float,
               pushed_at: float) -> tuple[int, float, float, float]:
    """How promptly ``data``, put at ``put_at`` and pushed by ``pushed_at``, was read: how
    many micro-batches triggered after the push came before the one that brought the last
    of them (0: the first such, or an earlier one), how long after the put the push and
    that micro-batch's trigger were, and how long until they all reached the sink."""
    last = max(sink.batch_of[d] for d in data)
    progressed = lambda: [p for p in query.recentProgress if p["batchId"] == last]  # noqa: E731
    wait_until(progressed, 30, f"micro-batch {last}'s progress")
    triggered = {p["batchId"]: dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00"))
                 .timestamp() for p in query.recentProgress}
    later = [b for b, at in triggered.items() if at >= pushed_at and b < last]
    return (len(later), pushed_at - put_at, triggered[last] - put_at,
            max(sink.seen_at[d] for d in data) - put_at)


# The session's Spark may start inside it (90 s loaded); 48 s alone, 158 s beside three
# CPU-bound processes on 2 cores, and CI's load is heavier.
@pytest.mark.timeout(600)
def test_two_queries_registering_one_consumer_both_run_and_idle_and_child_shards_keep_up(
        spark, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    """Two queries start at once registering one consumer name: both run, on one consumer
    (taking its subscriptions over from each other: Kinesis has one per shard and consumer),
    and the first to stop keeps it for the other. The other's shard then stays idle at
    LATEST over two subscription lifetimes, is written to, then split: the records, and
    those written to the children once they are read, are pushed and come by the second
    micro-batch triggered after their push (the awslabs connector looped silently on such
    shards, its #91); those written as the parent ends wait for its end to be read. The last
    to stop deregisters the consumer."""
    stream = make_stream(1)
    (parent,) = emulators.list_shard_ids(kinesis_local, stream)
    # An idle shard's subscription polls the emulator every 0.2 s, not 1 s: Kinesis pushes a
    # shard's end (ChildShards) at once, and the front learns of a split only by polling.
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1, idle_poll_interval_s=0.2)
    name = f"{unique_app_name}-shared"
    sinks = [ArrivalTimes(), ArrivalTimes()]
    queries = [start(spark, "aws-kinesis", options(
        stream, front.endpoint, dynamodb, f"{unique_app_name}-{n}",
        **{"kinesis.startingPosition": "LATEST"}, **fan_out(unique_app_name, name)),
        str(tmp_path / f"cp{n}"), sink) for n, sink in enumerate(sinks)]
    try:
        wait_until(lambda: front.count("SubscribeToShard", parent) >= 2 or not all(
            q.isActive for q in queries), 90, "both queries subscribed")
        assert all(q.isActive for q in queries), [q.exception() for q in queries]
        assert consumers(kinesis_local, stream) == {name: "ACTIVE"}  # one, used by both
        both, _ = put_timed(front.endpoint, stream, "both")
        wait_until(lambda: all(set(s.seen_at) >= set(both) for s in sinks), 60,
                   "both queries' records")
        stop(queries[0])
        stopped_at = time.time()
        wait_until(lambda: front.whole_lifetimes(parent, stopped_at) >= 2, 10 * LIFETIME_S,
                   "two subscription lifetimes idle")
        assert consumers(kinesis_local, stream) == {name: "ACTIVE"}  # kept for the other
        late, put_at = put_timed(front.endpoint, stream, "idle")
        wait_until(lambda: set(sinks[1].seen_at) >= set(late), 30, "the idle shard's records")
        idle = promptness(queries[1], sinks[1], late, put_at,
                          front.pushed_since(put_at, {parent}))
        around_put = {  # what a failure needs to be understood: subscribes, refusals, triggers
            "subscribes_s_after_put": [round(at - put_at, 3) for at, s in front.subscribed
                                       if s == parent and at >= put_at - 10],
            "took_over_s_after_put": [round(at - put_at, 3) for at, s, took in front.succeeded
                                      if s == parent and took and at >= put_at - 20],
            "refused": dict(front.refused),
            "triggers_s_after_put": [round(dt.datetime.fromisoformat(
                p["timestamp"].replace("Z", "+00:00")).timestamp() - put_at, 3)
                for p in queries[1].recentProgress][-6:]}
        reshard(kinesis_local, stream, lambda k: k.split_shard(
            StreamName=stream, ShardToSplit=parent, NewStartingHashKey=str(2 ** 127)))
        children = {s["ShardId"] for s in open_shards(kinesis_local, stream)}
        young, put_at = put_timed(front.endpoint, stream, "young")  # as the parent ends
        wait_until(lambda: set(sinks[1].seen_at) >= set(young), 30, "the child shards' records")
        split = promptness(queries[1], sinks[1], young, put_at,
                           front.pushed_since(put_at, children))
        late_child, put_at = put_timed(front.endpoint, stream, "child")  # children read now
        wait_until(lambda: set(sinks[1].seen_at) >= set(late_child), 30, "the later records")
        child = promptness(queries[1], sinks[1], late_child, put_at,
                           front.pushed_since(put_at, children))
    finally:
        for query in queries:
            stop(query)
    wait_deregistered(spark, lambda: consumers(kinesis_local, stream).get(name) in (None, "DELETING"),
                      "the shared consumer deregistered once both stopped",
                      kinesis_local, stream)
    print(f"batches passed over, pushed, triggered and in the sink after the put: idle "
          f"shard {idle}, records put as the parent ended {split}, child shards {child}; "
          f"around the idle shard's put: {around_put}")
    # The idle shard's records, and a child shard's once it is read, are pushed by the
    # shard's subscription (the awslabs connector looped silently on such shards) and come by
    # the second micro-batch triggered after their push (the first one's read may begin
    # while the push is on its way to its process), whatever the machine's load; the
    # put -> sink seconds are printed above (quiet: within 2 s).
    assert idle[0] <= 1 and child[0] <= 1, (idle, child, around_put)
    # Records put as the parent ends wait for its end to be read (parents before children):
    # by the second micro-batch triggered after their push (the first may be the one that
    # reads the parent's end).
    assert split[0] <= 1 and split[3] <= 10.0, split
    assert sinks[0].data() == Counter(both)  # every record once
    assert sinks[1].data() == Counter(both + late + young + late_child)
    assert {r[0] for r in sinks[1].rows() if r[-1] in young} == children
    assert {r[0] for r in sinks[1].rows() if r[-1] in late_child} == children
    assert front.count("GetRecords") == 0
