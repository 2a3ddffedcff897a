"""A shard's subscription found by the task wherever the task lands (SQL fan-out).

A Python data source's partitions carry no executor location (PySpark's input partitions
have none to give), so Spark places a shard's task on any free executor, batch after batch.
A subscription held by one executor's Python worker (``subscriptions``) would be given up
for another's every time the task moves. Instead the process that holds it serves it: each
executor process that reads by fan-out listens on a port of its host (``serve``), every range
it records names it (``BatchRange.subscriber``), and the next batch's task of that shard,
wherever it runs, asks that process to read its new range (``read_at``). The records come
back to the task, executor to executor; the range is recorded by the task as any other.
Nothing passes through the driver.

A peer that cannot be reached or fails (its executor is gone, its worker was restarted)
answers None: the task reads on its own executor, which then holds the subscription.
Peers prove to each other that they know the query's key (``multiprocessing.connection``'s
HMAC challenge, both ways) before a request is read: only the query's tasks, which the
driver gives the key, are served.
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import threading
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

from ..config import ConsumerConfig
from ..records import ExtendedSequenceNumber
from .executor_process import clients_for
from .model import shard_name
from .read_loop import Reading, read

log = logging.getLogger(__name__)

# A peer that does not accept within this long is taken as gone.
CONNECT_TIMEOUT_S = 2.0
# A peer's read may take the range's time budget; its answer is waited for this much longer.
ANSWER_MARGIN_S = 15.0
# How long a peer waits for a request's next bytes before it drops the connection.
REQUEST_TIMEOUT_S = 30.0

_servers: dict[bytes, str] = {}  # key -> this process's address serving it
_servers_lock = threading.Lock()


def advertised_host() -> str:
    """The host other executors reach this one at: ``SPARK_LOCAL_IP`` where set (as Spark
    itself binds), else the address the host name resolves to."""
    host = os.environ.get("SPARK_LOCAL_IP")
    if host:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def serve(key: bytes) -> str:
    """This process's address (``host:port``) serving its held subscriptions to the tasks
    that know ``key``; the server thread starts on the first call."""
    with _servers_lock:
        address = _servers.get(key)
        if address is None:
            listener = socket.create_server((advertised_host(), 0))
            host, port = listener.getsockname()[:2]
            address = _servers[key] = f"{host}:{port}"
            threading.Thread(target=_accept, args=(listener, key), daemon=True,
                             name=f"subscription-peer-{port}").start()
            log.info("serving this process's fan-out subscriptions at %s", address)
        return address


def _blocking(sock: socket.socket, timeout_s: float) -> int:
    """The socket's descriptor, blocking, with every receive bounded by ``timeout_s`` (a
    ``Connection`` reads the descriptor itself, so the socket's own timeout would not hold)."""
    sock.setblocking(True)
    seconds = int(timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                    struct.pack("ll", seconds, int((timeout_s - seconds) * 1e6)))
    return sock.detach()


def _accept(listener: socket.socket, key: bytes) -> None:
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=_answer, args=(sock, key), daemon=True,
                         name="subscription-peer-request").start()


def _answer(sock: socket.socket, key: bytes) -> None:
    with Connection(_blocking(sock, REQUEST_TIMEOUT_S)) as conn:
        try:
            deliver_challenge(conn, key)
            answer_challenge(conn, key)
        except Exception:  # noqa: BLE001 - a stranger, or a task of another query
            log.warning("refused a subscription request that did not know the query's key")
            return
        try:
            config, shard_id, start, timestamp, bounds = conn.recv()
        except Exception:  # noqa: BLE001 - the asking task reads on its own instead
            log.warning("a subscription request was cut before it was read", exc_info=True)
            return
        try:
            reading = read(clients_for(config).kinesis, config, shard_id, start, timestamp,
                           **bounds)
            conn.send(("ok", reading))
        except Exception as exc:  # noqa: BLE001 - the asking task reads on its own instead
            log.warning("%s: reading it for a task on another executor failed: %s",
                        shard_name(config.stream_name, shard_id), exc, exc_info=True)
            try:
                conn.send(("failed", repr(exc)))
            except OSError:
                pass


def read_at(address: str, key: bytes, config: ConsumerConfig, shard_id: str,
            start: ExtendedSequenceNumber, timestamp: float | None, **bounds: Any
            ) -> Reading | None:
    """A new range read by the process at ``address`` with the subscription it holds (the
    keywords are ``read_loop.read``'s bounds); None if that process cannot do it."""
    host, _, port = address.rpartition(":")
    shard = shard_name(config.stream_name, shard_id)
    try:
        sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        log.info("%s: its subscription's holder %s is gone (%s); reading here",
                 shard, address, exc)
        return None
    wait_s = float(bounds.get("time_budget_s") or 0.0) + ANSWER_MARGIN_S
    try:
        with Connection(_blocking(sock, wait_s)) as conn:
            answer_challenge(conn, key)
            deliver_challenge(conn, key)
            conn.send((config, shard_id, start, timestamp, bounds))
            if not conn.poll(wait_s):
                log.warning("%s: %s did not answer within %.0f s; reading here",
                            shard, address, wait_s)
                return None
            status, answer = conn.recv()
    except Exception as exc:  # noqa: BLE001 - any failure: the task reads on its own
        log.info("%s: asking %s for its subscription failed (%s); reading here",
                 shard, address, exc)
        return None
    if status != "ok":
        log.warning("%s: %s could not read it (%s); reading here", shard, address, answer)
        return None
    return answer
