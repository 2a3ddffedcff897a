"""An executor process's caches stay bounded: clients per configuration, fault logs per shard,
and gc.freeze once a process (it froze every live object at each new configuration)."""
from __future__ import annotations

import gc

import pytest

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.retrieval import executor_process
from kinesis_dstream.retrieval.executor_process import (
    MAX_CLIENTS,
    MAX_FAULT_LOGS,
    BoundedCache,
    clients_for,
    fault_log,
)

pytestmark = pytest.mark.unit


def config(n: int) -> ConsumerConfig:
    return ConsumerConfig(application_name=f"app-{n}", stream_name="s", region_name="us-east-1",
                          kinesis_endpoint="http://127.0.0.1:9", dynamodb_endpoint="http://127.0.0.1:9",
                          aws_access_key_id="x", aws_secret_key="y")


def test_clients_of_many_configurations_keep_the_most_recent_and_freeze_once(monkeypatch):
    monkeypatch.setattr(executor_process, "_clients", BoundedCache(MAX_CLIENTS))
    monkeypatch.setattr(executor_process, "_frozen", False)
    freezes: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: freezes.append(1))
    monkeypatch.setattr(gc, "collect", lambda *a: 0)
    configs = [config(n) for n in range(MAX_CLIENTS + 4)]
    made = [clients_for(c) for c in configs]
    assert len(executor_process._clients) == MAX_CLIENTS
    assert clients_for(configs[-1]) is made[-1]  # kept
    assert clients_for(configs[0]) is not made[0]  # the least recently used went
    assert len(freezes) == 1


def test_fault_logs_of_many_shards_keep_the_most_recent(monkeypatch):
    monkeypatch.setattr(executor_process, "_faults", BoundedCache(MAX_FAULT_LOGS))
    logs = [fault_log(f"s/shardId-{n:012d}", f"shard {n}") for n in range(MAX_FAULT_LOGS + 10)]
    assert len(executor_process._faults) == MAX_FAULT_LOGS
    assert fault_log(f"s/shardId-{MAX_FAULT_LOGS + 9:012d}", "again") is logs[-1]
    assert fault_log("s/shardId-000000000000", "again") is not logs[0]


def test_a_cache_hit_makes_an_entry_the_most_recently_used():
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert "a" in cache and "b" not in cache and "c" in cache
