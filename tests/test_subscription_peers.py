"""retrieval.subscription_peers: a task asks the process holding its shard's subscription.

Pure sockets in this process: the read a peer makes is replaced by a stub that says what it
was asked (the real read is exercised through Spark in test_sql_fanout and
test_spark_fanout)."""
from __future__ import annotations

import socket
import threading
import time
from multiprocessing.connection import Client, answer_challenge, deliver_challenge
from typing import Any

import pytest

from waiting import wait_for

from kinesis_dstream.aws.range_table import BatchRange, _item, _range
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.records import ExtendedSequenceNumber, Record
from kinesis_dstream.retrieval import subscription_peers
from kinesis_dstream.retrieval.read_loop import Reading

pytestmark = pytest.mark.unit

START = ExtendedSequenceNumber("49590338271490256608559692538361571095921575989136588898")


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The reads peers in this process were asked for; each answers one record."""
    calls: list[tuple] = []

    def fake_read(kinesis: Any, config: ConsumerConfig, shard_id: str,
                  start: ExtendedSequenceNumber, timestamp: float | None, **bounds: Any
                  ) -> Reading:
        calls.append((shard_id, start, bounds))
        record = Record(b"pushed", "pk", "2", 0, 1_700_000_000_000, shard_id)
        return Reading(records=[record], millis_behind_latest=0, calls=1)

    monkeypatch.setattr(subscription_peers, "read", fake_read)
    monkeypatch.setattr(subscription_peers, "clients_for", lambda config: type(
        "Clients", (), {"kinesis": None})())
    return calls


def config() -> ConsumerConfig:
    return ConsumerConfig(stream_name="s", application_name="app", region_name="us-east-1")


def test_a_task_gets_its_range_read_by_the_process_that_serves_it(asked):
    key = b"k" * 32
    address = subscription_peers.serve(key)
    assert subscription_peers.serve(key) == address  # one server per key and process
    reading = subscription_peers.read_at(address, key, config(), "shardId-0", START, None,
                                         max_records=100, time_budget_s=1.0)
    assert reading is not None and [r.binary_data for r in reading.records] == [b"pushed"]
    assert asked == [("shardId-0", START, {"max_records": 100, "time_budget_s": 1.0})]


def test_a_task_without_the_query_key_is_not_served(asked):
    address = subscription_peers.serve(b"a" * 32)
    assert subscription_peers.read_at(address, b"b" * 32, config(), "shardId-0", START,
                                      None, time_budget_s=1.0) is None
    assert asked == []


def test_a_holder_gone_answers_none_at_once(asked):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert subscription_peers.read_at(f"127.0.0.1:{port}", b"k" * 32, config(), "shardId-0",
                                      START, None, time_budget_s=1.0) is None


def test_a_range_keeps_the_process_holding_its_subscription():
    r = BatchRange("s/q", "shardId-0", 3, START, subscriber="10.0.0.7:40123")
    assert _range(_item(r)).subscriber == "10.0.0.7:40123"
    assert _range(_item(BatchRange("s/q", "shardId-0", 3, START))).subscriber is None


def test_a_task_whose_start_the_driver_does_not_know_asks_the_holder_its_previous_range_names(
        monkeypatch):
    """A DStream batch planned before its shard's previous read reported (no start, no
    subscriber in the plan): the task looks the previous range up for its start, as ever,
    and asks the process that range names, not its own."""
    from kinesis_dstream.retrieval import ShardRange, read_shard_range, shard_reader

    previous = BatchRange("m1", "shardId-0", 1000, START, end=START, records=1,
                          subscriber="10.0.0.7:40123")
    recorded: list[BatchRange] = []
    ranges = type("Ranges", (), {
        "get": lambda self, *key: None,
        "latest_before": lambda self, *key: previous,
        "put_if_absent": lambda self, r: recorded.append(r) or r})()
    monkeypatch.setattr(shard_reader, "clients_for", lambda config: type(
        "Clients", (), {"kinesis": None, "ranges": ranges})())
    monkeypatch.setattr(shard_reader, "serve", lambda key: "10.0.0.8:40999")
    asked: list[str] = []

    def read_at(address: str, key: bytes, *args: Any, **bounds: Any) -> Reading:
        asked.append(address)
        return Reading(records=[Record(b"pushed", "pk", "5", 0, 0.0, "shardId-0")], calls=1)

    monkeypatch.setattr(shard_reader, "read_at", read_at)
    fan_out = config().replace(retrieval_mode="FANOUT", consumer_arn="arn:consumer")
    planned = ShardRange("m1", "shardId-0", 2000, ExtendedSequenceNumber("TRIM_HORIZON"),
                         None, 1000, 100, 1.0, peer_key=b"k" * 32)
    records, report = read_shard_range(fan_out, planned)
    assert asked == ["10.0.0.7:40123"] and [r.binary_data for r in records] == [b"pushed"]
    assert recorded == [report.batch_range] and report.batch_range.subscriber == "10.0.0.7:40123"


touched: list[str] = []


def touch(what: str) -> str:
    touched.append(what)
    return what


class Payload:
    """Unpickled, it calls ``touch``: a message that names a callable of its own choosing."""

    def __reduce__(self) -> tuple:
        return touch, ("unpickled",)


def test_nothing_is_unpickled_before_the_peer_proved_the_key(asked):
    touched.clear()
    host, _, port = subscription_peers.serve(b"k" * 32).rpartition(":")
    with Client((host, int(port))) as stranger:  # no key: it sends a message at once
        stranger.send(Payload())
        stranger.send(Payload())
        with pytest.raises((EOFError, OSError)):
            while True:  # the challenge, then the connection closed on us
                stranger.recv_bytes()
    assert touched == [] and asked == []


def test_an_authenticated_peer_cannot_name_a_callable_outside_our_classes(asked):
    touched.clear()
    key = b"k" * 32
    host, _, port = subscription_peers.serve(key).rpartition(":")
    with Client((host, int(port))) as peer:
        answer_challenge(peer, key)
        deliver_challenge(peer, key)
        peer.send(Payload())
        with pytest.raises((EOFError, OSError)):
            peer.recv_bytes()  # dropped, unanswered
    assert touched == [] and asked == []
    # and a proper request is still served
    assert subscription_peers.read_at(f"{host}:{port}", key, config(), "shardId-0", START,
                                      None, time_budget_s=1.0) is not None


def serving_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("subscription-peer-")}


def test_a_server_ends_once_no_task_of_its_query_used_it(asked, monkeypatch):
    monkeypatch.setattr(subscription_peers, "IDLE_CLOSE_S", 0.6)
    key = b"q" * 32
    address = subscription_peers.serve(key)
    thread = f"subscription-peer-{address.rpartition(':')[2]}"
    in_use_until = time.monotonic() + 1.5  # tasks of the query keep coming: it stays
    while time.monotonic() < in_use_until:
        assert subscription_peers.serve(key) == address
        assert thread in serving_threads()
        time.sleep(0.1)
    wait_for(lambda: thread not in serving_threads(), 10, "the idle server's thread to end")
    assert subscription_peers.read_at(address, key, config(), "shardId-0", START, None,
                                      time_budget_s=1.0) is None  # its port is closed
    # a task of the query coming back later gets a new server
    again = subscription_peers.serve(key)
    assert again != address
    assert subscription_peers.read_at(again, key, config(), "shardId-0", START, None,
                                      time_budget_s=1.0) is not None
