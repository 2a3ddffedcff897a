"""createStream end to end, the paths test_spark_stream.py leaves out: two worker processes,
a KCL properties file as the settings source, resharding mid-run, maxRate, lease loss.

kinesis-local + moto, master local[2] (the session's one SparkContext, conftest ``sc``),
1 s batches, a new StreamingContext per test stopped with stopSparkContext=False.
"""
from __future__ import annotations

import re
import threading
import time
import warnings
from collections import Counter

import pytest

from emulators import client, list_shard_ids, wait_stream_active
from spark_helpers import count_words, create, leases, make_ssc, wait_until, word_lines, words_in

from kinesis_dstream import KinesisUtils
from kinesis_dstream.config import SPARK_RECEIVER_MAX_RATE
from kinesis_dstream.spark.registry import planners

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

@pytest.fixture
def env(aws_env, kinesis_local, dynamodb):
    return dict(kinesis=kinesis_local, dynamodb=dynamodb)


def lease(env, app: str, shard_id: str) -> dict:
    return client("dynamodb", env["dynamodb"]).get_item(
        TableName=app, Key={"leaseKey": {"S": shard_id}}, ConsistentRead=True)["Item"]


def shard_records(env, stream: str, shard_id: str) -> list[dict]:
    """Every record of one shard (our volumes fit a few pages)."""
    kinesis = client("kinesis", env["kinesis"])
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    out: list[dict] = []
    while iterator:
        page = kinesis.get_records(ShardIterator=iterator, Limit=10000)
        out.extend(page["Records"])
        iterator = page.get("NextShardIterator")
        if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
            break
    return out


def config_of(stream: str):
    found = [p.config for p in planners()
             if p.config.stream_name == stream and not p.coordinator.stopped]
    assert len(found) == 1, found
    return found[0]


def unique_lines(n: int, start: int = 0) -> list[str]:
    """Word-count lines, each ending in a word of its own: a word counted twice shows a
    record counted twice."""
    return [f"{line} id{i}" for i, line in enumerate(word_lines(n + start)[start:], start)]


def duplicated_ids(counts: Counter) -> dict[str, int]:
    return {w: c for w, c in counts.items() if w.startswith("id") and c > 1}


# --------------------------------------------------------------------------- 1. union

def test_four_input_streams_with_one_application_split_the_shards_and_resume(
        sc, env, make_stream, put_records, unique_app_name):
    """The Scala sample's scaling pattern: four createStream calls, one application name,
    unioned over a 4-shard stream. One coordinator in the driver assigns each shard to one
    of them: exact counts. A second run resumes from the checkpoints: exact again."""
    stream = make_stream(4)
    lines = unique_lines(1600)
    halves = (lines[:800], lines[800:])
    for run, half in enumerate(halves):
        offset = 800 * run
        put_records(stream, [(f"pk{i}", line) for i, line in enumerate(half, offset)])
        ssc = make_ssc(sc)
        streams = [create(ssc, unique_app_name, stream, env) for _ in range(4)]
        counts = count_words(ssc.union(*streams))
        ssc.start()
        try:
            wait_until(lambda: sum(counts.values()) >= sum(words_in(half).values()), 60,
                       f"run {run}: every record")
            per_stream = [set(s.metrics()) for s in streams]
            assert all(len(shards) == 1 for shards in per_stream), per_stream
            assert set.union(*per_stream) == set(list_shard_ids(env["kinesis"], stream))
            counts.settle()
        finally:
            ssc.stop(stopSparkContext=False, stopGraceFully=True)
        assert not duplicated_ids(counts)
        assert counts == words_in(half), f"run {run}"
        assert all("leaseOwner" not in item for item in leases(env, unique_app_name).values())


# --------------------------------------------------------------------------- 2. properties file

