"""A worker as an OS process: ``kinesis-dstream worker --config F --processor-factory M:F``.

Workers are processes, not threads, so N of them share one application's shards on one
or many machines exactly as N KCL workers would, and a kill -9 of one is a real failover.
The processor factory is named by import path because it has to be rebuilt in the child.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from typing import Any, Mapping

from ..config import ConsumerConfig
from ..errors import ConfigurationError, KinesisDStreamError
from .processor import ProcessorFactory
from .scheduler import Scheduler

log = logging.getLogger(__name__)


def load_factory(spec: str, args: Mapping[str, Any]) -> ProcessorFactory:
    """Import ``module:function`` and call it with ``args`` to get a ProcessorFactory."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"--processor-factory must be module:function, got {spec!r}")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load processor factory {spec!r}: {exc}") from exc
    return function(**args)


def run_worker(config: ConsumerConfig, factory: ProcessorFactory) -> int:
    """Run until SIGTERM/SIGINT, then shut down gracefully (leases released)."""
    scheduler = Scheduler(config, factory)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: shutting down worker %s", signum, config.worker_id)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        scheduler.start()
    except KinesisDStreamError as exc:
        log.error("worker could not start: %s", exc)
        return 3
    while not stop.wait(0.5):
        pass
    return 0 if scheduler.shutdown() else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kinesis-dstream worker")
    parser.add_argument("--config", required=True, help="JSON file of ConsumerConfig fields")
    parser.add_argument("--processor-factory", required=True, help="module:function")
    parser.add_argument("--factory-args", default="{}", help="JSON object of keyword arguments")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as handle:
        config = ConsumerConfig.from_dict(json.load(handle))
    if os.path.basename(args.config).startswith(PRIVATE_PREFIX):
        os.unlink(args.config)  # a file we named holds secrets only until it is read
    factory = load_factory(args.processor_factory, json.loads(args.factory_args))
    return run_worker(config, factory)


# Files that may hold secrets are named <prefix><pid>-<random>[suffix], so a later start can
# tell which ones a killed process left behind.
PRIVATE_PREFIX = "kinesis-dstream-private-"


def write_private(path: str | os.PathLike, text: str) -> None:
    """Write a file only its owner can ever read: worker configs may hold credentials.

    The text goes to a new 0600 file (O_EXCL: never an existing file or a planted link)
    that is renamed over ``path``, so no reader sees a partial file and no moment exists
    where the file is readable by others.
    """
    directory = os.path.dirname(os.fspath(path)) or "."
    temporary = os.path.join(directory, f"{PRIVATE_PREFIX}{os.getpid()}-{uuid.uuid4().hex}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def private_path(directory: str | os.PathLike | None = None, suffix: str = ".json") -> str:
    """A fresh name for a secret-holding file, marked with this process's pid."""
    directory = os.fspath(directory) if directory is not None else tempfile.gettempdir()
    return os.path.join(directory, f"{PRIVATE_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{suffix}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_stale_private_files(directory: str | os.PathLike | None = None) -> list[str]:
    """Remove the secret-holding files that processes killed with -9 left in ``directory``.

    Only files named by ``private_path``/``write_private`` and owned by this user whose pid
    is dead are removed; returns their paths.
    """
    directory = os.fspath(directory) if directory is not None else tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(PRIVATE_PREFIX):
            continue
        pid_text = name[len(PRIVATE_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit() or _pid_alive(int(pid_text)):
            continue
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    if removed:
        log.info("removed %d file(s) left by killed processes in %s", len(removed), directory)
    return removed


def spawn_worker(config: ConsumerConfig, config_path: str | os.PathLike | None, factory_spec: str,
                 factory_args: Mapping[str, Any] | None = None,
                 **popen_kwargs: Any) -> subprocess.Popen:
    """Write ``config`` to ``config_path`` (0600) and start a worker process on it.

    Used by the tests and the benchmarks, so both start workers one way.
    ``config_path`` None means a fresh ``private_path()`` in the temp directory. Files a
    killed run left there (and next to ``config_path``) are removed first.
    """
    if config_path is None:
        config_path = private_path()
    for directory in {tempfile.gettempdir(), os.path.dirname(os.fspath(config_path)) or "."}:
        remove_stale_private_files(directory)
    write_private(config_path, json.dumps(config.to_dict()))
    command = [sys.executable, "-m", "kinesis_dstream", "worker", "--config", str(config_path),
               "--processor-factory", factory_spec,
               "--factory-args", json.dumps(dict(factory_args or {}))]
    return subprocess.Popen(command, **popen_kwargs)
