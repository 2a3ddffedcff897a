"""kill -9 of the Spark driver mid-stream, then StreamingContext.getOrCreate recovery.

Every record is counted at least once; a record counted again after the restart lies
after its shard's last checkpointed position (it was in a batch after the last completed
one). The recovered driver takes the dead one's leases once they expire.
"""
from __future__ import annotations

import signal
import threading
import time

from spark_helpers import leases_at as leases
from spark_helpers import read_rows, start_driver, wait_until

def test_kill_driver_then_get_or_create(tmp_path, aws_env, kinesis_local, dynamodb, make_stream,
                                        put_records, unique_app_name):
    stream = make_stream(2)
    puts = put_records(stream, [(f"k{i}", f"r{i}") for i in range(200)])
    producing = threading.Event()

    def produce() -> None:
        i = 200
        while producing.is_set():
            puts.extend(put_records(stream, [(f"k{j}", f"r{j}") for j in range(i, i + 20)]))
            i += 20
            time.sleep(0.1)

    producer = threading.Thread(target=produce, daemon=True)
    driver, out1, _ = start_driver(tmp_path, 1, unique_app_name, stream, kinesis_local, dynamodb,
                                   checkpoint=True)
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
    puts += put_records(stream, [(f"k{i}", f"r{i}") for i in range(100_000, 100_100)])

    driver, out2, stop2 = start_driver(tmp_path, 2, unique_app_name, stream, kinesis_local,
                                       dynamodb, checkpoint=True)
    try:
        expected = {(p.shard_id, int(p.sequence_number)) for p in puts}
        seen = lambda: {(s, q) for s, q, _, _ in read_rows(out1) + read_rows(out2)}  # noqa: E731
        wait_until(lambda: expected <= seen(), 120, "every record after the restart")
        stop2.touch()
        assert driver.wait(90) == 0, (tmp_path / "driver-2.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
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
