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
the reader's ``stop()``; ``stopped_by_spark`` says that this is why. Any other end of the
process is not a stop by Spark: the source's own error (PySpark calls ``stop()`` as that
error unwinds, before any SIGTERM), or the socket closed under it (the driver killed). A
pyspark without that ``finally`` still reaches the readers' ``stop()`` through ``atexit``.

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
from typing import Any, Callable

log = logging.getLogger(__name__)

# Set in the environment of the source's process by ``register(spark)``, which adds the
# driver's query listener: the listener deregisters, knowing whether the query failed.
LISTENER_ENV = "KINESIS_DSTREAM_STOP_LISTENER"
# The module PySpark runs (python -m) as a stream source's driver-side process.
SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


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
    return _stopped_by_spark


def _on_sigterm(signum: int, frame: Any) -> None:
    global _stopped_by_spark
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Spark may send it twice: act once
    _stopped_by_spark = True
    raise SourceStopped(0)


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


def ignore_further_stops() -> None:
    """Past this point a SIGTERM changes nothing (the reader is stopping already)."""
    if _installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