def test_properties_file_settings_with_arguments_and_overrides_on_top(
        sc, env, tmp_path, make_stream, put_records, unique_app_name):
    stream = make_stream(1)
    lines = unique_lines(240)
    put_records(stream, [("k", line) for line in lines[:120]])  # before start: needs TRIM_HORIZON
    properties = tmp_path / "wordcount.properties"
    properties.write_text(f"""\
# The file names another application and a dead Kinesis endpoint: createStream's
# arguments must win over both. Everything else comes from here.
streamName = {stream}
applicationName = not-{unique_app_name}
regionName = us-east-1
kinesisEndpoint = http://127.0.0.1:9
dynamoDBEndpoint = {env["dynamodb"]}
AWSCredentialsProvider = DefaultAWSCredentialsProviderChain
initialPositionInStream = TRIM_HORIZON
maxRecords = 7
idleTimeBetweenReadsInMillis = 50
failoverTimeMillis = 3000
shardSyncIntervalMillis = 2000
parentShardPollIntervalMillis = 200
shutdownGraceMillis = 8000
metricsLevel = NONE
""")
    ssc = make_ssc(sc)
    # checkpointInterval 600 s from the arguments; configOverrides brings it down to 0.5 s
    # (a checkpoint must show up while running) and wins over the file's idle time too.
    kstream = KinesisUtils.createStream(
        ssc, unique_app_name, stream, env["kinesis"], "us-east-1", None, 600,
        propertiesFile=str(properties),
        configOverrides={"checkpoint_interval_ms": 500, "idle_time_between_reads_ms": 20})
    config = config_of(stream)
    assert (config.application_name, config.kinesis_endpoint) == (unique_app_name, env["kinesis"])
    assert (config.initial_position, config.max_records, config.failover_time_ms) == \
        ("TRIM_HORIZON", 7, 3000)
    assert (config.checkpoint_interval_ms, config.idle_time_between_reads_ms) == (500, 20)
    assert config.dynamodb_endpoint == env["dynamodb"] and config.metrics_level == "NONE"
    counts = count_words(kstream)
    ssc.start()
    try:
        wait_until(lambda: sum(counts.values()) >= sum(words_in(lines[:120]).values()), 60,
                   "the records put before the start (TRIM_HORIZON from the file)")
        shard_id = list_shard_ids(env["kinesis"], stream)[0]
        wait_until(lambda: "checkpoint" in lease(env, unique_app_name, shard_id), 15,
                   "the first checkpoint")
        # A shard's first checkpoint goes out at once; the next waits for the interval.
        put_records(stream, [("k", line) for line in lines[120:]])
        wait_until(lambda: sum(counts.values()) >= sum(words_in(lines).values()), 60,
                   "the records put after the start")
        last = shard_records(env, stream, shard_id)[-1]["SequenceNumber"]
        wait_until(lambda: lease(env, unique_app_name, shard_id)["checkpoint"]["S"] == last, 10,
                   "a second checkpoint while running (configOverrides' 0.5 s, not the "
                   "argument's 600 s)")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert counts == words_in(lines)
    metrics = KinesisUtils.metrics(stream)
    assert sum(m["records"] for m in metrics.values()) == len(lines)
    ddb = client("dynamodb", env["dynamodb"])
    assert unique_app_name in ddb.list_tables()["TableNames"]
    assert f"not-{unique_app_name}" not in ddb.list_tables()["TableNames"]


# --------------------------------------------------------------------------- 3. resharding

