"""A worker as an OS process: ``kinesis-dstream worker --config F --processor-factory M:F``.

Workers are processes, not threads, so N of them share one application's shards on one
or many machines exactly as N KCL workers would, and a kill -9 of one is a real failover.
The processor factory is named by import path because it has to be rebuilt in the child.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
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
    factory = load_factory(args.processor_factory, json.loads(args.factory_args))
    return run_worker(config, factory)


def write_private(path: str | os.PathLike, text: str) -> None:
    """Write a file only its owner can read: worker configs may hold credentials."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def spawn_worker(config: ConsumerConfig, config_path: str | os.PathLike, factory_spec: str,
                 factory_args: Mapping[str, Any] | None = None,
                 **popen_kwargs: Any) -> subprocess.Popen:
    """Write ``config`` to ``config_path`` (0600) and start a worker process on it.

    Used by the Spark glue, the tests and the benchmarks, so all start workers one way.
    """
    write_private(config_path, json.dumps(config.to_dict()))
    command = [sys.executable, "-m", "kinesis_dstream", "worker", "--config", str(config_path),
               "--processor-factory", factory_spec,
               "--factory-args", json.dumps(dict(factory_args or {}))]
    return subprocess.Popen(command, **popen_kwargs)
