"""kill -9 of the Spark driver mid-stream, then StreamingContext.getOrCreate recovery.

Every record is counted at least once; a record counted again after the restart lies
after its shard's last checkpointed position (it was in a batch after the last completed
one). The recovered driver takes the dead one's leases once they expire.
"""
from __future__ import annotations

import signal
import threading
import time

import pytest

from spark_helpers import leases_at as leases
from spark_helpers import read_rows, start_driver, wait_until

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("fanout", [pytest.param(False, id="polling", marks=pytest.mark.matrix),
                                    pytest.param(True, id="fanout")])
def test_kill_driver_then_get_or_create(tmp_path, aws_env, kinesis_local, dynamodb, make_stream,
                                        put_records, unique_app_name, make_fanout_front, fanout):
    """By polling, and by enhanced fan-out through the local fan-out front (the dead driver's
    subscriptions, if its workers outlive it, are taken over by the recovered one's)."""
    kinesis = make_fanout_front(lifetime_s=8.0).endpoint if fanout else kinesis_local
    stream = make_stream(2)
    puts = put_records(stream, [(f"k{i}", f"r{i}") for i in range(200)], endpoint=kinesis)
    producing = threading.Event()

    def produce() -> None:
        i = 200
        while producing.is_set():
            puts.extend(put_records(stream, [(f"k{j}", f"r{j}") for j in range(i, i + 20)],
                                    endpoint=kinesis))
            i += 20
            time.sleep(0.1)

    producer = threading.Thread(target=produce, daemon=True)
    driver, out1, _ = start_driver(tmp_path, 1, unique_app_name, stream, kinesis, dynamodb,
                                   checkpoint=True, fanout=fanout)
    try:
        wait_until(lambda: len(read_rows(out1)) >= 200, 120, "the first records")

        def checkpointed() -> bool:
            items = leases(dynamodb, unique_app_name).values()
            return len(items) == 2 and all(i["checkpoint"]["S"].isdigit() for i in items)

        wait_until(checkpointed, 30, "checkpoints of both shards")
        # keep records flowing, and kill the driver while they do
        producing.set()
        producer.start()
        wait_until(lambda: len(read_rows(out1)) > 400, 60, "records of the second phase")
        # Spark writes its checkpoint a few batches behind the batches that complete; by
        # fan-out 400 records come within seconds of the first batch, and a kill before that
        # first file leaves getOrCreate nothing to recover: it makes a new context, whose
        # driver is a stranger to the dead one and waits out its leases.
        wait_until(lambda: any((tmp_path / "checkpoint").glob("checkpoint-*")), 60,
                   "Spark's first checkpoint")

        def processed_past_checkpoints() -> bool:
            """The kill lands mid-stream: records counted that no checkpoint covers yet (with
            fan-out a batch's checkpoint often follows its output at once, so a kill at an
            arbitrary moment can find nothing to count again)."""
            items = leases(dynamodb, unique_app_name)
            done = {s: (int(i["checkpoint"]["S"]),
                        int(i.get("checkpointSubSequenceNumber", {"N": "0"})["N"]))
                    for s, i in items.items() if i["checkpoint"]["S"].isdigit()}
            return any(s in done and (q, u) > done[s] for s, q, u, _ in read_rows(out1))

        wait_until(processed_past_checkpoints, 60, "records counted past the checkpoints")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        producing.clear()
        if producer.is_alive():
            producer.join()
    # The dead driver's leases stay owned until they expire; its checkpoints stay as they were.
    checkpoints = {s: (int(i["checkpoint"]["S"]), int(i.get("checkpointSubSequenceNumber",
                                                              {"N": "0"})["N"]))
                   for s, i in leases(dynamodb, unique_app_name).items()}
    dead = {i["leaseOwner"]["S"] for i in leases(dynamodb, unique_app_name).values()}
    puts += put_records(stream, [(f"k{i}", f"r{i}") for i in range(100_000, 100_100)],
                        endpoint=kinesis)

    owners: set[str] = set()

    def new_owners() -> bool:  # the recovered driver's leases, while it runs
        items = leases(dynamodb, unique_app_name).values()
        owners.update(i["leaseOwner"]["S"] for i in items if "leaseOwner" in i)
        return bool(owners - dead)

    out2 = _recover_and_expect_every_record(tmp_path, unique_app_name, stream, kinesis,
                                            dynamodb, puts, out1, "3", while_running=new_owners)
    # A worker id of its own (not the dead one's, pickled in the checkpoint), and the dead
    # driver's leases taken at once: its process is provably gone from this host.
    assert len(dead) == 1 and owners - dead, (dead, owners)
    assert f"from driver {dead.pop()}, which is dead" in (tmp_path / "driver-2.log").read_text()
    log2 = (tmp_path / "driver-2.log").read_text()
    first_run = {(s, q) for s, q, _, _ in read_rows(out1)}
    recounted = [(shard, seq, sub) for shard, seq, sub, _ in read_rows(out2)
                 if (shard, seq) in first_run]
    for shard, seq, sub in recounted:  # counted again: only after the last checkpoint
        assert (seq, sub) > checkpoints[shard], (shard, seq, checkpoints[shard])
    below = [(s, q) for s, q, u, _ in read_rows(out2) if (q, u) <= checkpoints[s]]
    assert below == [], "records at or before a checkpoint were read again"
    # the kill came mid-stream: processed but not yet checkpointed records came again
    assert recounted, "expected records processed after the last checkpoint to be re-counted"
    # the recovered context's graceful stop released its leases
    assert all("leaseOwner" not in i for i in leases(dynamodb, unique_app_name).values()), log2[-3000:]


