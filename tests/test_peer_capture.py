"""The bytes between two executors during a fan-out read, captured: nothing in clear; and a
query whose peer ports are attacked all along reads every record once.

A SQL query reads by fan-out on the session's local-cluster (two executor processes; the
source's tasks land on either, so a shard's task often asks the process on the other
executor that holds its subscription: ``retrieval.subscription_peers``). Every TCP segment
on the loopback interface is captured with a raw packet socket while it runs (the executors
talk over loopback here, as over a network in a cluster: a sniffer needs no help from the
library). The peers' ports are those the recorded ranges name. In what crossed those ports:
TLS records, and neither the query's static secret key nor any record's data (which the same
capture finds in the emulator's traffic: the capture sees what it should).

On the protocol this replaced (0cfa6df: pickles after an HMAC challenge), each request
carried the whole config, secret key included, and each answer the records, in clear.
"""
from __future__ import annotations

import base64
import os
import socket
import struct
import threading
import uuid
from pathlib import Path
from typing import Callable

import pytest
from botocore.exceptions import ClientError

from spark_helpers import wait_until
from test_sql_fanout import LIFETIME_S, fan_out, start, subscribers
from test_sql_source import Batches, KeyedProducer, options, read_on_exactly_once
from test_subscription_peers import dotted_global_pickle

pytestmark = pytest.mark.spark

ETH_P_ALL = 0x0003
TLS_APPLICATION_DATA = 23


class LoopbackCapture(threading.Thread):
    """Every TCP payload on ``lo``: (source port, destination port, bytes)."""

    def __init__(self) -> None:
        super().__init__(name="loopback-capture", daemon=True)
        if os.geteuid() != 0:
            pytest.fail("capturing packets needs root (CI runs as root)")
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.2)
        self.segments: list[tuple[int, int, bytes]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                frame = self.sock.recv(70000)
            except socket.timeout:
                continue
            segment = _tcp_segment(frame[14:])  # loopback frames carry a zeroed Ethernet header
            if segment is not None and segment[2]:
                self.segments.append(segment)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)
        self.sock.close()

    def between(self, ports: set[int]) -> bytes:
        return b"".join(p for s, d, p in list(self.segments) if s in ports or d in ports)

    def besides(self, ports: set[int]) -> bytes:
        return b"".join(p for s, d, p in list(self.segments)
                        if s not in ports and d not in ports)


def _tcp_segment(packet: bytes) -> tuple[int, int, bytes] | None:
    if not packet:
        return None
    version = packet[0] >> 4
    if version == 4:
        header, protocol = (packet[0] & 0x0F) * 4, packet[9]
        total = struct.unpack("!H", packet[2:4])[0]
        packet = packet[:total]
    elif version == 6:
        header, protocol = 40, packet[6]
    else:
        return None
    if protocol != 6:
        return None
    tcp = packet[header:]
    source, destination = struct.unpack("!HH", tcp[:4])
    return source, destination, tcp[(tcp[12] >> 4) * 4:]


def tls_application_bytes(stream: bytes) -> int:
    """How much of ``stream`` (one direction's segments, or both) is TLS application data,
    walking its records from the start of each connection's first record."""
    total, at = 0, 0
    while at + 5 <= len(stream):
        kind, length = stream[at], struct.unpack("!H", stream[at + 3:at + 5])[0]
        if kind not in (20, 21, 22, 23) or stream[at + 1] != 3:
            at += 1  # a segment boundary of another connection: resynchronise
            continue
        if kind == TLS_APPLICATION_DATA:
            total += length
        at += 5 + length
    return total


def peer_ports(dynamodb: str, app: str) -> set[int]:
    """The ports of the processes the query's recorded ranges name as holders."""
    try:
        held = subscribers(dynamodb, app)
    except ClientError:  # the range table is not made yet
        return set()
    return {int(a.rpartition(":")[2]) for a in held}


