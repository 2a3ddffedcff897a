"""retrieval.subscription_peers: a task asks the process holding its shard's subscription,
over a port open to a network that may be hostile.

Real sockets in this process: the read a peer makes is replaced by a stub that says what it
was asked (the real read is exercised through Spark in test_sql_fanout and test_spark_fanout,
and the bytes between two executors in test_peer_capture). The hostile-peer tests each
failed on the pickled, HMAC-challenged protocol this replaced (0cfa6df): a dotted global ran
``os.getpid()``, a relay was served its own request and fed the task a forged reading, 1,000
idle connections made 1,000 threads, a 1 GiB length prefix held its connection open, and a
scanner kept an unused server open for ever."""
from __future__ import annotations

import logging
import pickle
import select
import socket
import ssl
import struct
import threading
import time
from typing import Any

import pytest

from waiting import wait_for

from kinesis_dstream.aws.range_table import BatchRange, _item, _range
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.records import ExtendedSequenceNumber, Record
from kinesis_dstream.retrieval import peer_messages, subscription_peers
from kinesis_dstream.retrieval.fetch_pace import FetchPace
from kinesis_dstream.retrieval.peer_messages import MalformedMessage, ReadRequest
from kinesis_dstream.retrieval.peer_tls import new_peer_key, tls_context
from kinesis_dstream.retrieval.read_loop import Reading

pytestmark = pytest.mark.unit

START = ExtendedSequenceNumber("49590338271490256608559692538361571095921575989136588898")
KEY = new_peer_key()
STREAM_KEY = "s/query-1"
PUSHED = Record(b"pushed \x00\xff", "pk", "2", 3, 1_700_000_000_000, "shardId-0", "123",
                True)


CONFIG = ConsumerConfig(stream_name="s", application_name="app", region_name="us-east-1",
                        retrieval_mode="FANOUT")


def config() -> ConsumerConfig:
    return CONFIG


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The reads peers in this process were asked for (with the config they read with);
    each answers one record."""
    calls: list[tuple] = []

    def fake_read(kinesis: Any, config: ConsumerConfig, shard_id: str,
                  start: ExtendedSequenceNumber, timestamp: float | None, *,
                  ahead: str | None = None, ahead_records: int = 0, **bounds: Any
                  ) -> Reading:
        assert ahead is None  # fan-out: the held subscription reads, nothing is read ahead
        calls.append((shard_id, start, bounds, config))
        return Reading(records=[PUSHED], millis_behind_latest=0, calls=1, served=1,
                       seconds=0.25, child_shard_ids=("shardId-7",))

    monkeypatch.setattr(subscription_peers, "read", fake_read)
    monkeypatch.setattr(subscription_peers, "clients_for", lambda config: type(
        "Clients", (), {"kinesis": None})())
    return calls


def served_address(key=KEY) -> str:
    address = subscription_peers.serve(key, STREAM_KEY, config())
    assert address is not None
    return address


def ask(address: str, key=KEY, stream_key: str = STREAM_KEY, **bounds: Any) -> Reading | None:
    bounds.setdefault("time_budget_s", 1.0)
    return subscription_peers.read_at(address, key, stream_key, "s", "shardId-0", START,
                                      None, **bounds)


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def proven_connection(address: str, key=KEY) -> ssl.SSLSocket:
    """A connection that completed the handshake with ``key``: an insider's."""
    return tls_context(key, server=False).wrap_socket(
        socket.create_connection(host_port(address), timeout=10))


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Did the peer close ``sock`` (EOF or reset) within ``timeout``?"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not select.select([sock], [], [], 0.2)[0]:
            continue
        try:
            if not sock.recv(65536):
                return True
        except (ConnectionError, ssl.SSLError):
            return True
        except (ssl.SSLWantReadError, BlockingIOError):
            continue
    return False


def request_threads() -> int:
    return sum(t.name == "subscription-peer-request" for t in threading.enumerate())


def test_a_task_gets_its_range_read_by_the_process_that_serves_it(asked):
    address = served_address()
    assert served_address() == address  # one server per key and process
    reading = ask(address, max_records=100, max_bytes=5_000,
                  pace=FetchPace(1_000_000.0, 0.2))
    assert reading is not None and reading.records == [PUSHED]
    assert (reading.calls, reading.served, reading.seconds, reading.child_shard_ids) == (
        1, 1, 0.25, ("shardId-7",))
    [(shard, start, bounds, used)] = asked
    assert (shard, start) == ("shardId-0", START) and used == config()
    assert bounds == {"max_records": 100, "time_budget_s": 1.0, "max_bytes": 5_000,
                      "pace": FetchPace(1_000_000.0, 0.2)}