def test_kill_while_a_batch_is_held_past_a_due_checkpoint_checkpoints_only_completed_batches(
        tmp_path, aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name):
    """A kill at a chosen moment, not a random one: a batch that read records is held in its
    output operation for two lease renewals (a checkpoint is due every second meanwhile),
    and the driver is killed there. No checkpoint may lie beyond what was written out, and
    the recovered driver then delivers every record."""
    stream = make_stream(2)
    puts = put_records(stream, [(f"k{i}", f"a{i}") for i in range(50)])
    hold = tmp_path / "hold"
    driver, out1, _ = start_driver(tmp_path, 1, unique_app_name, stream, kinesis_local, dynamodb,
                                   checkpoint=True, checkpoint_interval="1", hold=hold)
    try:
        wait_until(lambda: len(read_rows(out1)) >= 50, 120, "the first records")

        def checkpointed_through_output() -> bool:
            items = leases(dynamodb, unique_app_name)
            written = _highest_written(out1)
            return len(items) == 2 and all(
                _checkpoint_of(i) >= written.get(s, (0, 0)) for s, i in items.items())

        wait_until(checkpointed_through_output, 30, "checkpoints of the first records")
        hold.touch()
        puts += put_records(stream, [(f"k{i}", f"b{i}") for i in range(50)])
        wait_until(lambda: (tmp_path / "hold.held").exists(), 60, "a batch held")
        counters = {s: int(i["leaseCounter"]["N"]) for s, i in leases(dynamodb, unique_app_name).items()}
        # Two renewals of every lease (every 1 s here): the coordinator's checkpoint pass,
        # which runs every 0.2 s, has had every chance to write what it holds due.
        wait_until(lambda: all(int(i["leaseCounter"]["N"]) >= counters[s] + 2
                               for s, i in leases(dynamodb, unique_app_name).items()),
                   30, "two lease renewals while the batch is held")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    written = _highest_written(out1)
    for shard, item in leases(dynamodb, unique_app_name).items():
        assert _checkpoint_of(item) <= written.get(shard, (0, 0)), \
            (shard, _checkpoint_of(item), written.get(shard))
    hold.unlink()
    _recover_and_expect_every_record(tmp_path, unique_app_name, stream, kinesis_local, dynamodb,
                                     puts, out1, "1")


def _recover_and_expect_every_record(tmp_path, app, stream, kinesis, dynamodb, puts, out1,
                                     checkpoint_interval: str, while_running=lambda: True):
    """A second driver from the same checkpoint directory: every record put is seen by one of
    the two runs (and ``while_running()`` holds once); it then stops gracefully. Returns its
    output file."""
    driver, out2, stop2 = start_driver(tmp_path, 2, app, stream, kinesis, dynamodb,
                                       checkpoint=True, checkpoint_interval=checkpoint_interval)
    try:
        expected = {(p.shard_id, int(p.sequence_number)) for p in puts}
        seen = lambda: {(s, q) for s, q, _, _ in read_rows(out1) + read_rows(out2)}  # noqa: E731
        wait_until(while_running, 120, "the recovered driver at work")
        wait_until(lambda: expected <= seen(), 120, "every record after the restart")
        stop2.touch()
        assert driver.wait(90) == 0, (tmp_path / "driver-2.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    return out2


def _checkpoint_of(item: dict) -> tuple[int, int]:
    value = item["checkpoint"]["S"]
    if not value.isdigit():
        return (0, 0)  # TRIM_HORIZON: before every record
    return int(value), int(item.get("checkpointSubSequenceNumber", {"N": "0"})["N"])


def _highest_written(out) -> dict[str, tuple[int, int]]:
    highest: dict[str, tuple[int, int]] = {}
    for shard, seq, sub, _ in read_rows(out):
        highest[shard] = max(highest.get(shard, (0, 0)), (seq, sub))
    return highest