@pytest.mark.timeout(300)  # the session's Spark may start inside it (90 s loaded)
def test_neither_the_secret_key_nor_a_record_crosses_between_executors_in_clear(
        spark, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    secret = f"CaptureSecret{uuid.uuid4().hex}"
    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1)
    opts = options(stream, front.endpoint, dynamodb, unique_app_name,
                   **fan_out(unique_app_name),
                   **{"kinesis.awsAccessKeyId": "AKIDCAPTURE", "kinesis.awsSecretKey": secret})
    sink = Batches()
    prefix = f"capture{uuid.uuid4().hex[:8]}"
    producer = KeyedProducer(front.endpoint, stream, prefix=prefix, every_s=0.2)
    capture = LoopbackCapture()
    capture.start()
    query = start(spark, "aws-kinesis", opts, str(tmp_path / "cp"), sink)
    try:
        producer.start()

        # until the peers have answered with at least a few hundred records' worth
        wait_until(lambda: peer_ports(dynamodb, unique_app_name) and len(
            capture.between(peer_ports(dynamodb, unique_app_name))) > 20_000, 180,
            "records read through a peer (a task asking the process holding its shard)")
        read_on_exactly_once(query, producer, sink, len(producer.sent) + 100)
    finally:
        producer.halt.set()
        capture.stop()
        if query.isActive:
            query.stop()
    ports = peer_ports(dynamodb, unique_app_name)
    peers, others = capture.between(ports), capture.besides(ports)
    records = list(producer.sent)
    assert secret.encode() not in peers
    assert not [d for d in records if d in peers]
    assert tls_application_bytes(peers) > 20_000  # what crossed was TLS
    assert b"AKIDCAPTURE" not in peers and stream.encode() not in peers
    # The same capture sees the records elsewhere (base64 in the emulator's JSON): it works.
    seen = [d for d in records[:50] if base64.b64encode(d) in others or d in others]
    assert len(seen) == 50, f"the capture missed the emulator's traffic ({len(seen)} of 50)"


class Hostile(threading.Thread):
    """Everything the unit tests throw at one peer port, at every peer port a query's
    ranges name, over and over while the query reads: idle connections by the hundred, a
    trickler, a pickle naming a dotted global, a 1 GiB length prefix, a scanner."""

    def __init__(self, ports: Callable[[], set[int]]) -> None:
        super().__init__(name="hostile-neighbour", daemon=True)
        self.ports, self.halt, self.attacks = ports, threading.Event(), 0
        self.held: list[socket.socket] = []

    def run(self) -> None:
        pickled = dotted_global_pickle()
        while not self.halt.wait(1.0):
            for port in self.ports():
                for payload in (b"", b"\x16\x03\x01", struct.pack("!I", len(pickled)) + pickled,
                                struct.pack("!I", 1 << 30) + b"x" * 100):
                    try:
                        sock = socket.create_connection(("127.0.0.1", port), timeout=1)
                        sock.sendall(payload)
                        self.held.append(sock)
                        self.attacks += 1
                    except OSError:
                        pass
            while len(self.held) > 400:  # hundreds idle at any time, the oldest let go
                self.held.pop(0).close()

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        for sock in self.held:
            sock.close()


@pytest.mark.timeout(300)  # the session's Spark may start inside it (90 s loaded)
def test_a_query_beside_hostile_neighbours_on_its_peer_ports_reads_every_record_once(
        spark, aws_env, kinesis_local, dynamodb, make_stream, unique_app_name,
        make_fanout_front, tmp_path: Path):
    stream = make_stream(2)
    front = make_fanout_front(lifetime_s=LIFETIME_S, heartbeat_s=1)
    opts = options(stream, front.endpoint, dynamodb, unique_app_name, **fan_out(unique_app_name))
    sink = Batches()
    producer = KeyedProducer(front.endpoint, stream, prefix="hostile", every_s=0.2)
    query = start(spark, "aws-kinesis", opts, str(tmp_path / "cp"), sink)
    hostile = Hostile(lambda: peer_ports(dynamodb, unique_app_name))
    try:
        producer.start()
        wait_until(lambda: peer_ports(dynamodb, unique_app_name), 180, "a peer port named")
        hostile.start()
        wait_until(lambda: hostile.attacks >= 200, 120, "200 hostile connections")
        read_on_exactly_once(query, producer, sink, len(producer.sent) + 300)
    finally:
        producer.halt.set()
        hostile.stop()
        if query.isActive:
            query.stop()
    assert hostile.attacks >= 200