def test_split_while_counting_ends_parent_only_after_its_records(sc, env, make_stream,
                                                                 put_records, unique_app_name):
    stream = make_stream(2)
    kinesis = client("kinesis", env["kinesis"])
    parent = sorted(kinesis.list_shards(StreamName=stream)["Shards"],
                    key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))[0]
    parent_id = parent["ShardId"]
    produced: list[str] = []
    seen: list[tuple[str, str]] = []  # (shard id, line)
    violations: list[str] = []
    lock = threading.Lock()
    ddb = client("dynamodb", env["dynamodb"])

    def put_lines(n: int) -> None:
        start = len(produced)
        batch = unique_lines(n, start)
        put_records(stream, [(f"key-{i % 16}", line) for i, line in enumerate(batch, start)])
        produced.extend(batch)

    put_lines(200)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, env,
                     messageHandler=lambda r: (r.shard_id, r.data.decode()))

    def check_and_keep(rdd):
        rows = rdd.collect()
        if any(shard == parent_id for shard, _ in rows):
            # This batch holds parent records and has not completed: SHARD_END must not be
            # written yet (Spark's receiver writes it as soon as the records are stored).
            item = ddb.get_item(TableName=unique_app_name, Key={"leaseKey": {"S": parent_id}},
                                ConsistentRead=True).get("Item", {})
            if item.get("checkpoint", {}).get("S") == "SHARD_END":
                violations.append(f"SHARD_END written while a batch held {parent_id}'s records")
        with lock:
            seen.extend(rows)
            batches[0] += 1

    batches = [0]
    kstream.foreachRDD(check_and_keep)
    producing = threading.Event()
    producing.set()
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            while producing.is_set():
                put_lines(20)
                time.sleep(0.2)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    ssc.start()
    thread = threading.Thread(target=producer, daemon=True)
    try:
        wait_until(lambda: len(seen) >= 200, 60, "the backlog")
        thread.start()
        wait_until(lambda: len(produced) >= 300, 30, "records put while counting")
        hash_range = parent["HashKeyRange"]
        low, high = int(hash_range["StartingHashKey"]), int(hash_range["EndingHashKey"])
        kinesis.split_shard(StreamName=stream, ShardToSplit=parent_id,
                            NewStartingHashKey=str((low + high) // 2))
        wait_stream_active(kinesis, stream)
        children = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]
                    if s.get("ParentShardId") == parent_id]
        assert len(children) == 2, children
        wait_until(lambda: {s for s, _ in list(seen)} >= set(children), 45,
                   "records from both child shards")
        more = len(produced) + 100
        wait_until(lambda: len(produced) >= more, 30, "more records after the split")
        producing.clear()
        thread.join(10)
        assert not errors, errors
        wait_until(lambda: len(seen) >= len(produced), 60, "every record produced")
        settled = batches[0] + 2
        wait_until(lambda: batches[0] >= settled, 30, "two more batches: nothing counted twice")
    finally:
        producing.clear()
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert not violations, violations
    lines_seen = [line for _, line in seen]
    assert Counter(w for line in lines_seen for w in line.split()) == words_in(produced)
    assert not duplicated_ids(Counter(lines_seen))

    items = leases(env, unique_app_name)
    assert set(items) == set(list_shard_ids(env["kinesis"], stream)) | {parent_id}
    assert items[parent_id]["checkpoint"]["S"] == "SHARD_END"
    assert set(items[parent_id]["childShardIds"]["SS"]) == set(children)
    for shard_id, item in items.items():
        assert "leaseOwner" not in item, item
        if shard_id != parent_id:
            records = shard_records(env, stream, shard_id)
            assert records, shard_id
            assert item["checkpoint"]["S"] == records[-1]["SequenceNumber"], (shard_id, item)
    for child in children:
        assert items[child]["parentShardId"]["SS"] == [parent_id]


# --------------------------------------------------------------------------- 4. maxRate

