"""What an executor's Python worker process keeps between the tasks it runs.

PySpark reuses its Python workers, so a reader's clients live as long as the process, made
once per configuration (per stream read) and kept out of the per-task garbage collection.
Both caches are bounded, least recently used first out: ``MAX_CLIENTS`` configurations
(queries restarted with new options make new ones) and ``MAX_FAULT_LOGS`` fault logs.
The process also gets a log handler (it has none of its own), one fault log per shard
(of a stream: a process may read shardId-000000000000 of two streams) or table pair, so that
a lasting fault is logged once a minute whichever task meets it, and zip archives that are
not read again at every task (``skip_unchanged_zip_invalidation``).
"""
from __future__ import annotations

import gc
import logging
import os
import socket
import stat
import sys
import threading
import zipimport
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable, Generic, Hashable, TypeVar

from ..aws.kinesis import KinesisClient
from ..aws.lease_table import LeaseTable
from ..aws.range_store import RangeStore, open_range_store
from ..config import ConsumerConfig
from ..retry import FaultLog, RetryPolicy

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# A process reads few streams at a time; past this, the least recently used clients go (a
# later task of theirs makes new ones, at a first read's cost).
MAX_CLIENTS = 16
# One per shard (or table pair) a process met; past this the least recently used is
# forgotten, and with it only its rate limit of one line a minute.
MAX_FAULT_LOGS = 1024


class ProcessOnce(Generic[V]):
    """One ``V`` per process, made on first use: PySpark reuses its Python workers, so it
    outlives the tasks (held subscriptions, pages read ahead)."""

    def __init__(self, make: Callable[[], V]) -> None:
        self._make = make
        self._value: V | None = None
        self._lock = threading.Lock()

    def __call__(self) -> V:
        with self._lock:
            if self._value is None:
                self._value = self._make()
            return self._value


class BoundedCache(Generic[K, V]):
    """A dict of at most ``max_size`` entries; adding one past it drops the least recently
    used. Not locked: callers hold their own lock."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_size:
            self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


@dataclass
class ReaderClients:
    """A reader's clients. The lease table's is made on first use: only a DStream's reads
    ask it (whether a lease moved), and a boto3 client costs a task's first read time."""

    kinesis: KinesisClient
    ranges: RangeStore
    config: ConsumerConfig
    _leases: LeaseTable | None = None

    @property
    def leases(self) -> LeaseTable:
        with _clients_lock:
            if self._leases is None:
                self._leases = LeaseTable(self.config)
                freeze_long_lived_objects()
            return self._leases


_clients: BoundedCache[ConsumerConfig, ReaderClients] = BoundedCache(MAX_CLIENTS)
_clients_lock = threading.Lock()


# An executor's Python worker has no logging set up: without a handler Python prints bare
# messages, with no time, level or logger, into the executor's stderr log.
EXECUTOR_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s"


def log_to_stderr_unless_configured() -> None:
    """Give this package's executor-side lines a time, a level and a logger name, unless the
    process (a user's own setup, or a driver that reads in local mode) configured logging."""
    package = logging.getLogger("kinesis_dstream")
    if logging.getLogger().handlers or package.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(EXECUTOR_LOG_FORMAT))
    package.addHandler(handler)
    if package.level == logging.NOTSET:
        package.setLevel(logging.WARNING)  # faults and give-ups; not a line per read


def clients_for(config: ConsumerConfig) -> ReaderClients:
    """This process's clients for ``config`` (PySpark reuses its Python workers)."""
    with _clients_lock:
        clients = _clients.get(config)
        if clients is None:
            log_to_stderr_unless_configured()
            skip_unchanged_zip_invalidation()
            kinesis = KinesisClient(config, policy=reader_policy(config))
            clients = _clients.put(config, ReaderClients(kinesis, open_range_store(config), config))
            freeze_long_lived_objects()
        return clients


def reader_policy(config: ConsumerConfig) -> RetryPolicy:
    """The executors' Kinesis retry policy: the configured one, except that a throttle comes
    back at once, for the read loop to count and to pace (a retry 50 ms later would only be
    refused again, and spend the shard's calls)."""
    return replace(RetryPolicy.from_config(config), retry_throttling=False)


