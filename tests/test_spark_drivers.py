"""Two Spark applications with one application name on one stream: they split the shards
through the KCL lease table, as KCL workers do, and each record is processed by one of them.

Each driver is a process of its own (tests/spark_driver.py, master local[2]); kinesis-local
and moto's DynamoDB. The drivers' failover time is 3 s, so a renew period is about 1 s.
"""
from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

from emulators import list_shard_ids
from spark_helpers import leases_at, read_rows, start_driver, wait_until

pytestmark = pytest.mark.spark

FAILOVER_S, RENEW_S = 3.0, 3.0 / 3
# A stopped driver's shards are taken within failover + 2 renew periods (the taker looks
# every renew period: the first look after b's last renewal, expiry on a's clock, then the
# next look), plus 2 s for a machine loaded with two CPU-bound processes beside the test
# (the drivers' lease threads, moto, this test's polls). The KCL's own pace (a look every
# 2 x failover) would take up to 10 s.
TAKEN_WITHIN_S = FAILOVER_S + 2 * RENEW_S + 2.0


def owners(dynamodb: str, app: str) -> dict[str, str | None]:
    return {s: i.get("leaseOwner", {}).get("S") for s, i in leases_at(dynamodb, app).items()}


def split_between_two(dynamodb: str, app: str, shards: int) -> bool:
    held = owners(dynamodb, app)
    return len(held) == shards and None not in held.values() \
        and sorted(Counter(held.values()).values()) == [shards // 2, shards // 2]


def start_two(tmp_path, app, stream, kinesis, dynamodb):
    drivers = {name: start_driver(tmp_path, name, app, stream, kinesis, dynamodb,
                                  checkpoint_interval="1") for name in ("a", "b")}
    try:
        wait_until(lambda: split_between_two(dynamodb, app, 4), 120, "the two drivers splitting")
    except BaseException:
        for proc, _, _ in drivers.values():
            proc.kill()
            proc.wait()
        raise
    return drivers


def stop_all(drivers) -> None:
    for proc, _, stop in drivers.values():
        if proc.poll() is None:
            stop.touch()
    for proc, _, _ in drivers.values():
        try:
            proc.wait(60)
        except Exception:  # noqa: BLE001 - then it is killed
            proc.kill()
            proc.wait()


def test_two_drivers_split_the_shards_and_one_takes_over_after_a_graceful_stop(
        tmp_path, aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name):
    stream = make_stream(4)
    drivers = start_two(tmp_path, unique_app_name, stream, kinesis_local, dynamodb)
    (_, out_a, _), (b, out_b, stop_b) = drivers["a"], drivers["b"]
    try:
        puts = put_records(stream, [(f"k{i}", f"r{i}") for i in range(400)])
        produced = {(p.shard_id, int(p.sequence_number)) for p in puts}
        seen = lambda: [(s, q) for s, q, _, _ in read_rows(out_a) + read_rows(out_b)]  # noqa: E731
        wait_until(lambda: produced <= set(seen()), 90, "every record of the first wave")
        assert len(read_rows(out_a)) and len(read_rows(out_b)), "one driver got every shard"

        stop_b.touch()
        assert b.wait(60) == 0, (tmp_path / "driver-b.log").read_text()[-3000:]
        stopped = time.monotonic()
        wait_until(lambda: len(set(owners(dynamodb, unique_app_name).values())) == 1
                   and None not in owners(dynamodb, unique_app_name).values(), 30,
                   "driver a taking b's shards")
        taken_after = time.monotonic() - stopped
        assert taken_after <= TAKEN_WITHIN_S, taken_after

        puts += put_records(stream, [(f"k{i}", f"r{i}") for i in range(400, 800)])
        produced = {(p.shard_id, int(p.sequence_number)) for p in puts}
        wait_until(lambda: produced <= set(seen()), 90, "every record of the second wave")
    finally:
        stop_all(drivers)  # graceful: every batch generated completes, so duplicates show
    counted = Counter(seen())
    assert set(counted) == produced
    assert [r for r, n in counted.items() if n > 1] == [], "a record processed twice"
    assert all(o is None for o in owners(dynamodb, unique_app_name).values())


def test_a_driver_killed_loses_nothing(tmp_path, aws_env, kinesis_local, dynamodb, make_stream,
                                       put_records, unique_app_name):
    stream = make_stream(4)
    drivers = start_two(tmp_path, unique_app_name, stream, kinesis_local, dynamodb)
    (_, out_a, _), (b, out_b, _) = drivers["a"], drivers["b"]
    try:
        puts = put_records(stream, [(f"k{i}", f"r{i}") for i in range(400)])
        produced = lambda: {(p.shard_id, int(p.sequence_number)) for p in puts}  # noqa: E731
        seen = lambda: {(s, q) for s, q, _, _ in read_rows(out_a) + read_rows(out_b)}  # noqa: E731
        wait_until(lambda: produced() <= seen(), 90, "every record of the first wave")
        b.send_signal(signal.SIGKILL)
        b.wait()
        puts += put_records(stream, [(f"k{i}", f"r{i}") for i in range(400, 800)])
        wait_until(lambda: produced() <= seen(), 120, "every record, b's shards read by a")
        assert len(set(owners(dynamodb, unique_app_name).values())) == 1
        assert set(list_shard_ids(kinesis_local, stream)) == set(owners(dynamodb, unique_app_name))
    finally:
        stop_all(drivers)
