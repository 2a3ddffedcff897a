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

The port is open to the cluster's network, so it is built for a hostile one
(docs/enhanced-fan-out.md, "Threat model"):
- peers speak TLS 1.3, both presenting the query's certificate (``peer_tls``): a process
  without the query's key completes no handshake, and nothing can be read, changed or
  relayed on the way;
- messages have fixed fields (``peer_messages``), never pickles; no config is sent: the
  serving process reads with the config its own task of that stream was given;
- every connection has a deadline for its handshake and request (``HANDSHAKE_TIMEOUT_S``)
  and for its answer; a server holds at most ``MAX_CONNECTIONS``, a newcomer taking the
  place of the oldest one that has not proven the key; only a proven request, or a task of
  the query in this process, keeps a server open.

A peer that cannot be reached or fails (its executor is gone, its worker was restarted)
answers None: the task reads in its own process, which then holds the subscription. So does
a process that cannot listen (``serve`` answers None): its tasks read alone.

A server ends with its query or driver: the executor is not told when either stops, so a
server no task with its key has used for ``IDLE_CLOSE_S`` (as long as an unused
subscription is held) closes its port and its thread ends. A daemon thread, it also ends
with the process.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

from ..config import ConsumerConfig
from ..records import ExtendedSequenceNumber
from ..retry import FaultLog
from .executor_process import clients_for
from .model import shard_name
from .peer_messages import (
    MAX_HEADER_BYTES,
    MAX_REQUEST_BYTES,
    MalformedMessage,
    ReadRequest,
    decode_reading,
    decode_reply_header,
    decode_request,
    encode_failure,
    encode_reply,
    encode_request,
    header_length,
)
from .peer_tls import PeerKey, is_the_query, tls_context
from .prefetch import prefetches
from .read_loop import Reading, read
from .subscriptions import IDLE_CLOSE_S

log = logging.getLogger(__name__)

# A peer that does not accept within this long is taken as gone.
CONNECT_TIMEOUT_S = 2.0
# A connection proves the query's key (the TLS handshake) and sends its request within this.
HANDSHAKE_TIMEOUT_S = 5.0
# A peer's read may take the range's time budget; its answer is waited for this much longer.
ANSWER_MARGIN_S = 15.0
# The longest read a peer makes for one request, whatever time budget it names.
MAX_TIME_BUDGET_S = 120.0
# Connections a server holds at once (each has a thread while it lasts).
MAX_CONNECTIONS = 16
# The streams a server remembers the configs of (a query reads a few).
MAX_STREAMS = 64
# Servers a process keeps (one a query it read for lately): a query restarted every few
# seconds would otherwise leave one open for IDLE_CLOSE_S each; the least used one goes.
MAX_SERVERS = 8
# A blocked connection looks at its deadline (and whether it was evicted) this often.
_POLL_SLICE_S = 0.2

Stop = Callable[[], bool]


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    proven: bool = False  # completed the handshake with the query's certificate
    evicted: bool = False  # its place was given to a newer connection

    def __post_init__(self) -> None:
        self.fd = self.sock.fileno()  # kept by its TLS socket: open while it is admitted

    def evict(self) -> None:
        """End it now (called locked, while it is admitted: its descriptor is open)."""
        self.evicted = True
        try:
            with socket.socket(fileno=os.dup(self.fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)  # its thread's wait ends at once
        except OSError:
            pass


@dataclass(eq=False)
class _Server:
    key: PeerKey
    listener: socket.socket
    address: str
    last_used: float  # monotonic s: a task's serve() call or a proven request
    configs: OrderedDict[str, ConsumerConfig] = field(default_factory=OrderedDict)
    connections: list[_Connection] = field(default_factory=list)
    refused: FaultLog | None = None

    def remember(self, stream_key: str, config: ConsumerConfig) -> None:
        """The config a request naming ``stream_key`` is read with (called locked)."""
        self.configs[stream_key] = config
        self.configs.move_to_end(stream_key)
        while len(self.configs) > MAX_STREAMS:
            self.configs.popitem(last=False)

    def admit(self, sock: socket.socket) -> _Connection | None:
        """A place for a new connection: a free one, else the oldest unproven one's (it is
        told to end); None when every place is a proven one's or already being given up."""
        with _servers_lock:
            live = [c for c in self.connections if not c.evicted]
            if len(self.connections) >= 2 * MAX_CONNECTIONS:
                return None
            if len(live) >= MAX_CONNECTIONS:
                unproven = [c for c in live if not c.proven]
                if not unproven:
                    return None
                unproven[0].evict()
            connection = _Connection(sock)
            self.connections.append(connection)
            return connection

    def release(self, connection: _Connection) -> None:
        with _servers_lock:
            self.connections.remove(connection)


_servers: dict[PeerKey, _Server] = {}  # key -> this process's server for it
_servers_lock = threading.Lock()
_cannot_listen: set[str] = set()  # hosts this process could not listen on (logged once)


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


def _listen(host: str) -> tuple[socket.socket, str]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, 0), family=family, backlog=128)
    port = listener.getsockname()[1]
    return listener, (f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}")