_frozen = False  # freeze_long_lived_objects ran in this process


def freeze_long_lived_objects() -> None:
    """Keep PySpark's per-task full garbage collection off boto3's objects, once a process.

    A reused PySpark worker runs ``gc.collect()`` after every task (pyspark/daemon.py). Once
    botocore has loaded its service models that walks all of their objects every task, and
    in a worker forked from PySpark's daemon it also copies every page it touches.
    The clients live as long as the process, so they move to the collector's permanent
    generation; reference counting still frees everything else, and later tasks' garbage is
    collected as before. Once: the models are loaded once a process (``aws/clients.py``),
    and freezing again at each new configuration would also freeze whatever else lived
    then (a task's data, an evicted client), for good.
    """
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()


# Set on a zipimporter: its archive's (mtime, size) when it last read the archive's directory.
_ZIP_STAMP = "_kinesis_dstream_zip_stamp"
_zip_invalidation_patched = False


def skip_unchanged_zip_invalidation() -> None:
    """Have ``importlib.invalidate_caches()`` re-read only the zip archives that changed.

    PySpark's Python worker (3.5, 4.0) calls it before every task (4.3's only when its path
    changed: SPARK-54744), and on Python 3.10 and 3.11 each zipimporter then re-reads
    its archive's whole directory (CPython gh-103200; lazy from 3.12 on): a dozen reads of
    pyspark.zip, most of a small task's time, so a streaming job's batches fall behind. An
    archive whose modification time and size are unchanged keeps its directory; a changed
    one is read again, as before. Nothing changes on other Pythons.
    """
    global _zip_invalidation_patched
    eager = getattr(zipimport.zipimporter, "invalidate_caches", None)
    if _zip_invalidation_patched or eager is None or sys.version_info >= (3, 12):
        return

    def invalidate_caches(importer: zipimport.zipimporter) -> None:
        try:
            status = os.stat(importer.archive)
            stamp: tuple[int, int] | None = (status.st_mtime_ns, status.st_size)
        except OSError:
            stamp = None
        if stamp is None or getattr(importer, _ZIP_STAMP, None) != stamp:
            eager(importer)
            setattr(importer, _ZIP_STAMP, stamp)

    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign, assignment]
    _zip_invalidation_patched = True


# per stream/shard (or table pair), in this process
_faults: BoundedCache[str, FaultLog] = BoundedCache(MAX_FAULT_LOGS)
_faults_lock = threading.Lock()


def fault_log(key: str, what: str) -> FaultLog:
    """The fault log of ``key`` (``stream/shardId``, or a table pair) in this process,
    which names it as ``what``: a transient fault is logged at most once a minute, with a
    count."""
    with _faults_lock:
        fault = _faults.get(key)
        if fault is None:
            fault = _faults.put(key, FaultLog(log, what))
        return fault


_worker_sockets: list[int] | None = None


def acknowledge_input_at_once() -> None:
    """Have the kernel acknowledge what the executor JVM sent this worker at once.

    The JVM sends a Python task its command, then its partition, in two writes on a loopback
    TCP socket; the second waits for the acknowledgement of the first, which Linux delays
    40 ms (Nagle's algorithm meeting delayed ACKs), so every task waited 40 ms for its own
    input (``bench/bench_task_input.py``). TCP_QUICKACK on the worker's socket sends the
    pending acknowledgement now. The worker's sockets are the TCP sockets this process has at
    its first task (before any read opened one of ours). A no-op off Linux and over Spark
    4.1+'s Unix socket (``spark.python.unix.domain.socket.enabled``).
    """
    global _worker_sockets
    option = getattr(socket, "TCP_QUICKACK", None)
    if option is None:
        return
    if _worker_sockets is None:
        _worker_sockets = [fd for fd in _open_fds() if _is_tcp(fd)]
    for fd in _worker_sockets:
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, option, 1)
        except OSError:
            pass  # closed since, or not a TCP socket any more: nothing to acknowledge


def _open_fds() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return []


def _is_tcp(fd: int) -> bool:
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        with socket.socket(fileno=os.dup(fd)) as sock:
            return sock.family in (socket.AF_INET, socket.AF_INET6) \
                and sock.type == socket.SOCK_STREAM
    except OSError:
        return False
