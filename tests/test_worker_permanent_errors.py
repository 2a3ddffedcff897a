"""A permanent read error releases the lease, within the failover time, and names its cause.

AccessDenied on one shard (GetRecords through ``fault_proxy``, SubscribeToShard through the
fan-out front) cannot be cured by trying again while the lease is held: the worker's shard
consumer stops, its lease shows no owner in DynamoDB within ``failover_time_ms`` of the first
refusal, the worker leaves it to others for a while, and a second worker that may read the
shard takes it and reads every record. The worker's other shard reads on.
"""
from __future__ import annotations

import logging
import threading
import time

import pytest

import emulators
from test_worker_e2e import owners
from test_worker_fanout import recorder
from waiting import wait_for

from kinesis_dstream.worker.scheduler import Scheduler

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

DENIED = "AccessDeniedException"


def shard_records(delivered: list, shard_id: str, worker: str) -> set[str]:
    return {r.binary_data.decode() for w, s, r, _ in list(delivered)
            if w == worker and s == shard_id and r != "SHARD_END"}


def put_by_shard(kinesis_local: str, stream: str, total: int) -> dict[str, set[str]]:
    """Plain records spread over the stream's shards; their data by the shard that holds them."""
    results = emulators.put_records(kinesis_local, stream,
                                    [(f"pk-{i}", f"r-{i}") for i in range(total)])
    by_shard: dict[str, set[str]] = {}
    for i, result in enumerate(results):
        by_shard.setdefault(result.shard_id, set()).add(f"r-{i}")
    return by_shard


def assert_released_in_failover_time(dynamodb: str, table: str, denied: str, other: str,
                                     first_refusal: float, failover_s: float,
                                     caplog: pytest.LogCaptureFixture, stream: str) -> None:
    """The denied shard's lease has no owner within the failover time of the first refusal
    (epoch s); the other shard stays ours; the error names cause, stream and shard."""
    wait_for(lambda: owners(dynamodb, table).get(denied, "?") is None, failover_s + 5,
             f"the lease of {denied} released after {DENIED}", interval=0.05)
    released_after = time.time() - first_refusal
    assert released_after <= failover_s, \
        f"released {released_after:.1f} s after the first refusal, failover is {failover_s} s"
    wait_for(lambda: owners(dynamodb, table).get(other) == "a", failover_s,
             f"the other shard, {other}, held by the first worker")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
              and DENIED in r.getMessage()]
    assert errors, "the permanent error was not reported"
    assert denied in errors[0] and stream in errors[0] and "releasing its lease" in errors[0]


def second_reads_the_denied_shard(second: Scheduler, delivered: list,
                                  by_shard: dict[str, set[str]], denied: str, other: str) -> None:
    """The first worker reads its other shard on; a second worker started now reads the
    shard the first one released."""
    wait_for(lambda: shard_records(delivered, other, "a") >= by_shard[other], 30,
             "the other shard's records, read on by the first worker")
    second.start()
    wait_for(lambda: shard_records(delivered, denied, "b") >= by_shard[denied], 30,
             "the denied shard's records, read by the second worker")


def test_access_denied_to_get_records_releases_the_lease_and_another_worker_reads_the_shard(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, make_fault_proxy, caplog):
    stream = make_stream(2)
    by_shard = put_by_shard(kinesis_local, stream, 40)
    denied, other = sorted(by_shard)
    proxy = make_fault_proxy(share=0.0)
    proxy.answer_error[("GetRecords", denied)] = DENIED
    config_a = make_config(stream, worker_id="a", kinesis_endpoint=proxy.endpoint)
    failover_s = config_a.failover_time_ms / 1000
    delivered: list = []
    lock = threading.Lock()
    caplog.set_level(logging.INFO, logger="kinesis_dstream")
    first = Scheduler(config_a, recorder(delivered, lock, "a"))
    second = Scheduler(config_a.replace(worker_id="b", kinesis_endpoint=kinesis_local),
                       recorder(delivered, lock, "b"))
    first.start()
    try:
        wait_for(lambda: proxy.errors_answered, 30, f"{DENIED} answered to GetRecords")
        first_refusal = time.time() - (time.monotonic() - proxy.errors_answered[0])
        assert_released_in_failover_time(dynamodb, config_a.application_name, denied, other,
                                         first_refusal, failover_s, caplog, stream)
        second_reads_the_denied_shard(second, delivered, by_shard, denied, other)
    finally:
        second.shutdown(timeout_s=10)
        first.shutdown(timeout_s=10)
    assert len(proxy.errors_answered) == 1, "a permanent error must not be tried again"
    assert not shard_records(delivered, denied, "a")


def test_access_denied_to_subscribe_to_shard_releases_the_lease(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, make_fanout_front, caplog):
    stream = make_stream(2)
    by_shard = put_by_shard(kinesis_local, stream, 40)
    denied, other = sorted(by_shard)
    front = make_fanout_front(lifetime_s=60, heartbeat_s=1)
    front.refuse_shard(denied, DENIED)
    config = make_config(stream, worker_id="a", kinesis_endpoint=front.endpoint,
                         retrieval_mode="FANOUT")
    failover_s = config.failover_time_ms / 1000
    delivered: list = []
    lock = threading.Lock()
    caplog.set_level(logging.INFO, logger="kinesis_dstream")
    first = Scheduler(config, recorder(delivered, lock, "a"))
    second = Scheduler(config.replace(worker_id="b"), recorder(delivered, lock, "b"))
    first.start()
    try:
        wait_for(lambda: front.refused[DENIED], 30, f"{DENIED} answered to SubscribeToShard")
        first_refusal = min(t for t, s in front.subscribed if s == denied)
        assert_released_in_failover_time(dynamodb, config.application_name, denied, other,
                                         first_refusal, failover_s, caplog, stream)
        front.refuse_shard(denied, None)  # the second worker may read it
        second_reads_the_denied_shard(second, delivered, by_shard, denied, other)
    finally:
        second.shutdown(timeout_s=10)
        first.shutdown(timeout_s=10)
    assert front.refused[DENIED] == 1, "a permanent error must not be tried again"
    assert not shard_records(delivered, denied, "a")