def serve(key: PeerKey, stream_key: str, config: ConsumerConfig) -> str | None:
    """This process's address serving its held subscriptions of ``stream_key`` (read with
    ``config``) to the tasks that hold ``key``; the server thread starts on the first call
    (again after it closed for want of use), and each call keeps it open ``IDLE_CLOSE_S``
    longer. None if this process cannot listen: its tasks then read alone."""
    with _servers_lock:
        server = _servers.get(key)
        if server is None:
            host = advertised_host()
            try:
                listener, address = _listen(host)
            except OSError as exc:  # an address not on this host, no descriptor left...
                if host not in _cannot_listen:
                    _cannot_listen.add(host)
                    log.warning("cannot listen on %s for tasks on other executors (%s): this "
                                "process's fan-out tasks read their shards themselves", host, exc)
                return None
            if len(_servers) >= MAX_SERVERS:  # the least recently used closes
                del _servers[min(_servers, key=lambda k: _servers[k].last_used)]
            server = _servers[key] = _Server(key, listener, address, time.monotonic())
            server.refused = FaultLog(log, f"connections to {address} that did not prove the "
                                           "query's key")
            threading.Thread(target=_accept, args=(server,), daemon=True,
                             name=f"subscription-peer-{address}").start()
            log.info("serving this process's fan-out subscriptions at %s", address)
        server.remember(stream_key, config)
        server.last_used = time.monotonic()
        return server.address


def _unused(server: _Server) -> bool:
    """Has no task used ``server`` for ``IDLE_CLOSE_S``? If so it is forgotten (the next
    ``serve`` starts another)."""
    with _servers_lock:
        if _servers.get(server.key) is not server:  # given up for a newer query's
            return True
        if time.monotonic() - server.last_used < IDLE_CLOSE_S:
            return False
        if _servers.get(server.key) is server:  # serve() cannot hand its address out any more
            del _servers[server.key]
        return True


def _accept(server: _Server) -> None:
    server.listener.settimeout(min(1.0, IDLE_CLOSE_S / 2))
    with server.listener:
        while True:
            try:
                sock, _ = server.listener.accept()
            except socket.timeout:
                if _unused(server):
                    break
                continue
            except OSError:  # the process is out of descriptors, say: the tasks read alone
                log.warning("fan-out subscriptions at %s: cannot accept; no longer served",
                            server.address, exc_info=True)
                with _servers_lock:
                    if _servers.get(server.key) is server:
                        del _servers[server.key]
                return
            connection = server.admit(sock)
            if connection is None:
                sock.close()
            else:
                threading.Thread(target=_answer, args=(server, connection), daemon=True,
                                 name="subscription-peer-request").start()
            if _unused(server):  # a connection that proves nothing keeps nothing open
                break
    log.info("stopped serving fan-out subscriptions at %s: no task of its query for %.0f s",
             server.address, IDLE_CLOSE_S)


def _wait(sock: socket.socket, events: int, deadline: float, stop: Stop | None) -> None:
    """Until ``sock`` is ready for ``events``; TimeoutError at ``deadline`` or once
    ``stop()`` says so."""
    poller = select.poll()
    poller.register(sock.fileno(), events)
    while True:
        if stop is not None and stop():
            raise TimeoutError("its place was given to a newer connection")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the peer took too long")
        if poller.poll(min(left, _POLL_SLICE_S) * 1000):
            return


def _tls_call(tls: ssl.SSLSocket, call: Callable[[], Any], deadline: float,
              stop: Stop | None) -> Any:
    """``call()`` on a non-blocking TLS socket, waiting for it to be possible."""
    while True:
        try:
            return call()
        except ssl.SSLWantReadError:
            _wait(tls, select.POLLIN, deadline, stop)
        except ssl.SSLWantWriteError:
            _wait(tls, select.POLLOUT, deadline, stop)


def _recv_exact(tls: ssl.SSLSocket, size: int, deadline: float, stop: Stop | None) -> bytes:
    """``size`` bytes, gathered as they arrive (an announced size is not allocated up front)."""
    data = bytearray()
    while len(data) < size:
        want = min(size - len(data), 1 << 20)
        chunk = _tls_call(tls, partial(tls.recv, want), deadline, stop)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return bytes(data)


def _send_all(tls: ssl.SSLSocket, data: bytes, deadline: float, stop: Stop | None) -> None:
    view = memoryview(data)
    while view:
        sent = _tls_call(tls, partial(tls.send, view[:1 << 20]), deadline, stop)
        view = view[sent:]