def test_a_task_without_the_query_key_is_not_served(asked):
    address = served_address()
    assert ask(address, key=new_peer_key()) is None
    assert asked == []


def test_a_stranger_speaking_tls_without_the_query_certificate_is_not_served(asked):
    """The server requires the query's certificate of its client, not only the client the
    server's: a stranger that checks nothing and presents nothing gets nothing."""
    stranger = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    stranger.check_hostname, stranger.verify_mode = False, ssl.CERT_NONE
    request = peer_messages.encode_request(ReadRequest(STREAM_KEY, "shardId-0", START, None,
                                                       time_budget_s=1.0))
    raw = socket.create_connection(host_port(served_address()), timeout=10)
    try:
        with stranger.wrap_socket(raw) as tls:
            tls.sendall(request)
            assert closed_by_peer(tls, 10)
    except (ssl.SSLError, ConnectionError):
        pass  # refused during the handshake
    assert asked == []


def test_a_stream_no_task_of_this_process_read_is_not_read(asked):
    """The config is looked up, never sent: a stream the server was not given has none."""
    assert ask(served_address(), stream_key="other/query-1") is None
    assert asked == []


def test_a_holder_gone_answers_none_at_once(asked):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert ask(f"127.0.0.1:{port}") is None


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
    monkeypatch.setattr(shard_reader, "serve", lambda key, stream_key, config: "10.0.0.8:40999")
    asked: list[str] = []

    def read_at(address: str, key: Any, stream_key: str, *args: Any, **bounds: Any) -> Reading:
        asked.append(address)
        return Reading(records=[Record(b"pushed", "pk", "5", 0, 0.0, "shardId-0")], calls=1)

    monkeypatch.setattr(shard_reader, "read_at", read_at)
    fan_out = config().replace(retrieval_mode="FANOUT", consumer_arn="arn:consumer")
    planned = ShardRange("m1", "shardId-0", 2000, ExtendedSequenceNumber("TRIM_HORIZON"),
                         None, 1000, 100, 1.0, peer_key=KEY)
    records, report = read_shard_range(fan_out, planned)
    assert asked == ["10.0.0.7:40123"] and [r.binary_data for r in records] == [b"pushed"]
    assert recorded == [report.batch_range] and report.batch_range.subscriber == "10.0.0.7:40123"


# ---- a network that may be hostile ----------------------------------------------------------

def dotted_global_pickle() -> bytes:
    """A pickle that, loaded, calls ``subscription_peers.log.warning("DOTTED GLOBAL RAN")``
    through a dotted name (protocol 4 walks module attributes)."""
    def text(s: str) -> bytes:
        return pickle.SHORT_BINUNICODE + bytes([len(s)]) + s.encode()
    return (b"\x80\x04" + text("kinesis_dstream.retrieval.subscription_peers")
            + text("log.warning") + pickle.STACK_GLOBAL + text("DOTTED GLOBAL RAN")
            + pickle.TUPLE1 + pickle.REDUCE + b".")


