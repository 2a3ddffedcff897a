"""Runs in the source's own driver-side process: tells the reader that Spark stopped it.

PySpark runs a stream reader's driver-side calls (``initialOffset``, ``latestOffset``,
``partitions``, ``commit``) in one Python process that the driver's JVM starts for the
query's source. When the query ends, however it ends (``stop()``, ``Trigger.AvailableNow``
done, a failure anywhere), Spark stops its sources, and for ours that means SIGTERM to that
process (``PythonStreamingSourceRunner.stop``: ``stopWorker``). Python's default SIGTERM
ends the process at once: the reader's ``stop()``, which PySpark calls in a ``finally``,
never runs (measured on pyspark 4.3: not called on a graceful ``stop()``).

``install`` replaces that default, once per process and from its main thread (where
PySpark makes the calls), in that process only (run as ``SOURCE_RUNNER``, which no other
process is: a test's or a user's interpreter keeps its own SIGTERM). SIGTERM then raises
``SourceStopped`` in the main thread, which unwinds into PySpark's ``finally`` and so into
the reader's ``stop()``; ``stopped_by_spark`` says that this is why. The source's own
error is not a stop by Spark: PySpark calls ``stop()`` as that error unwinds, before any
SIGTERM. A pyspark without that ``finally`` still reaches the readers' ``stop()`` through
``atexit``.

The socket to the driver's JVM closing under the process is either. ``stop()`` interrupts
the query's thread, and a thread interrupted while it waits for this process's answer closes
the socket (``ClosedByInterruptException``); the SIGTERM follows only once that thread has
unwound to ``stopSources``, which under load, or after Spark's own error handling
(``StreamExecution.isInterruptionException`` can overflow the stack on a long Py4J message),
takes seconds. A driver that died sends nothing. So a process that lost its socket waits up
to ``SPARK_STOP_WAIT_S`` for that SIGTERM before it decides (found in CI: without the wait,
a graceful ``stop()`` now and then kept the consumer).

The process cannot learn whether the query failed elsewhere (its sink, a task): Spark
stops the source the same way. The driver's query listener knows (``consumer_listener``);
``register(spark)`` adds it and says so to the source's process through the data source's
environment (``LISTENER_ENV``), and the reader then leaves the decision to it.
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

# Set in the environment of the source's process by ``register(spark)``, which adds the
# driver's query listener: the listener deregisters, knowing whether the query failed.
LISTENER_ENV = "KINESIS_DSTREAM_STOP_LISTENER"
# The module PySpark runs (python -m) as a stream source's driver-side process.
SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
# How long a process whose socket to the JVM closed waits for Spark's SIGTERM (see above).
SPARK_STOP_WAIT_S = 15.0
# What PySpark's loop raises when the JVM closed the socket (EOFError: read_int at its end).
_SOCKET_CLOSED = (EOFError, ConnectionError)


class SourceStopped(SystemExit):
    """Spark stopped the source (SIGTERM to its process): the query has ended."""


_lock = threading.Lock()
_installed = False
_stopped_by_spark = False
# What to run once as the process ends (each reader's stop), however it ends.
_on_exit: dict[int, Callable[[], None]] = {}


def listener_in_driver() -> bool:
    """The driver's query listener decides for this source (``register(spark)`` added it)."""
    return os.environ.get(LISTENER_ENV) == "1"


def in_source_process() -> bool:
    main = sys.modules.get("__main__")
    return getattr(getattr(main, "__spec__", None), "name", None) == SOURCE_RUNNER


def stopped_by_spark() -> bool:
    """Whether Spark stopped the query, asked as the reader stops. Where the socket to the
    JVM closed under the process (the exception PySpark's ``finally`` runs for), Spark's
    SIGTERM may still be on its way: wait up to ``SPARK_STOP_WAIT_S`` for it."""
    wait_s = SPARK_STOP_WAIT_S
    if _stopped_by_spark or not _installed:
        return _stopped_by_spark
    if not isinstance(sys.exc_info()[1], _SOCKET_CLOSED):
        return False  # the source's own error: no stop by Spark came first
    deadline = time.monotonic() + wait_s
    while not _stopped_by_spark and time.monotonic() < deadline:
        time.sleep(0.05)  # a SIGTERM cuts it short: _note_sigterm runs in this thread
    if not _stopped_by_spark:
        log.warning("the socket to the driver's JVM closed and no stop by Spark followed "
                    "within %.0f s: taken as the driver gone", wait_s)
    return _stopped_by_spark


def _on_sigterm(signum: int, frame: Any) -> None:
    _note_sigterm(signum, frame)
    raise SourceStopped(0)


def _note_sigterm(signum: int, frame: Any) -> None:
    """Spark may send it twice, and once the reader is stopping, a SIGTERM is noted only."""
    global _stopped_by_spark
    signal.signal(signal.SIGTERM, _note_sigterm)
    _stopped_by_spark = True


def _run_at_exit() -> None:
    for stop in list(_on_exit.values()):
        try:
            stop()
        except Exception:  # noqa: BLE001 - the process is ending: log and go on
            log.warning("stopping a Kinesis source as its process ended failed", exc_info=True)


def install(key: int, stop: Callable[[], None]) -> bool:
    """Catch Spark's SIGTERM in this process (once), and run ``stop`` as it ends unless
    ``forget(key)`` was called first. False where no handler can be set (not the main
    thread, or not the process PySpark made for the source)."""
    global _installed
    if threading.current_thread() is not threading.main_thread() or not in_source_process():
        return False
    with _lock:
        _on_exit[key] = stop
        if not _installed:
            signal.signal(signal.SIGTERM, _on_sigterm)
            atexit.register(_run_at_exit)
            _installed = True
    return True


def forget(key: int) -> None:
    _on_exit.pop(key, None)


def note_further_stops() -> None:
    """Past this point a SIGTERM interrupts nothing (the reader is stopping already); it is
    noted, for ``stopped_by_spark``."""
    if _installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _note_sigterm)
