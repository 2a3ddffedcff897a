"""createStream end to end when a lease is taken away: never checkpointed by us until it is
given back, then resumed at its checkpoint.

kinesis-local + moto, the session's one SparkContext (conftest ``sc``), 1 s batches.
"""
from __future__ import annotations

import time
import warnings

import pytest

from emulators import client
from spark_helpers import (
    count_words,
    create,
    lease,
    make_ssc,
    shard_records,
    unique_lines,
    wait_until,
    words_in,
)

from kinesis_dstream import KinesisUtils

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

pytestmark = pytest.mark.spark

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


# In the matrix: it runs long enough for the per-batch cost to show (on pyspark 3.5 with
# Python 3.11, every task re-read pyspark.zip, and its batches fell a minute behind).
@pytest.mark.matrix
def test_leases_reset_while_a_dstream_application_runs(sc, env, make_stream, unique_app_name):
    """``kinesis-dstream leases reset`` on a running StreamingContext (local-cluster): a dry
    run changes nothing; a reset of one shard to a sequence number makes the driver read
    again from the record after it (each of those records counted again, none before it),
    and over three more checkpoints the table never holds the old position before the
    records after the reset were read again (the driver wrote nothing of its old period)."""
    import contextlib
    import io
    import json
    import threading

    from kinesis_dstream import cli

    stream = make_stream(2)
    kinesis = client("kinesis", env["kinesis"])
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    victim, other = sorted(s["ShardId"] for s in shards)
    hash_key = {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in shards}
    produced: dict[str, list[str]] = {victim: [], other: []}

    def put(shard_id: str, n: int) -> list[str]:
        lines = unique_lines(n, sum(map(len, produced.values())))
        reply = kinesis.put_records(StreamName=stream, Records=[
            {"PartitionKey": "k", "ExplicitHashKey": hash_key[shard_id], "Data": line.encode()}
            for line in lines])
        assert reply["FailedRecordCount"] == 0, reply
        produced[shard_id].extend(lines)
        return lines

    def reset(*argv: str) -> dict:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["leases", "reset", "--app", unique_app_name, "--stream", stream,
                             "--json", "--kinesis-endpoint", env["kinesis"],
                             "--dynamodb-endpoint", env["dynamodb"], *argv])
        assert code == 0, out.getvalue()
        return json.loads(out.getvalue())

    def ids(lines: list[str]) -> set[str]:
        return {line.split()[-1] for line in lines}

    put(victim, 30)
    put(other, 10)
    ssc = make_ssc(sc)
    counts = count_words(create(ssc, unique_app_name, stream, env))
    ssc.start()
    samples: list[tuple[str, bool]] = []
    stop = threading.Event()
    try:
        everything = produced[victim] + produced[other]
        wait_until(lambda: dict(counts) == words_in(everything), 60, "the first records")
        records = shard_records(env, stream, victim)
        old = records[-1]["SequenceNumber"]
        wait_until(lambda: lease(env, unique_app_name, victim).get("checkpoint", {}).get("S")
                   == old, 15, "the victim shard checkpointed at its last record")
        # The other shard too: a checkpoint of it landing between the snapshot below and the
        # dry run's comparison would look like a write of the dry run (seen in CI).
        last_other = shard_records(env, stream, other)[-1]["SequenceNumber"]
        wait_until(lambda: lease(env, unique_app_name, other).get("checkpoint", {}).get("S")
                   == last_other, 15, "the other shard checkpointed at its last record")
        held = {key: (lease(env, unique_app_name, key).get("leaseOwner"),
                      lease(env, unique_app_name, key)["checkpoint"]) for key in (victim, other)}
        assert not any(m["written"] for m in reset("--all", "--to", "TRIM_HORIZON", "--dry-run")[
            "leases"])
        assert {key: (lease(env, unique_app_name, key).get("leaseOwner"),
                      lease(env, unique_app_name, key)["checkpoint"])
                for key in (victim, other)} == held
        target = records[9]["SequenceNumber"]
        again = ids(produced[victim][10:])

        def read_again() -> bool:
            return all(counts[i] >= 2 for i in again)

        def sample() -> None:
            # The table first, then the counts: a checkpoint at the old position seen before
            # the records after the reset were counted again was written by the old period.
            while not stop.is_set():
                checkpoint = lease(env, unique_app_name, victim)["checkpoint"]["S"]
                samples.append((checkpoint, read_again()))
                time.sleep(0.1)

        (moved,) = reset("--shard", victim, "--to", target)["leases"]
        assert moved["written"]
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        wait_until(read_again, 60, "the records after the reset read again")
        for wave in range(3):
            lines = put(victim, 5)
            wait_until(lambda lines=lines: all(counts[i] >= 1 for i in ids(lines)), 60,
                       f"wave {wave}")
        last = shard_records(env, stream, victim)[-1]["SequenceNumber"]
        wait_until(lambda: lease(env, unique_app_name, victim)["checkpoint"]["S"] == last, 30,
                   "the last wave checkpointed")
    finally:
        stop.set()
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert all(counts[i] == 1 for i in ids(produced[victim][:10] + produced[other])), \
        "read from before the new position"
    assert all(counts[i] >= 2 for i in again)
    assert all(counts[i] >= 1 for i in ids(produced[victim][30:]))
    assert samples
    assert not [s for s in samples if s[0] == old and not s[1]], samples[:20]
    seen = [int(s[0]) for s in samples if s[0].isdigit()]
    after = seen[next(i for i, v in enumerate(seen) if v == int(target)):]
    assert after == sorted(after), "the checkpoint went back after the reset"
    assert len(set(after)) >= 4, "three checkpoints after the one at the reset"