def test_a_pickle_with_a_dotted_global_runs_nothing_even_from_an_insider(
        asked, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(subscription_peers, "HANDSHAKE_TIMEOUT_S", 60.0)  # not what ends it
    payload = dotted_global_pickle()
    address = served_address()
    with socket.create_connection(host_port(address), timeout=10) as stranger:
        stranger.sendall(struct.pack("!I", len(payload)) + payload)
        assert closed_by_peer(stranger, 10)
    with proven_connection(address) as insider:
        insider.sendall(struct.pack("!I", len(payload)) + payload)
        assert closed_by_peer(insider, 10)
    assert "DOTTED GLOBAL RAN" not in caplog.text and asked == []
    assert ask(address) is not None  # and a proper request is still served


class Relay:
    """Sits at an address a task dials, forwards to the real server, and meddles: it
    injects a request of its own after the handshake, or a reply of its own to the task."""

    def __init__(self, target: str, *, inject_request: bytes = b"", inject_reply: bytes = b""):
        self.target = host_port(target)
        self.inject_request, self.inject_reply = inject_request, inject_reply
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            self._relay()
        except OSError:  # either end hung up on the meddling: the relay ends
            pass

    def _relay(self) -> None:
        task, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        chunks_from_task = 0
        with task, server:
            while True:
                ready = select.select([task, server], [], [], 10)[0]
                if not ready:
                    return
                for sock in ready:
                    try:
                        data = sock.recv(65536)
                    except ConnectionError:
                        data = b""
                    if not data:
                        return
                    if sock is task:
                        chunks_from_task += 1
                        if chunks_from_task >= 2 and self.inject_request:  # handshake done
                            data, self.inject_request = self.inject_request, b""
                        server.sendall(data)
                    else:
                        if self.inject_reply and chunks_from_task >= 2:
                            data, self.inject_reply = self.inject_reply, b""
                        task.sendall(data)


def test_a_relayed_handshake_gets_no_request_of_its_own_served(asked):
    own = peer_messages.encode_request(ReadRequest(STREAM_KEY, "shardId-ATTACKER", START, None,
                                                   time_budget_s=1.0))
    relay = Relay(served_address(), inject_request=own)
    assert ask(relay.address) is None  # the task's own request was replaced: it reads alone
    assert "shardId-ATTACKER" not in [a[0] for a in asked]


def test_a_relay_cannot_feed_the_task_a_forged_reading(asked):
    forged = Reading(records=[Record(b"forged", "pk", "999", 0, 0, "shardId-0")])
    header, bodies = peer_messages.encode_reply(forged)
    relay = Relay(served_address(), inject_reply=header + b"".join(bodies))
    reading = ask(relay.address)
    assert reading is None or reading.records == [PUSHED]


def test_a_thousand_idle_connections_take_no_thread_each_and_stop_no_task(asked):
    address = served_address()
    before = request_threads()
    idle = [socket.create_connection(host_port(address)) for _ in range(1000)]
    try:
        assert request_threads() <= before + 2 * subscription_peers.MAX_CONNECTIONS
        # A task of the query is still served. On a loaded machine the server may still be
        # giving up the flood's places when a task's handshake deadline ends: that task
        # reads in its own process (None), and a later one is served.
        wait_for(lambda: ask(address) is not None, timeout=60, what="a task served")
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_that_trickles_bytes_is_dropped_at_its_deadline(asked):
    """A byte every 0.5 s is never idle long enough for a per-read timeout: only a deadline
    for the whole handshake drops it (5 s), long before its 60 s of bytes are sent."""
    address = served_address()
    began = time.monotonic()
    with socket.create_connection(host_port(address)) as trickler:
        for byte in (b"\x16\x03\x01" + b"\x00" * 117):
            try:
                trickler.send(bytes([byte]))
            except OSError:
                break
            if closed_by_peer(trickler, 0.5):
                break
        else:
            pytest.fail("a connection trickling a byte every 0.5 s was held for 60 s")
    assert time.monotonic() - began < 60
    assert asked == []


def test_a_1_gib_length_prefix_is_refused_unread(asked, monkeypatch):
    monkeypatch.setattr(subscription_peers, "HANDSHAKE_TIMEOUT_S", 60.0)  # not what ends it
    address = served_address()
    with socket.create_connection(host_port(address), timeout=10) as stranger:
        stranger.sendall(struct.pack("!I", 1 << 30) + b"x" * 1000)
        assert closed_by_peer(stranger, 10)
    with proven_connection(address) as insider:
        insider.sendall(struct.pack("!I", 1 << 30) + b"x" * 1000)
        assert closed_by_peer(insider, 10)
    assert asked == []


def test_a_1_gib_reply_is_refused_unread():
    with pytest.raises(MalformedMessage, match="at most"):
        peer_messages.header_length(struct.pack("!I", 1 << 30), peer_messages.MAX_HEADER_BYTES)
    header = peer_messages.frame({"status": "ok", "records": [[1 << 30, "k", "1", 0, 0, None,
                                                              False]]})
    with pytest.raises(MalformedMessage, match="at most"):
        peer_messages.decode_reply_header(header[4:])


def serving_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("subscription-peer-")
            and t.name != "subscription-peer-request"}


def test_a_scanner_connecting_every_second_does_not_keep_an_unused_server_open(
        asked, monkeypatch):
    monkeypatch.setattr(subscription_peers, "IDLE_CLOSE_S", 5.0)
    key = new_peer_key()
    address = served_address(key)
    thread = f"subscription-peer-{address}"
    scanning = threading.Event()
    scanning.set()

    def scan() -> None:  # every second for a minute, or until the port is closed
        for _ in range(60):
            if not scanning.is_set():
                return
            try:
                socket.create_connection(host_port(address), timeout=1).close()
            except OSError:
                return
            time.sleep(1.0)  # the scanner's own pace, not a wait on the server

    scanner = threading.Thread(target=scan, daemon=True)
    scanner.start()
    try:
        # IDLE_CLOSE_S after the last task's use, and a slice of the accept loop's second
        wait_for(lambda: thread not in serving_threads(), 20,
                 "the server no task used to close while a scanner connects every second")
    finally:
        scanning.clear()
    assert ask(address, key=key) is None  # its port is closed


