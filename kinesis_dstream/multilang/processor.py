"""A record processor that runs an amazon-kclpy program as a child process per shard.

This is the Java daemon's ``MultiLangShardRecordProcessor`` on our engine. When the child
crashes, hangs past the action timeout or breaks the protocol, we kill it and raise
``ChildFailedError`` out of the callback: the engine's shard consumer then makes a new
processor (a new child) and fetches again from the last checkpoint, so nothing after that
checkpoint is lost. (The Java daemon exits the whole JVM on a status timeout.)
"""
from __future__ import annotations

import io
import logging
import os
import subprocess
from typing import Callable, Mapping, Sequence

from ..worker.processor import (
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from .messages import ProtocolError
from .properties import DEFAULT_ACTION_TIMEOUT_S
from .protocol import MultiLangProtocol, StderrDrain

log = logging.getLogger(__name__)


class ChildFailedError(ProtocolError):
    """The child died, hung or broke the protocol; it was killed. The shard restarts from
    its last checkpoint with a new child."""


class ChildProcess:
    """One running child with its pipes; stderr drained to our log."""

    def __init__(self, command: Sequence[str], shard_id: str, *, cwd: str | None = None,
                 env: Mapping[str, str] | None = None):
        # A new session: Ctrl-C on the daemon's terminal must not kill the children before
        # they get shutdownRequested. If the daemon dies, their stdin closes and kclpy's
        # loop ends on its own.
        self.proc = subprocess.Popen(
            list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=cwd, env=dict(env) if env is not None else None,
            start_new_session=True)
        self.shard_id = shard_id
        stdin, stdout, stderr = self.proc.stdin, self.proc.stdout, self.proc.stderr
        assert stdin is not None and stdout is not None and stderr is not None  # all PIPEs
        self.stdin = io.TextIOWrapper(stdin, encoding="utf-8", write_through=True)
        self.stdout = io.TextIOWrapper(stdout, encoding="utf-8", errors="replace")
        self._drain = StderrDrain(stderr, shard_id)
        log.info("shard %s: started child pid %d: %s", shard_id, self.proc.pid, " ".join(command))

    def describe(self) -> str:
        code = self.proc.poll()
        state = "running" if code is None else f"exit code {code}"
        return f"child pid {self.proc.pid} ({state})"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self._reap(5.0)

    def close(self, timeout_s: float) -> None:
        """End of stdin ends kclpy's read loop; kill if it lingers."""
        try:
            self.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("shard %s: child pid %d did not exit within %.1f s; killing it",
                        self.shard_id, self.proc.pid, timeout_s)
            self.proc.kill()
        self._reap(5.0)

    def _reap(self, timeout_s: float) -> None:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.error("shard %s: child pid %d survived SIGKILL", self.shard_id, self.proc.pid)
        self._drain.join(2.0)
        for stream in (self.stdin, self.stdout):
            try:
                stream.close()
            except OSError:
                pass


class MultiLangRecordProcessor(RecordProcessor):
    """Bridges the engine's callbacks for one shard lease to a child process."""

    def __init__(self, command: Sequence[str], *, action_timeout_s: float = DEFAULT_ACTION_TIMEOUT_S,
                 exit_timeout_s: float = 5.0, cwd: str | None = None,
                 env: Mapping[str, str] | None = None):
        self._command = tuple(command)
        self._action_timeout_s = action_timeout_s
        self._exit_timeout_s = exit_timeout_s
        self._cwd = cwd
        self._env = env
        self._shard_id = "?"
        self._child: ChildProcess | None = None
        self._protocol: MultiLangProtocol | None = None

    @property
    def child_pid(self) -> int | None:
        return self._child.proc.pid if self._child is not None else None

    def initialize(self, initialize_input: InitializeInput) -> None:
        self._shard_id = initialize_input.shard_id
        try:
            self._child = ChildProcess(self._command, self._shard_id, cwd=self._cwd, env=self._env)
        except OSError as exc:
            raise ChildFailedError(
                f"shard {self._shard_id}: cannot start {' '.join(self._command)!r}: {exc}") from exc
        self._protocol = MultiLangProtocol(self._child.stdin, self._child.stdout,
                                           shard_id=self._shard_id,
                                           timeout_s=self._action_timeout_s,
                                           kill=self._child.proc.kill)
        self._call("initialize", lambda p: p.initialize(initialize_input.sequence_number,
                                                        initialize_input.sub_sequence_number))

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        self._call("processRecords", lambda p: p.process_records(
            process_records_input.records, process_records_input.millis_behind_latest,
            process_records_input.checkpointer))

    def lease_lost(self, lease_lost_input: LeaseLostInput) -> None:
        try:
            self._finish("leaseLost", lambda p: p.lease_lost())
        except ChildFailedError as exc:
            # Nothing to save: another worker owns the shard now.
            log.warning("%s", exc)

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        self._finish("shardEnded", lambda p: p.shard_ended(shard_ended_input.checkpointer))

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        self._finish("shutdownRequested",
                     lambda p: p.shutdown_requested(shutdown_requested_input.checkpointer))

    def close(self) -> None:
        """Kill the child if one is left (the shard consumer calls this after a failure)."""
        child, self._child, self._protocol = self._child, None, None
        if child is not None:
            child.kill()

    # -- machinery -------------------------------------------------------------------
    def _call(self, action: str, step: Callable[[MultiLangProtocol], None]) -> None:
        if self._protocol is None or self._child is None:
            raise ChildFailedError(f"shard {self._shard_id}: no child process for {action} "
                                   "(it failed earlier)")
        try:
            step(self._protocol)
        except ProtocolError as exc:
            child, self._child, self._protocol = self._child, None, None
            child.kill()
            raise ChildFailedError(
                f"shard {self._shard_id}: {child.describe()} failed during {action}: {exc}; "
                "it was killed, the shard restarts from its last checkpoint") from exc

    def _finish(self, action: str, step: Callable[[MultiLangProtocol], None]) -> None:
        if self._child is None:
            if action == "shardEnded":
                raise ChildFailedError(f"shard {self._shard_id}: no child process to end the shard")
            log.info("shard %s: no child process left for %s", self._shard_id, action)
            return
        self._call(action, step)
        child, self._child, self._protocol = self._child, None, None
        child.close(self._exit_timeout_s)


def processor_factory(command: Sequence[str], *, action_timeout_s: float = DEFAULT_ACTION_TIMEOUT_S,
                      cwd: str | None = None,
                      env: Mapping[str, str] | None = None) -> Callable[[str], RecordProcessor]:
    """A ProcessorFactory for the Scheduler: one MultiLangRecordProcessor per shard lease."""
    def make(shard_id: str) -> RecordProcessor:
        return MultiLangRecordProcessor(command, action_timeout_s=action_timeout_s,
                                        cwd=cwd, env=env if env is not None else os.environ)
    return make