def test_receiver_max_rate_caps_every_batch(sc, env, make_stream, put_records, unique_app_name,
                                            caplog):
    """maxRate spreads a backlog over batches of at most its rate. Each capped batch stopped
    before a shard's tip, so the next one is read early, as soon as Spark has asked for the
    capped one (one batch ahead of its clock); the first is read at the context's start."""
    from kinesis_dstream.spark.dstream import _first_batch_ms

    caplog.set_level("DEBUG", logger="kinesis_dstream.spark")
    stream = make_stream(2)
    total = 1000
    put_records(stream, [(f"k{i}", f"r{i}") for i in range(total)])
    ssc = make_ssc(sc)
    # The SparkContext is the session's; createStream reads the rate settings from its conf
    # (RateSettings.from_spark_conf), once: set the key for this call only.
    jconf = sc._conf._jconf
    before = jconf.get(SPARK_RECEIVER_MAX_RATE) if jconf.contains(SPARK_RECEIVER_MAX_RATE) else None
    jconf.set(SPARK_RECEIVER_MAX_RATE, "200")
    try:
        kstream = create(ssc, unique_app_name, stream, env)
    finally:
        if before is None:
            jconf.remove(SPARK_RECEIVER_MAX_RATE)
        else:
            jconf.set(SPARK_RECEIVER_MAX_RATE, before)
    sizes: list[int] = []
    times: list[int] = []
    rows: list[str] = []
    lock = threading.Lock()

    def keep(time, rdd):
        got = rdd.collect()
        with lock:
            sizes.append(len(got))
            times.append(round(time.timestamp() * 1000))
            rows.extend(got)

    kstream.foreachRDD(keep)
    ssc.start()
    started = time.time()
    first_ms = _first_batch_ms(ssc)
    try:
        wait_until(lambda: len(rows) >= total, 60, "the whole backlog")
        settled = len(sizes) + 2
        wait_until(lambda: len(sizes) >= settled, 30, "two more batches")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert max(sizes) <= 200, sizes
    # The cap (200 a batch, 100 a shard) is what spread the backlog over batches.
    assert sum(1 for s in sizes if s > 0) >= total // 200, sizes
    assert sorted(rows) == sorted(f"r{i}" for i in range(total))
    assert first_ms == min(times), (first_ms, times)  # the batch the start reads early
    early = {int(m) for m in re.findall(r"batch (\d+) is read early", caplog.text)}
    with_data = sorted(t for t, n in zip(times, sizes) if n)
    assert set(with_data[1:]) <= early, (with_data, sorted(early))
    # the start's early read of the first batch loses only to a batch due at once
    assert first_ms in early or first_ms / 1000 - started < 0.05, (first_ms, started, early)
    assert max(early) <= max(times) + 1000  # never more than one batch ahead


# --------------------------------------------------------------------------- 5. lease loss

OUTSIDER = "outside-writer"


