"""A shard's subscription found by the task wherever the task lands (fan-out, both APIs).

A subscription held by one Python worker process (``subscriptions``) would be given up for
another's every time a shard's task runs in another process: the SQL source's partitions
carry no executor location (PySpark's input partitions have none to give), so Spark places a
shard's task on any free executor, batch after batch; a DStream's tasks keep their executor
(``spark.locality``), but an executor with several cores runs them in any of its Python
workers. Instead the process that holds it serves it: each process that reads by fan-out
listens on a port of its host (``serve``), every range it records names it
(``BatchRange.subscriber``), and the next batch's task of that shard, wherever it runs, asks
that process to read its new range (``read_at``). The records come back to the task,
process to process; the range is recorded by the task as any other. Nothing passes through
the driver.

A peer that cannot be reached or fails (its executor is gone, its worker was restarted)
answers None: the task reads in its own process, which then holds the subscription.
Peers prove to each other that they know the driver's key (``new_peer_key``: one per query,
or per DStream driver; ``multiprocessing.connection``'s HMAC challenge, both ways) before a
request is read: only the tasks the driver gives the key are served. Nothing is unpickled
before that, and then only our own record and config classes (``_decode``): a message
cannot name any other callable.

A server ends with its query or driver: the executor is not told when either stops, so a
server no task with its key has used for ``IDLE_CLOSE_S`` (as long as an unused
subscription is held) closes its port and its thread ends. A daemon thread, it also ends
with the process.
"""
from __future__ import annotations

import io
import logging
import os
import pickle
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

from ..config import ConsumerConfig
from ..records import ExtendedSequenceNumber
from .executor_process import clients_for
from .model import shard_name
from .read_loop import Reading, read
from .subscriptions import IDLE_CLOSE_S

log = logging.getLogger(__name__)

# A peer that does not accept within this long is taken as gone.
CONNECT_TIMEOUT_S = 2.0
# A peer's read may take the range's time budget; its answer is waited for this much longer.
ANSWER_MARGIN_S = 15.0
# How long a peer waits for a request's next bytes before it drops the connection.
REQUEST_TIMEOUT_S = 30.0

# The globals a message may name beside our own classes: what pickle rebuilds a dataclass,
# a set and a frozen set with.
_SAFE_GLOBALS = frozenset({("copyreg", "_reconstructor"), ("copyreg", "__newobj__"),
                           ("builtins", "object"), ("builtins", "set"),
                           ("builtins", "frozenset")})


@dataclass
class _Server:
    listener: socket.socket
    address: str
    last_used: float  # monotonic s: a task's serve() call or a request


_servers: dict[bytes, _Server] = {}  # key -> this process's server for it
_servers_lock = threading.Lock()


def new_peer_key() -> bytes:
    """A driver's key (random, made in the driver, given to its tasks in their planned
    ranges): it proves a task to the processes holding its shards' subscriptions."""
    return secrets.token_bytes(32)


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
    that know ``key``; the server thread starts on the first call (again after it closed
    for want of use), and each call keeps it open ``IDLE_CLOSE_S`` longer."""
    with _servers_lock:
        server = _servers.get(key)
        if server is None:
            listener = socket.create_server((advertised_host(), 0))
            host, port = listener.getsockname()[:2]
            server = _servers[key] = _Server(listener, f"{host}:{port}", time.monotonic())
            threading.Thread(target=_accept, args=(server, key), daemon=True,
                             name=f"subscription-peer-{port}").start()
            log.info("serving this process's fan-out subscriptions at %s", server.address)
        server.last_used = time.monotonic()
        return server.address


def _unused(server: _Server, key: bytes) -> bool:
    """Has no task used ``server`` for ``IDLE_CLOSE_S``? If so it is forgotten (the next
    ``serve`` starts another)."""
    with _servers_lock:
        if time.monotonic() - server.last_used < IDLE_CLOSE_S:
            return False
        if _servers.get(key) is server:  # serve() cannot hand its address out any more
            del _servers[key]
        return True


def _forget(server: _Server, key: bytes) -> None:
    with _servers_lock:
        if _servers.get(key) is server:
            del _servers[key]


def _blocking(sock: socket.socket, timeout_s: float) -> int:
    """The socket's descriptor, blocking, with every receive bounded by ``timeout_s`` (a
    ``Connection`` reads the descriptor itself, so the socket's own timeout would not hold)."""
    sock.setblocking(True)
    seconds = int(timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                    struct.pack("ll", seconds, int((timeout_s - seconds) * 1e6)))
    return sock.detach()


def _accept(server: _Server, key: bytes) -> None:
    server.listener.settimeout(min(1.0, IDLE_CLOSE_S / 2))
    with server.listener:
        while True:
            try:
                sock, _ = server.listener.accept()
            except socket.timeout:
                if _unused(server, key):
                    break
                continue
            except OSError:  # the process is out of descriptors, say: the tasks read alone
                log.warning("fan-out subscriptions at %s: cannot accept; no longer served",
                            server.address, exc_info=True)
                _forget(server, key)
                return
            server.last_used = time.monotonic()
            threading.Thread(target=_answer, args=(sock, key), daemon=True,
                             name="subscription-peer-request").start()
    log.info("stopped serving fan-out subscriptions at %s: no task of its query for %.0f s",
             server.address, IDLE_CLOSE_S)


class _OurClasses(pickle.Unpickler):
    """Unpickles our records, configs and readings only (see ``_SAFE_GLOBALS``)."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("kinesis_dstream.") or (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a peer's message names {module}.{name}")


def _decode(conn: Connection) -> Any:
    """The next message from an authenticated peer."""
    return _OurClasses(io.BytesIO(conn.recv_bytes())).load()


def _answer(sock: socket.socket, key: bytes) -> None:
    with Connection(_blocking(sock, REQUEST_TIMEOUT_S)) as conn:
        try:
            deliver_challenge(conn, key)
            answer_challenge(conn, key)
        except Exception:  # noqa: BLE001 - a stranger, or a task of another query
            log.warning("refused a subscription request that did not know the query's key")
            return
        try:
            config, shard_id, start, timestamp, bounds = _decode(conn)
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
            status, answer = _decode(conn)
    except Exception as exc:  # noqa: BLE001 - any failure: the task reads on its own
        log.info("%s: asking %s for its subscription failed (%s); reading here",
                 shard, address, exc)
        return None
    if status != "ok":
        log.warning("%s: %s could not read it (%s); reading here", shard, address, answer)
        return None
    return answer