def _read_frame(tls: ssl.SSLSocket, limit: int, deadline: float, stop: Stop | None) -> bytes:
    length = header_length(_recv_exact(tls, 4, deadline, stop), limit)
    return _recv_exact(tls, length, deadline, stop)


def _secured(sock: socket.socket, key: PeerKey, *, server: bool, deadline: float,
             stop: Stop | None = None) -> ssl.SSLSocket | None:
    """``sock`` in TLS with a peer that proved it holds ``key``; None if it did not."""
    sock.setblocking(False)
    tls = tls_context(key, server=server).wrap_socket(
        sock, server_side=server, do_handshake_on_connect=False)  # sock's descriptor moves
    try:
        _tls_call(tls, tls.do_handshake, deadline, stop)
        if is_the_query(tls, key):
            return tls
    except BaseException:
        tls.close()
        raise
    tls.close()
    return None


def _answer(server: _Server, connection: _Connection) -> None:
    def evicted() -> bool:
        return connection.evicted

    tls: ssl.SSLSocket | None = None
    try:
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        try:
            tls = _secured(connection.sock, server.key, server=True, deadline=deadline,
                           stop=evicted)
            if tls is None:
                raise ssl.SSLError("the peer presented another certificate")
            connection.proven = True
            request = decode_request(_read_frame(tls, MAX_REQUEST_BYTES, deadline, None))
        except (OSError, TimeoutError, MalformedMessage) as exc:  # a stranger, or cut short
            assert server.refused is not None
            server.refused.failed(exc)
            return
        with _servers_lock:
            server.last_used = time.monotonic()
            config = server.configs.get(request.stream_key)
        _send_all(tls, _reply(config, request), time.monotonic() + ANSWER_MARGIN_S, None)
    except (OSError, TimeoutError) as exc:  # the asking task is gone: it reads alone
        log.info("fan-out subscriptions at %s: an answer was not delivered: %s",
                 server.address, exc)
    finally:
        server.release(connection)  # before its descriptor closes: see _Connection.evict
        (tls or connection.sock).close()


def _reply(config: ConsumerConfig | None, request: ReadRequest) -> bytes:
    """What the asking task is sent: the reading, or why there is none."""
    if config is None:
        return encode_failure(f"no task of stream {request.stream_key!r} ran here lately")
    ahead = None
    if config.retrieval_mode != "FANOUT":  # polling: a page read ahead here, or nothing
        ahead = request.stream_key
        if not prefetches().holds((ahead, request.shard_id), request.start):
            return encode_failure(f"no page of {request.shard_id} was read ahead here "
                                  f"after {request.start}")
    try:
        bounds = request.bounds()
        bounds["time_budget_s"] = min(request.time_budget_s, MAX_TIME_BUDGET_S)
        reading = read(clients_for(config).kinesis, config, request.shard_id, request.start,
                       request.timestamp, ahead=ahead, ahead_records=request.max_records,
                       **bounds)
        header, bodies = encode_reply(reading)
        return header + b"".join(bodies)
    except Exception as exc:  # noqa: BLE001 - the asking task reads on its own instead
        log.warning("%s: reading it for a task on another executor failed: %s",
                    shard_name(config.stream_name, request.shard_id), exc, exc_info=True)
        return encode_failure(repr(exc))


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def read_at(address: str, key: PeerKey, stream_key: str, stream_name: str, shard_id: str,
            start: ExtendedSequenceNumber, timestamp: float | None, **bounds: Any
            ) -> Reading | None:
    """A new range read by the process at ``address`` with the subscription it holds (the
    keywords are ``read_loop.read``'s bounds); None if that process cannot do it."""
    shard = shard_name(stream_name, shard_id)
    try:
        sock = socket.create_connection(_host_port(address), timeout=CONNECT_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        log.info("%s: its subscription's holder %s is gone (%s); reading here",
                 shard, address, exc)
        return None
    request = ReadRequest(stream_key, shard_id, start, timestamp, **bounds)
    tls: ssl.SSLSocket | None = None
    try:
        tls = _secured(sock, key, server=False,
                       deadline=time.monotonic() + HANDSHAKE_TIMEOUT_S)
        if tls is None:
            log.warning("%s: %s is not a process of this query; reading here", shard, address)
            return None
        deadline = time.monotonic() + min(request.time_budget_s, MAX_TIME_BUDGET_S) \
            + ANSWER_MARGIN_S
        _send_all(tls, encode_request(request), deadline, None)
        header, size = decode_reply_header(_read_frame(tls, MAX_HEADER_BYTES, deadline, None))
        return decode_reading(header, _recv_exact(tls, size, deadline, None), shard_id)
    except (OSError, TimeoutError, MalformedMessage) as exc:  # the task reads on its own
        log.info("%s: asking %s for its subscription failed (%s); reading here",
                 shard, address, exc)
        return None
    finally:
        (tls or sock).close()