def test_lease_taken_away_is_never_checkpointed_by_us_until_given_back(
        sc, env, make_stream, unique_app_name):
    stream = make_stream(2)
    kinesis = client("kinesis", env["kinesis"])
    ddb = client("dynamodb", env["dynamodb"])
    shard_ids = sorted(s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"])
    hash_keys = {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"]
                 for s in kinesis.list_shards(StreamName=stream)["Shards"]}
    victim, other = shard_ids
    produced: list[str] = []

    def put(shard_id: str, n: int) -> None:
        start = len(produced)
        batch = unique_lines(n, start)
        reply = kinesis.put_records(StreamName=stream, Records=[
            {"PartitionKey": "k", "ExplicitHashKey": hash_keys[shard_id], "Data": line.encode()}
            for line in batch])
        assert reply["FailedRecordCount"] == 0, reply
        assert {r["ShardId"] for r in reply["Records"]} == {shard_id}
        produced.extend(batch)

    put(victim, 60)
    put(other, 60)
    ssc = make_ssc(sc)
    counts = count_words(create(ssc, unique_app_name, stream, env))
    ssc.start()
    outside_renews = 0
    try:
        wait_until(lambda: dict(counts) == words_in(produced), 60, "the first records")
        last_victim = shard_records(env, stream, victim)[-1]["SequenceNumber"]
        wait_until(lambda: lease(env, unique_app_name, victim).get("checkpoint", {}).get("S")
                   == last_victim, 15, "the victim shard checkpointed at its last record")

        # The outside writer takes the lease the way a stealing KCL worker would.
        for _ in range(20):
            item = lease(env, unique_app_name, victim)
            counter = int(item["leaseCounter"]["N"])
            try:
                ddb.update_item(
                    TableName=unique_app_name, Key={"leaseKey": {"S": victim}},
                    UpdateExpression="SET leaseOwner = :o, leaseCounter = :n",
                    ConditionExpression="leaseCounter = :c",
                    ExpressionAttributeValues={":o": {"S": OUTSIDER}, ":n": {"N": str(counter + 1)},
                                               ":c": {"N": str(counter)}})
                counter += 1
                break
            except ddb.exceptions.ConditionalCheckFailedException:
                continue  # our worker renewed meanwhile: read again
        else:
            raise AssertionError("the outside writer could not take the lease")
        taken = lease(env, unique_app_name, victim)
        assert taken["checkpoint"]["S"] == last_victim
        wait_until(lambda: KinesisUtils.metrics(stream)[victim]["state"] == "lost", 15,
                   "our worker noticing the loss on its next renew")

        def renew_as_outsider() -> None:
            """Renew as the owner; fails if anyone else wrote the lease since our last write."""
            nonlocal counter, outside_renews
            try:
                ddb.update_item(
                    TableName=unique_app_name, Key={"leaseKey": {"S": victim}},
                    UpdateExpression="SET leaseCounter = :n",
                    ConditionExpression="leaseCounter = :c AND leaseOwner = :o",
                    ExpressionAttributeValues={":o": {"S": OUTSIDER}, ":n": {"N": str(counter + 1)},
                                               ":c": {"N": str(counter)}})
            except ddb.exceptions.ConditionalCheckFailedException:
                raise AssertionError(f"someone wrote {victim} while the outside writer held it: "
                                     f"{lease(env, unique_app_name, victim)}") from None
            counter += 1
            outside_renews += 1

        # While the outsider holds it: new records of both shards; only the other's are counted.
        words_before = sum(counts.values())
        put(victim, 40)
        put(other, 40)
        other_lines = produced[-40:]
        deadline = time.monotonic() + 8  # > failover time (3 s) + renew and taker periods
        other_done = False
        # Past the failover time, and until the other shard's records are counted (a loaded
        # machine runs batches slower): the outsider keeps the lease all along.
        while time.monotonic() < deadline or (not other_done and time.monotonic() < deadline + 30):
            renew_as_outsider()
            other_done = other_done or sum(counts.values()) >= words_before + sum(
                words_in(other_lines).values())
            time.sleep(0.5)
        assert other_done, "the other shard stopped flowing"
        victim_lines = produced[-80:-40]
        assert all(counts[line.split()[-1]] == 0 for line in victim_lines), \
            "records of a lease held by someone else were counted"
        item = lease(env, unique_app_name, victim)
        assert item["leaseOwner"]["S"] == OUTSIDER and item["checkpoint"]["S"] == last_victim

        # The outsider gives it back; our worker takes it and goes on from the checkpoint.
        ddb.update_item(
            TableName=unique_app_name, Key={"leaseKey": {"S": victim}},
            UpdateExpression="REMOVE leaseOwner SET leaseCounter = :n",
            ConditionExpression="leaseCounter = :c",
            ExpressionAttributeValues={":n": {"N": str(counter + 1)}, ":c": {"N": str(counter)}})
        # Batches may run seconds behind their time on a loaded 2-core machine: the ones
        # generated before the lease came back do not hold the shard.
        wait_until(lambda: dict(counts) == words_in(produced), 90,
                   "the held-back records after the lease came back")
        counts.settle()
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert outside_renews >= 10
    assert counts == words_in(produced)  # resumed at the checkpoint: nothing read twice
    item = lease(env, unique_app_name, victim)
    assert "leaseOwner" not in item
    assert item["checkpoint"]["S"] == shard_records(env, stream, victim)[-1]["SequenceNumber"]
