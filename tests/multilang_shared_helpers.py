"""Launchers for running ONE KCL properties file under both MultiLangDaemons.

tests/java_kcl.py writes its own properties file per daemon; these launchers take a given
file instead, so the Java KCL 2.5.8 MultiLangDaemon and ``python -m kinesis_dstream
multilang`` read the very same file. Both run in their own session (process group):
``kill()`` is kill -9 of the daemon alone (its children see EOF on stdin and exit, as after
a machine crash); ``close()`` ends whatever is left. Each daemon's environment names its own
JSON-lines events file for tests/java_child_processor.py (JAVA_CHILD_EVENTS), so a test
tells which daemon delivered and checkpointed what.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from java_kcl import EVENTS_ENV, JVM_FLAGS
from processes import reap

from kinesis_dstream.multilang.java_daemon import daemon_command, properties_text

TESTS_DIR = Path(__file__).resolve().parent


def write_properties(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text("# one file for the Java MultiLangDaemon and for ours\n"
                    + properties_text(settings))
    return path


class DaemonProcess:
    """One MultiLangDaemon (``kind`` "java" or "ours") on a properties file."""

    def __init__(self, kind: str, properties: Path, workdir: Path, name: str) -> None:
        self.kind = kind
        self.name = name
        self.events_path = workdir / f"{name}.events.jsonl"
        self.log_path = workdir / f"{name}.log"
        if kind == "java":
            command = daemon_command(properties, JVM_FLAGS)
        else:
            command = [sys.executable, "-m", "kinesis_dstream", "multilang",
                       "--properties-file", str(properties)]
        env = dict(os.environ, **{EVENTS_ENV: str(self.events_path)})
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 of the daemon alone."""
        reap(self.proc)

    def terminate(self, timeout: float = 40.0) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        reap(self.proc)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the Java daemon's children share its group
        except ProcessLookupError:
            pass

    def log(self, limit: int = 5000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- {self.name} ({self.kind}, pid {self.proc.pid}) ---\n{text[-limit:]}"


