"""The daemon's side of the multilang protocol, for one child process (one shard).

As the Java ``MultiLangProtocol``: write an action, then read the child's lines until its
``status`` for that action, serving its ``checkpoint`` requests in between. The streams
are passed in, so tests drive it through pipes or ``io.StringIO`` with a scripted child.
Lines that are not JSON objects (a ``print`` in the child's code) are skipped with a
warning, as the Java daemon does; a JSON object we cannot use is a protocol error.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import IO, Any, Callable, Optional, Sequence

from ..errors import KinesisDStreamError
from ..worker.checkpoint import kcl_exception_name
from ..worker.processor import Checkpointer
from .messages import (
    CheckpointMessage,
    InitializeMessage,
    LeaseLostMessage,
    MalformedMessageError,
    Message,
    ProcessRecordsMessage,
    ProtocolError,
    ShardEndedMessage,
    ShutdownRequestedMessage,
    StatusMessage,
    decode_message,
)

log = logging.getLogger(__name__)
child_log = logging.getLogger("kinesis_dstream.multilang.child")

# The KCL accepts a checkpoint only while the child handles one of these.
CHECKPOINT_ACTIONS = frozenset({"processRecords", "shardEnded", "shutdownRequested"})
_MAX_LINE = 1 << 20
# Lines read ahead of the protocol: a child flooding stdout then blocks on its full pipe (the
# reader thread waits on the full queue), instead of filling the daemon's memory.
MAX_QUEUED_LINES = 16
_PUT_POLL_S = 0.5  # how often a reader blocked on a full queue looks whether stdout was closed
_EOF = object()


class ChildExitedError(ProtocolError):
    """The child closed its stdout or stdin (it exited or crashed)."""


class ChildTimeoutError(ProtocolError):
    """The child said nothing for longer than the action timeout."""


class LineReader:
    """Reads the child's stdout on its own thread (the KCL's GetNextMessageTask), so that
    waiting for a line can time out. At most ``MAX_QUEUED_LINES`` lines wait to be taken;
    a reader blocked on the full queue ends when the stream is closed (the child reaped)."""

    def __init__(self, stream: IO[str], name: str):
        self._stream = stream
        self._lines: "queue.Queue[Any]" = queue.Queue(maxsize=MAX_QUEUED_LINES)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        """Queue ``item``, waiting while the queue is full; False if the stream was closed."""
        while True:
            try:
                self._lines.put(item, timeout=_PUT_POLL_S)
                return True
            except queue.Full:
                if getattr(self._stream, "closed", False):
                    return False

    def _run(self) -> None:
        try:
            while True:
                line = self._stream.readline(_MAX_LINE)
                if not line or not self._put(line):
                    break
        except (OSError, ValueError) as exc:  # closed under us: same as EOF
            log.debug("%s: stdout closed: %s", self._thread.name, exc)
        finally:
            self._put(_EOF)

    def next_line(self, timeout_s: float | None) -> Optional[str]:
        """The next line, None at end of stream; raises queue.Empty after ``timeout_s``."""
        item = self._lines.get(timeout=timeout_s)
        if item is _EOF:
            self._lines.put(_EOF)  # stay at EOF for later calls (the reader has ended)
            return None
        return item


class StderrDrain:
    """Logs the child's stderr (the KCL's DrainChildSTDERRTask) so a chatty child never
    blocks on a full pipe. Reads chunks, not lines: amazon-kclpy's sample writes one
    record log after another with no newline."""

    def __init__(self, stream: IO[Any], shard_id: str, max_line: int = 8192):
        self._stream = stream
        self._shard_id = shard_id
        self._max_line = max_line
        self._thread = threading.Thread(target=self._run, name=f"stderr-{shard_id}", daemon=True)
        self._thread.start()

    def _read(self) -> str:
        read1 = getattr(self._stream, "read1", None)
        chunk = read1(65536) if read1 is not None else self._stream.readline()
        if isinstance(chunk, bytes):
            return chunk.decode("utf-8", errors="replace")
        return chunk

    def _run(self) -> None:
        pending = ""
        try:
            while True:
                chunk = self._read()
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split("\n")
                while len(pending) > self._max_line:  # bounded memory for an endless line
                    lines.append(pending[: self._max_line])
                    pending = pending[self._max_line:]
                for line in lines:
                    for start in range(0, len(line), self._max_line):
                        piece = line[start:start + self._max_line].rstrip()
                        if piece.strip():
                            child_log.info("[%s] %s", self._shard_id, piece)
        except (OSError, ValueError) as exc:
            log.debug("stderr of child for %s closed: %s", self._shard_id, exc)
        if pending.strip():
            child_log.info("[%s] %s", self._shard_id, pending.rstrip())

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


class MultiLangProtocol:
    """Speaks to one child; every method returns when the child reported ``status``."""

    def __init__(self, child_stdin: IO[str], child_stdout: IO[str], *, shard_id: str,
                 timeout_s: float | None = None, kill: Callable[[], None] | None = None):
        """``kill`` ends the child; it bounds a write to a child that stopped reading
        (a big processRecords line blocks on a full pipe) by ``timeout_s``."""
        self._out = child_stdin
        self._shard_id = shard_id
        self._timeout_s = timeout_s
        self._kill = kill
        self._reader = LineReader(child_stdout, name=f"stdout-{shard_id}")

    # -- the five actions --------------------------------------------------------------
    def initialize(self, sequence_number: str | None, sub_sequence_number: int | None) -> None:
        self._run(InitializeMessage(self._shard_id, sequence_number, sub_sequence_number), None)

    def process_records(self, records: Sequence[Any], millis_behind_latest: int | None,
                        checkpointer: Checkpointer) -> None:
        message = ProcessRecordsMessage(
            tuple(r if isinstance(r, dict) else r.to_json_dict() for r in records),
            millis_behind_latest)
        self._run(message, checkpointer)

    def lease_lost(self) -> None:
        self._run(LeaseLostMessage(), None)

    def shard_ended(self, checkpointer: Checkpointer) -> None:
        self._run(ShardEndedMessage(), checkpointer)

    def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        self._run(ShutdownRequestedMessage(), checkpointer)

    # -- machinery -------------------------------------------------------------------
    def _write(self, message: Message) -> None:
        timer = None
        if self._kill is not None and self._timeout_s is not None:
            timer = threading.Timer(self._timeout_s, self._kill)
            timer.daemon = True
            timer.start()
        try:
            self._out.write(message.to_line())
            self._out.flush()
        except (OSError, ValueError) as exc:  # BrokenPipeError, or stdin already closed
            if timer is not None and timer.finished.is_set():
                raise ChildTimeoutError(
                    f"shard {self._shard_id}: the child read nothing for {self._timeout_s:g} s "
                    f"while we wrote {message.action}; killed") from exc
            raise ChildExitedError(
                f"shard {self._shard_id}: cannot write {message.action} to the child: {exc}"
            ) from exc
        finally:
            if timer is not None:
                timer.cancel()

    def _next_message(self, waiting_for: str) -> Message:
        while True:
            try:
                line = self._reader.next_line(self._timeout_s)
            except queue.Empty:
                raise ChildTimeoutError(
                    f"shard {self._shard_id}: no answer from the child for {self._timeout_s:g} s "
                    f"while waiting for its status for {waiting_for}") from None
            if line is None:
                raise ChildExitedError(
                    f"shard {self._shard_id}: the child closed its stdout while handling "
                    f"{waiting_for}")
            if not line.strip():
                continue
            if not line.lstrip().startswith("{"):
                log.warning("shard %s: skipping unexpected line on the child's stdout: %r",
                            self._shard_id, line.rstrip()[:500])
                continue
            try:
                return decode_message(line)
            except MalformedMessageError as exc:
                raise MalformedMessageError(
                    f"shard {self._shard_id}, while waiting for status for {waiting_for}: {exc}"
                ) from None

    def _run(self, message: Message, checkpointer: Checkpointer | None) -> None:
        self._write(message)
        while True:
            reply = self._next_message(message.action)
            if isinstance(reply, StatusMessage):
                if reply.response_for != message.action:
                    raise ProtocolError(
                        f"shard {self._shard_id}: status for {reply.response_for!r} received "
                        f"while waiting for status for {message.action!r}")
                return
            if isinstance(reply, CheckpointMessage):
                self._write(self._checkpoint(reply, checkpointer, message.action))
                continue
            raise ProtocolError(
                f"shard {self._shard_id}: unexpected {reply.action!r} message from the child "
                f"while waiting for status for {message.action!r}")

    def _checkpoint(self, request: CheckpointMessage, checkpointer: Checkpointer | None,
                    action: str) -> CheckpointMessage:
        seq, sub = request.sequence_number, request.sub_sequence_number
        if checkpointer is None or action not in CHECKPOINT_ACTIONS:
            log.warning("shard %s: child asked to checkpoint at %s during %s; refused "
                        "(InvalidStateException)", self._shard_id, seq, action)
            return CheckpointMessage(seq, sub, "InvalidStateException")
        if (seq is not None and not isinstance(seq, str)) or \
                (sub is not None and (not isinstance(sub, int) or isinstance(sub, bool))):
            return CheckpointMessage(seq, sub, "IllegalArgumentException")
        try:
            if seq is None:
                checkpointer.checkpoint()
            else:
                checkpointer.checkpoint(seq, sub)
        except KinesisDStreamError as exc:
            name = kcl_exception_name(exc)
            log.info("shard %s: checkpoint at %s/%s refused: %s", self._shard_id, seq, sub, exc)
            return CheckpointMessage(seq, sub, name)
        log.debug("shard %s: checkpointed at %s/%s for the child", self._shard_id, seq, sub)
        return CheckpointMessage(seq, sub, None)
