"""The local channel between the Spark driver and its worker processes.

``multiprocessing.connection`` on 127.0.0.1 with a random 32-byte key: every connection
passes an HMAC challenge before a message is read, so no other local user can inject or
read records. The key reaches the workers as a file in a 0700 directory, mode 0600 (not on
the command line, which ``ps`` shows). Messages are tuples whose first item names them;
the names are listed below. No pyspark here: the worker side imports this module.
"""
from __future__ import annotations

import logging
import os
import secrets
import threading
from multiprocessing.connection import Client, Connection, Listener
from typing import Any, Callable

log = logging.getLogger(__name__)

# worker -> driver
HELLO = "hello"            # (HELLO, worker_id, pid)
INIT = "init"              # (INIT, shard_id, checkpoint_seq, checkpoint_sub)
RECORDS = "records"        # (RECORDS, shard_id, [(data, pk, seq, sub, arrival_ms)], millis_behind)
LAG = "lag"                # (LAG, shard_id, millis_behind) for empty GetRecords answers
DRAIN = "drain"            # (DRAIN, shard_id, reason) reason: "shard_end" | "shutdown"
LOST = "lost"              # (LOST, shard_id)
CHECKPOINTED = "checkpointed"  # (CHECKPOINTED, shard_id, seq, sub, error_or_None)
# driver -> worker
ACK = "ack"                # (ACK, shard_id): the records are buffered, fetch on
CHECKPOINT = "checkpoint"  # (CHECKPOINT, shard_id, seq, sub)
DRAINED = "drained"        # (DRAINED, shard_id, seq_or_None, sub_or_None, complete)

AUTHKEY_FILE = "channel.key"


def write_authkey(directory: str) -> str:
    """A fresh random key in ``directory/channel.key``, readable by this user only."""
    path = os.path.join(directory, AUTHKEY_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def read_authkey(path: str) -> bytes:
    with open(path) as f:
        return bytes.fromhex(f.read().strip())


def connect(address: tuple[str, int], authkey_path: str) -> Connection:
    return Client(tuple(address), authkey=read_authkey(authkey_path))


class Peer:
    """One connected worker process; ``send`` is safe from any thread."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.worker_id: str | None = None
        self.pid: int | None = None
        self._send_lock = threading.Lock()
        self.closed = False

    def send(self, message: tuple) -> bool:
        with self._send_lock:
            if self.closed:
                return False
            try:
                self.conn.send(message)
                return True
            except (OSError, EOFError, ValueError) as exc:
                log.warning("worker %s: send failed (%s); dropping its connection", self.worker_id, exc)
                self.closed = True
                return False

    def close(self) -> None:
        with self._send_lock:
            self.closed = True
        try:
            self.conn.close()
        except OSError:
            pass

    def __repr__(self) -> str:
        return f"Peer({self.worker_id or '?'})"


class ChannelServer:
    """Accepts authenticated worker connections; one reader thread per worker."""

    def __init__(self, directory: str, on_message: Callable[[Peer, tuple], Any],
                 on_disconnect: Callable[[Peer], Any], name: str = "kinesis-dstream"):
        self.authkey_path = write_authkey(directory)
        self._listener = Listener(("127.0.0.1", 0), authkey=read_authkey(self.authkey_path))
        self.address: tuple[str, int] = self._listener.address
        self._on_message = on_message
        self._on_disconnect = on_disconnect
        self._name = name
        self._closed = threading.Event()
        self.peers: list[Peer] = []
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except (OSError, EOFError) as exc:
                if self._closed.is_set():
                    return
                log.warning("rejected a channel connection: %s", exc)
                continue
            except Exception as exc:  # noqa: BLE001 - AuthenticationError and kin: keep serving
                log.warning("rejected an unauthenticated channel connection: %s", exc)
                continue
            peer = Peer(conn)
            self.peers.append(peer)
            threading.Thread(target=self._read_loop, args=(peer,), daemon=True,
                             name=f"{self._name}-reader").start()

    def _read_loop(self, peer: Peer) -> None:
        try:
            while True:
                try:
                    message = peer.conn.recv()
                except (EOFError, OSError):
                    return
                if message[0] == HELLO:
                    peer.worker_id, peer.pid = message[1], message[2]
                    continue
                self._on_message(peer, message)
        except Exception:
            # A bug on our side: drop this worker (it exits and is restarted) rather than
            # keep a channel whose state is unknown.
            log.exception("worker %s: failed handling a message; dropping its connection",
                          peer.worker_id)
        finally:
            peer.close()
            if not self._closed.is_set():
                self._on_disconnect(peer)

    def close(self) -> None:
        self._closed.set()
        try:
            self._listener.close()
        except OSError:
            pass
        for peer in list(self.peers):
            peer.close()
