"""Benchmark: kill -9 of a Spark driver, then StreamingContext.getOrCreate (issue 16): seconds
from the restart to the first new record, against ``failover_time_ms`` + 5 s.

``bench_recovery.py [--rounds 3] [--failover-ms 10000]``. Each round: a fresh 2-shard
kinesis-local stream and application, a driver (tests/spark_driver.py, local[2], 1 s batches,
a Spark checkpoint directory) counting while a producer puts 200 records/s; once both shards
are checkpointed the driver is killed -9 and a second one started from the same checkpoint.
"First new data" is the first record written by the new driver that was put after the kill
(replayed records do not count). Also shown: the new driver's start (Popen to "STARTED", i.e.
``ssc.start()`` returned) and whether it took the dead driver's leases at once (its log says
so) or waited ``failover_time_ms`` out.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common

TARGET_MARGIN_S = 5.0


class Producer(threading.Thread):
    """Records "n<index>" under rotating keys, 20 every 0.1 s, until ``halt``."""

    def __init__(self, kinesis: str, stream: str) -> None:
        super().__init__(name="recovery-producer", daemon=True)
        self.kinesis, self.stream = kinesis, stream
        self.sent = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        h = common.helpers()
        try:
            while not self.halt.wait(0.1):
                h.put_records(self.kinesis, self.stream,
                              [(f"k{i}", f"n{i}") for i in range(self.sent, self.sent + 20)])
                self.sent += 20
        except BaseException as exc:  # noqa: BLE001 - reported by the benchmark
            self.error = exc


def one_round(kinesis: str, dynamodb: str, workdir: Path, failover_ms: int) -> dict[str, Any]:
    h = common.helpers()
    import spark_helpers as sh  # tests/ is on the path once helpers() ran

    stream, app = h.unique_name("recovery"), h.unique_name("app-recovery")
    h.create_stream(kinesis, stream, 2)
    producer = Producer(kinesis, stream)
    producer.start()
    first, out1, _ = sh.start_driver(workdir, 1, app, stream, kinesis, dynamodb, checkpoint=True,
                                     checkpoint_interval="1")
    second = None
    try:
        if not sh_wait(lambda: len(sh.read_rows(out1)) >= 200, 180):
            raise RuntimeError(f"no records in the first driver: {workdir}/driver-1.log")

        def checkpointed() -> bool:
            items = sh.leases_at(dynamodb, app).values()
            return len(items) == 2 and all(i["checkpoint"]["S"].isdigit() for i in items)

        if not sh_wait(checkpointed, 60):
            raise RuntimeError("the shards were never checkpointed")
        # ... and Spark's own checkpoint written (on a loaded machine it can lag the batches:
        # without it getOrCreate starts afresh, not as a recovery)
        if not sh_wait(lambda: any((workdir / "checkpoint").glob("checkpoint-*")), 120):
            raise RuntimeError("Spark wrote no checkpoint")
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic()
        new_from = producer.sent  # every record from this index on was put after the kill
        second, out2, stop2 = sh.start_driver(workdir, 2, app, stream, kinesis, dynamodb,
                                              checkpoint=True, checkpoint_interval="1")
        restarted = time.monotonic()
        log2 = workdir / "driver-2.log"
        started_s = first_new_s = None
        deadline = restarted + 180
        while first_new_s is None and time.monotonic() < deadline:
            now = time.monotonic()
            if started_s is None and log2.exists() and "STARTED" in log2.read_text():
                started_s = now - restarted
            if any(int(d[1:]) >= new_from for _, _, _, d in sh.read_rows(out2)):
                first_new_s = now - restarted
            time.sleep(0.05)
        text = log2.read_text()
        stop2.touch()
        second.wait(90)
        return {"restart_to_first_new_record_s": first_new_s, "restart_to_started_s": started_s,
                "started_to_first_new_record_s": None if first_new_s is None or started_s is None
                else round(first_new_s - started_s, 3),
                "recovered_from_checkpoint": "Kinesis DStream on" not in text,
                "kill_to_restart_s": round(restarted - killed_at, 3),
                "took_dead_leases_at_once": "which is dead" in text,
                "within_target": first_new_s is not None
                and first_new_s <= failover_ms / 1000 + TARGET_MARGIN_S}
    finally:
        producer.halt.set()
        producer.join(10)
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        common.delete_table(dynamodb, app)
        common.delete_table(dynamodb, f"{app}-kinesis-dstream-ranges")
        h.delete_stream(kinesis, stream)


def sh_wait(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--failover-ms", type=int, default=10000,
                        help="failover_time_ms of both drivers (the KCL's default: 10000)")
    args = parser.parse_args(argv)
    common.helpers()
    load = os.getloadavg()
    os.environ.update(common.aws_env())
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["RECOVERY_FAILOVER_MS"] = str(args.failover_ms)
    rounds = []
    with common.running_emulators("kinesis-local", "moto") as emulators:
        kinesis, dynamodb = emulators["kinesis-local"].endpoint, emulators["moto"].endpoint
        for n in range(args.rounds):
            workdir = tempfile.mkdtemp(prefix="bench-recovery-")  # kept: the drivers' logs
            result = one_round(kinesis, dynamodb, Path(workdir), args.failover_ms)
            result["logs"] = workdir
            common.progress(f"round {n + 1}: {result}")
            rounds.append(result)
    firsts = [r["restart_to_first_new_record_s"] for r in rounds
              if r["restart_to_first_new_record_s"] is not None]
    median = statistics.median(firsts) if firsts else None
    common.emit({
        "benchmark": "recovery", "failover_time_ms": args.failover_ms,
        "target_s": args.failover_ms / 1000 + TARGET_MARGIN_S,
        "restart_to_first_new_record_s": common.summary(firsts),
        "restart_to_started_s": common.summary(
            [r["restart_to_started_s"] for r in rounds if r["restart_to_started_s"] is not None]),
        "started_to_first_new_record_s": common.summary(
            [r["started_to_first_new_record_s"] for r in rounds
             if r["started_to_first_new_record_s"] is not None]),
        "took_dead_leases_at_once": [r["took_dead_leases_at_once"] for r in rounds],
        "recovered_from_checkpoint": [r["recovered_from_checkpoint"] for r in rounds],
        "median_within_target": median is not None
        and median <= args.failover_ms / 1000 + TARGET_MARGIN_S,
        "rounds": rounds, "machine": common.machine(load),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
