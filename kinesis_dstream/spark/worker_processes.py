"""The worker OS processes behind one Kinesis DStream: start, watch, restart, stop.

Each runs ``python -m kinesis_dstream worker`` with the forwarder as its processor. They
get their own session, so a Ctrl-C aimed at the driver reaches the driver only and the
stop goes through its graceful path. The config file holds credentials: 0600 in a 0700
directory.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from ..config import ConsumerConfig
from ..worker.process import spawn_worker

log = logging.getLogger(__name__)

FACTORY = "kinesis_dstream.spark.forwarder:make_factory"


class WorkerProcesses:
    def __init__(self, config: ConsumerConfig, count: int, directory: str,
                 factory_args: dict[str, Any], name: str):
        self.config = config
        self.count = count
        self.directory = directory
        self.factory_args = factory_args
        self.name = name
        self._procs: list[subprocess.Popen | None] = [None] * count
        self._worker_ids: list[str] = [""] * count
        self._generation = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._monitor = threading.Thread(target=self._watch, name=f"{name}-workers", daemon=True)

    def start(self) -> None:
        for index in range(self.count):
            self._spawn(index)
        self._monitor.start()

    def _spawn(self, index: int) -> None:
        self._generation += 1
        worker_id = f"{self.config.worker_id}-w{index}-{self._generation}"
        config_path = os.path.join(self.directory, f"worker-{index}.json")
        proc = spawn_worker(self.config.replace(worker_id=worker_id), config_path, FACTORY,
                            dict(self.factory_args, worker_id=worker_id),
                            stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
                            start_new_session=True)
        self._procs[index], self._worker_ids[index] = proc, worker_id
        log.info("%s: started worker %s (pid %d)", self.name, worker_id, proc.pid)

    def _watch(self) -> None:
        while not self._stopping.wait(1.0):
            with self._lock:
                if self._stopping.is_set():
                    return
                for index, proc in enumerate(self._procs):
                    if proc is not None and proc.poll() is not None:
                        log.error("%s: worker %s exited with code %s; starting a new one",
                                  self.name, self._worker_ids[index], proc.returncode)
                        self._spawn(index)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None]

    def alive(self) -> list[subprocess.Popen]:
        return [p for p in self._procs if p is not None and p.poll() is None]

    def stop(self, timeout_s: float) -> bool:
        """SIGTERM (graceful worker shutdown: leases released), SIGKILL after ``timeout_s``."""
        with self._lock:
            self._stopping.set()
        for proc in self.alive():
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        for proc in self.alive():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        clean = True
        for proc in self.alive():
            log.warning("%s: worker pid %d did not stop in %.0f s; killing it",
                        self.name, proc.pid, timeout_s)
            proc.kill()
            proc.wait()
            clean = False
        return clean