def test_a_server_ends_once_no_task_of_its_query_used_it(asked, monkeypatch):
    monkeypatch.setattr(subscription_peers, "IDLE_CLOSE_S", 3.0)
    key = new_peer_key()
    address = served_address(key)
    thread = f"subscription-peer-{address}"
    for _ in range(20):  # tasks of the query keep coming (every 0.1 s): it stays
        assert served_address(key) == address and thread in serving_threads()
        time.sleep(0.1)  # the tasks' pace, not a wait on the server
    wait_for(lambda: thread not in serving_threads(), 30, "the idle server's thread to end")
    assert ask(address, key=key) is None  # its port is closed
    again = served_address(key)  # a task of the query coming back later gets a new server
    assert again != address and ask(again, key=key) is not None


def test_a_process_keeps_a_bounded_number_of_servers_the_least_used_closing(asked):
    """A query restarted every few seconds leaves no pile of servers (one per query, each
    open for IDLE_CLOSE_S): past MAX_SERVERS the least recently used one closes."""
    keys = [new_peer_key() for _ in range(subscription_peers.MAX_SERVERS + 3)]
    addresses = [served_address(k) for k in keys]
    wait_for(lambda: len(serving_threads() & {f"subscription-peer-{a}" for a in addresses})
             == subscription_peers.MAX_SERVERS, 10, "the oldest servers to close")
    assert ask(addresses[0], key=keys[0]) is None  # closed
    assert ask(addresses[-1], key=keys[-1]) is not None


# ---- a process that cannot listen reads alone ----------------------------------------------

@pytest.mark.parametrize("host", ["203.0.113.7", "fe80::dead:beef:1"])
def test_a_host_this_process_cannot_listen_on_serves_nothing_and_says_so(
        asked, monkeypatch, caplog, host):
    monkeypatch.setenv("SPARK_LOCAL_IP", host)
    monkeypatch.setattr(subscription_peers, "_cannot_listen", set())
    with caplog.at_level(logging.WARNING):
        assert subscription_peers.serve(new_peer_key(), STREAM_KEY, config()) is None
        assert subscription_peers.serve(new_peer_key(), STREAM_KEY, config()) is None
    assert [r.message for r in caplog.records].count(next(
        r.message for r in caplog.records if "cannot listen" in r.message)) == 1


def test_an_ipv6_spark_local_ip_is_served(asked, monkeypatch):
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.fail("this machine has no IPv6 loopback: the IPv6 path cannot be shown here")
    monkeypatch.setenv("SPARK_LOCAL_IP", "::1")
    key = new_peer_key()
    address = served_address(key)
    assert address.startswith("[::1]:") and ask(address, key=key) is not None


def test_a_fan_out_task_in_a_process_that_cannot_listen_reads_its_range_itself(monkeypatch):
    from kinesis_dstream.retrieval import ShardRange, read_shard_range, shard_reader

    monkeypatch.setenv("SPARK_LOCAL_IP", "203.0.113.7")
    recorded: list[BatchRange] = []
    ranges = type("Ranges", (), {"put_if_absent": lambda self, r: recorded.append(r) or r})()
    monkeypatch.setattr(shard_reader, "clients_for", lambda config: type(
        "Clients", (), {"kinesis": None, "ranges": ranges})())
    monkeypatch.setattr(shard_reader, "read", lambda *a, **k: Reading(
        records=[Record(b"here", "pk", "5", 0, 0, "shardId-0")], calls=1))
    fan_out = config().replace(retrieval_mode="FANOUT", consumer_arn="arn:consumer")
    planned = ShardRange("m1", "shardId-0", 2000, ExtendedSequenceNumber("TRIM_HORIZON"),
                         None, 1000, 100, 1.0, start=START, peer_key=new_peer_key())
    records, report = read_shard_range(fan_out, planned)
    assert [r.binary_data for r in records] == [b"here"]
    assert recorded == [report.batch_range] and report.batch_range.subscriber is None


# ---- the messages: fixed fields, checked types ------------------------------------------

def test_a_request_round_trips_and_a_wrong_type_is_refused():
    request = ReadRequest(STREAM_KEY, "shardId-0", START, 1.5, 10, 2.0, 100,
                          FetchPace(5.0, 0.1))
    data = peer_messages.encode_request(request)
    assert peer_messages.decode_request(data[4:]) == request
    for bad in (b"[1]", b"\xff", b'{"stream": 1}',
                data[4:].replace(b'"max_records":10', b'"max_records":true')):
        with pytest.raises(MalformedMessage):
            peer_messages.decode_request(bad)


def test_a_reply_with_a_record_of_the_wrong_shape_is_refused():
    header = peer_messages.frame({"status": "ok", "records": [[3, "k"]]})
    with pytest.raises(MalformedMessage):
        peer_messages.decode_reply_header(header[4:])
