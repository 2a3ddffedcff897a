"""The multilang protocol against scripted children: StringIO, pipes and amazon-kclpy itself."""
from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
from pathlib import Path

import pytest
from amazon_kclpy.v3 import processor as kclpy_v3

from waiting import wait_for

from kinesis_dstream.errors import CheckpointError, ThrottlingError
from kinesis_dstream.multilang.messages import (
    CheckpointMessage,
    InitializeMessage,
    MalformedMessageError,
    ProtocolError,
    StatusMessage,
    decode_message,
)
from kinesis_dstream.multilang.processor import ChildFailedError, MultiLangRecordProcessor
from kinesis_dstream.multilang.protocol import (
    MAX_QUEUED_LINES,
    ChildExitedError,
    ChildTimeoutError,
    LineReader,
    MultiLangProtocol,
    StderrDrain,
)
from kinesis_dstream.records import Record
from kinesis_dstream.worker.processor import (
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)


class FakeCheckpointer:
    """Records calls; raises the scripted errors in order (None = succeed)."""

    def __init__(self, *errors):
        self.calls: list[tuple] = []
        self.errors = list(errors)

    def checkpoint(self, sequence_number=None, sub_sequence_number=None):
        self.calls.append((sequence_number, sub_sequence_number))
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error


def child_says(*lines: str) -> io.StringIO:
    """A child's stdout as kclpy frames it: each line is "\\n{json}\\n"."""
    return io.StringIO("".join(f"\n{line}\n" for line in lines))


def sent(stdin: io.StringIO) -> list[dict]:
    text = stdin.getvalue()
    assert "\n\n" not in text and not text.startswith("\n"), "no blank lines to kclpy"
    return [json.loads(line) for line in text.splitlines()]


RECORDS = [Record(b"hello", "pk1", "49590338271490256608559692538361571095921575989136588898", 0,
                  1_700_000_000_123, "shardId-000000000000"),
           Record(b"world", "pk2", "49590338271490256608559692538361571095921575989136588899", 3,
                  1_700_000_000_456, "shardId-000000000000")]


@pytest.mark.unit
def test_messages_round_trip_and_names():
    assert decode_message(InitializeMessage("s-1", "123", 4).to_line()) == \
        InitializeMessage("s-1", "123", 4)
    assert json.loads(CheckpointMessage("9", None, "ShutdownException").to_line()) == {
        "action": "checkpoint", "sequenceNumber": "9", "subSequenceNumber": None,
        "error": "ShutdownException"}
    assert decode_message('{"action":"status","responseFor":"initialize"}') == \
        StatusMessage("initialize")
    # Jackson coerces a numeric sequence number to its text; so do we.
    assert decode_message('{"action":"checkpoint","sequenceNumber":12,"subSequenceNumber":1}') \
        == CheckpointMessage("12", 1)


@pytest.mark.unit
@pytest.mark.parametrize("line, fragment", [
    ('{"action": "status", "responseFor"', "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"action": "dance"}', "unknown action 'dance'"),
    ('{"responseFor": "initialize"}', "unknown action None"),
    ('{"action": "status"}', "lacks field 'responseFor'"),
    ('{"action": "status", "responseFor": 7}', "bad value 7"),
    ('{"action": "processRecords", "records": "x"}', "bad value 'x'"),
])
def test_malformed_messages_say_what_is_wrong(line, fragment):
    with pytest.raises(MalformedMessageError, match=fragment.replace("(", r"\(")):
        decode_message(line)


@pytest.mark.unit
def test_process_records_with_checkpoints_and_their_errors():
    stdin = io.StringIO()
    stdout = child_says(
        '{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null}',
        '{"action":"checkpoint","sequenceNumber":"49590338271490256608559692538361571095921575989136588898","subSequenceNumber":0}',
        '{"action":"checkpoint","sequenceNumber":"5","subSequenceNumber":null}',
        '{"action":"checkpoint","sequenceNumber":"6","subSequenceNumber":null}',
        '{"action":"checkpoint","sequenceNumber":"7","subSequenceNumber":null}',
        '{"action":"checkpoint","sequenceNumber":"8","subSequenceNumber":"x"}',
        '{"action":"status","responseFor":"processRecords"}',
    )
    checkpointer = FakeCheckpointer(None, None, CheckpointError("IllegalArgumentException"),
                                    CheckpointError("ShutdownException"),
                                    ThrottlingError("slow down"))
    protocol = MultiLangProtocol(stdin, stdout, shard_id="shardId-000000000000", timeout_s=5)
    protocol.process_records(RECORDS, 1234, checkpointer)

    messages = sent(stdin)
    assert messages[0] == {
        "action": "processRecords", "millisBehindLatest": 1234,
        "records": [
            {"action": "record", "data": "aGVsbG8=", "partitionKey": "pk1",
             "sequenceNumber": RECORDS[0].sequence_number, "subSequenceNumber": 0,
             "approximateArrivalTimestamp": 1_700_000_000_123},
            {"action": "record", "data": "d29ybGQ=", "partitionKey": "pk2",
             "sequenceNumber": RECORDS[1].sequence_number, "subSequenceNumber": 3,
             "approximateArrivalTimestamp": 1_700_000_000_456}]}
    replies = messages[1:]
    assert [r["error"] for r in replies] == [None, None, "IllegalArgumentException",
                                             "ShutdownException", "ThrottlingException",
                                             "IllegalArgumentException"]
    assert replies[1] == {"action": "checkpoint", "sequenceNumber": RECORDS[0].sequence_number,
                          "subSequenceNumber": 0, "error": None}
    # The malformed sub-sequence number never reached the engine.
    assert checkpointer.calls == [(None, None), (RECORDS[0].sequence_number, 0), ("5", None),
                                  ("6", None), ("7", None)]


@pytest.mark.unit
@pytest.mark.parametrize("action", ["initialize", "leaseLost"])
def test_checkpoint_outside_allowed_actions_is_invalid_state(action):
    stdin = io.StringIO()
    stdout = child_says('{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null}',
                        f'{{"action":"status","responseFor":"{action}"}}')
    protocol = MultiLangProtocol(stdin, stdout, shard_id="s", timeout_s=5)
    if action == "initialize":
        protocol.initialize("TRIM_HORIZON", 0)
    else:
        protocol.lease_lost()
    messages = sent(stdin)
    assert messages[0]["action"] == action
    assert messages[1] == {"action": "checkpoint", "sequenceNumber": None,
                           "subSequenceNumber": None, "error": "InvalidStateException"}


@pytest.mark.unit
@pytest.mark.parametrize("action", ["shardEnded", "shutdownRequested"])
def test_checkpoint_allowed_at_shard_end_and_shutdown(action):
    stdin = io.StringIO()
    stdout = child_says('{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null}',
                        f'{{"action":"status","responseFor":"{action}"}}')
    checkpointer = FakeCheckpointer()
    protocol = MultiLangProtocol(stdin, stdout, shard_id="s", timeout_s=5)
    getattr(protocol, "shard_ended" if action == "shardEnded" else "shutdown_requested")(checkpointer)
    assert sent(stdin) == [{"action": action},
                           {"action": "checkpoint", "sequenceNumber": None,
                            "subSequenceNumber": None, "error": None}]
    assert checkpointer.calls == [(None, None)]


@pytest.mark.unit
def test_stray_stdout_text_is_skipped_but_broken_json_is_an_error(caplog):
    stdin = io.StringIO()
    stdout = io.StringIO("Encountered shutdown exception, skipping checkpoint\n\n\n"
                         '{"action":"status","responseFor":"initialize"}\n')
    with caplog.at_level(logging.WARNING):
        MultiLangProtocol(stdin, stdout, shard_id="s-7", timeout_s=5).initialize(None, None)
    assert "skipping unexpected line" in caplog.text and "s-7" in caplog.text

    stdout = child_says('{"action":"status", "responseFor": "initial')
    with pytest.raises(MalformedMessageError, match="shard s-7.*initialize.*not JSON"):
        MultiLangProtocol(io.StringIO(), stdout, shard_id="s-7", timeout_s=5).initialize(None, None)


@pytest.mark.unit
def test_status_for_the_wrong_action_is_a_protocol_error():
    stdout = child_says('{"action":"status","responseFor":"initialize"}')
    with pytest.raises(ProtocolError, match="'initialize'.*'processRecords'"):
        MultiLangProtocol(io.StringIO(), stdout, shard_id="s", timeout_s=5).process_records(
            RECORDS, 0, FakeCheckpointer())


@pytest.mark.unit
def test_child_exit_and_hang_over_pipes():
    # Exit: the child's stdout closes before its status.
    r, w = os.pipe()
    with os.fdopen(r) as stdout, os.fdopen(w, "w") as child_end:
        child_end.write('\n{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null}\n')
        child_end.close()
        stdin = io.StringIO()
        with pytest.raises(ChildExitedError, match="closed its stdout while handling processRecords"):
            MultiLangProtocol(stdin, stdout, shard_id="s", timeout_s=5).process_records(
                RECORDS, 0, FakeCheckpointer())
        assert sent(stdin)[1]["action"] == "checkpoint"  # it was still answered
    # Hang: nothing comes.
    r, w = os.pipe()
    with os.fdopen(r) as stdout, os.fdopen(w, "w"):
        with pytest.raises(ChildTimeoutError, match="no answer from the child for 0.3 s"):
            MultiLangProtocol(io.StringIO(), stdout, shard_id="s", timeout_s=0.3).initialize(None, None)
    # Our writes to a child whose stdin is gone.
    r, w = os.pipe()
    os.close(r)
    stdin = os.fdopen(w, "w")
    with pytest.raises(ChildExitedError, match="cannot write leaseLost"):
        MultiLangProtocol(stdin, io.StringIO(), shard_id="s", timeout_s=1).lease_lost()
    with pytest.raises(BrokenPipeError):  # the unwritten line is still buffered
        stdin.close()


@pytest.mark.unit
def test_stderr_is_drained_even_without_newlines(caplog):
    r, w = os.pipe()
    with caplog.at_level(logging.INFO, logger="kinesis_dstream.multilang.child"):
        with os.fdopen(r, "rb") as err:
            drain = StderrDrain(err, "shardId-9", max_line=100)
            with os.fdopen(w, "wb") as writer:
                writer.write(b"x" * 200_000)  # more than a pipe holds: must not block
                writer.write(b"\nTraceback: boom\n")
            drain.join(10)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[-1] == "[shardId-9] Traceback: boom"
    assert messages[:-1] == ["[shardId-9] " + "x" * 100] * 2000


# ---------------------------------------------------------------- amazon-kclpy as the child

class KclpyTestProcessor(kclpy_v3.RecordProcessorBase):
    """A kclpy v3 processor (what users write) that checkpoints in every callback."""

    def __init__(self):
        self.seen = []
        self.errors = []

    def initialize(self, initialize_input):
        self.seen.append(("initialize", initialize_input.shard_id, initialize_input.sequence_number))
        self._try(initialize_input, None)

    def _try(self, given, checkpointer, *args):
        from amazon_kclpy import kcl
        if checkpointer is None:
            return
        try:
            checkpointer.checkpoint(*args)
        except kcl.CheckpointError as exc:
            self.errors.append(exc.value)

    def process_records(self, process_records_input):
        for record in process_records_input.records:
            self.seen.append(("record", record.binary_data, record.sequence_number,
                              record.sub_sequence_number, record.timestamp_millis))
        last = process_records_input.records[-1]
        self._try(None, process_records_input.checkpointer, last.sequence_number,
                  last.sub_sequence_number)
        self._try(None, process_records_input.checkpointer, "1", 0)

    def lease_lost(self, lease_lost_input):
        self.seen.append(("leaseLost",))

    def shard_ended(self, shard_ended_input):
        self.seen.append(("shardEnded",))
        self._try(None, shard_ended_input.checkpointer)

    def shutdown_requested(self, shutdown_requested_input):
        self.seen.append(("shutdownRequested",))
        self._try(None, shutdown_requested_input.checkpointer)


@pytest.mark.unit
def test_amazon_kclpy_process_speaks_our_protocol():
    from amazon_kclpy import kcl

    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    child_in = os.fdopen(to_child_r)
    child_out = os.fdopen(from_child_w, "w")
    child_err = io.StringIO()
    processor = KclpyTestProcessor()
    process = kcl.KCLProcess(processor, input_file=child_in, output_file=child_out,
                             error_file=child_err)
    thread = threading.Thread(target=process.run, daemon=True)
    thread.start()

    ours_in = os.fdopen(to_child_w, "w")
    ours_out = os.fdopen(from_child_r)
    protocol = MultiLangProtocol(ours_in, ours_out, shard_id="shardId-000000000001", timeout_s=10)
    checkpointer = FakeCheckpointer(None, CheckpointError("IllegalArgumentException"), None)
    protocol.initialize("TRIM_HORIZON", 0)
    protocol.process_records(RECORDS, 0, checkpointer)
    protocol.shard_ended(checkpointer)
    ours_in.close()
    thread.join(10)
    assert not thread.is_alive()

    assert processor.seen == [
        ("initialize", "shardId-000000000001", "TRIM_HORIZON"),
        ("record", b"hello", RECORDS[0].sequence_number, 0, 1_700_000_000_123),
        ("record", b"world", RECORDS[1].sequence_number, 3, 1_700_000_000_456),
        ("shardEnded",),
    ]
    assert processor.errors == ["IllegalArgumentException"]
    assert checkpointer.calls == [(RECORDS[1].sequence_number, 3), ("1", 0), (None, None)]
    assert child_err.getvalue() == ""
    for f in (child_in, child_out, ours_out):
        f.close()


# ---------------------------------------------------------------- the processor with real children

CHILD = """\
import sys
sys.path.insert(0, {tests!r})
from test_multilang_protocol import KclpyTestProcessor
from amazon_kclpy import kcl
import json, os

class P(KclpyTestProcessor):
    def process_records(self, process_records_input):
        mode = os.environ.get("CHILD_MODE")
        if mode == "exit":
            os._exit(3)
        if mode == "hang":
            import time; time.sleep(60)
        sys.stderr.write("got %d records\\n" % len(process_records_input.records))
        super().process_records(process_records_input)

kcl.KCLProcess(P()).run()
"""


@pytest.fixture
def child_script(tmp_path: Path) -> Path:
    path = tmp_path / "child.py"
    path.write_text(CHILD.format(tests=str(Path(__file__).resolve().parent)))
    return path


def _processor(child_script, mode, timeout_s=10.0):
    env = dict(os.environ, CHILD_MODE=mode)
    return MultiLangRecordProcessor([sys.executable, str(child_script)], action_timeout_s=timeout_s,
                                    env=env)


@pytest.mark.emulator
def test_processor_runs_a_child_through_its_lifecycle(child_script, caplog):
    processor = _processor(child_script, "ok")
    checkpointer = FakeCheckpointer()
    with caplog.at_level(logging.INFO, logger="kinesis_dstream.multilang.child"):
        processor.initialize(InitializeInput("shardId-000000000002", "TRIM_HORIZON", 0))
        pid = processor.child_pid
        processor.process_records(ProcessRecordsInput(RECORDS, checkpointer, 0))
        processor.shutdown_requested(ShutdownRequestedInput(checkpointer))
    assert checkpointer.calls == [(RECORDS[1].sequence_number, 3), ("1", 0), (None, None)]
    assert processor.child_pid is None
    with pytest.raises(ProcessLookupError):  # reaped
        os.kill(pid, 0)
    assert "[shardId-000000000002] got 2 records" in caplog.text


@pytest.mark.emulator
@pytest.mark.parametrize("mode, match", [("exit", "exit code 3"), ("hang", "no answer")])
def test_processor_kills_a_failed_child_and_raises(child_script, mode, match):
    # The action timeout bounds initialize too, and the child's imports take over 1 s on a
    # loaded machine: a hang is waited out for 5 s, an exit is seen at once.
    processor = _processor(child_script, mode, timeout_s=5.0 if mode == "hang" else 10.0)
    processor.initialize(InitializeInput("shardId-000000000003", None, None))
    pid = processor.child_pid
    with pytest.raises(ChildFailedError, match=match) as info:
        processor.process_records(ProcessRecordsInput(RECORDS, FakeCheckpointer(), 0))
    assert "restarts from its last checkpoint" in str(info.value)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # What the engine may still call on a failed processor: no hang, no second child.
    processor.lease_lost(LeaseLostInput())
    processor.shutdown_requested(ShutdownRequestedInput(FakeCheckpointer()))
    with pytest.raises(ChildFailedError):
        processor.shard_ended(ShardEndedInput(FakeCheckpointer()))


@pytest.mark.emulator
def test_a_child_that_stops_reading_is_killed_when_a_write_blocks(tmp_path):
    # The child answers initialize, then sleeps without reading: our big processRecords
    # line fills the pipe. The write is bounded by the action timeout too.
    script = tmp_path / "deaf.py"
    script.write_text("import sys, time\n"
                      "sys.stdin.readline()\n"
                      "print('{\"action\":\"status\",\"responseFor\":\"initialize\"}', flush=True)\n"
                      "time.sleep(60)\n")
    processor = MultiLangRecordProcessor([sys.executable, str(script)], action_timeout_s=1.0)
    processor.initialize(InitializeInput("s", None, None))
    big = [Record(b"x" * 50_000, "pk", str(10 ** 20 + i)) for i in range(10)]
    with pytest.raises(ChildFailedError, match="read nothing for 1 s while we wrote processRecords"):
        processor.process_records(ProcessRecordsInput(big, FakeCheckpointer(), 0))


@pytest.mark.emulator
def test_processor_reports_a_command_that_cannot_start():
    processor = MultiLangRecordProcessor(["/nonexistent/child-program"])
    with pytest.raises(ChildFailedError, match="cannot start"):
        processor.initialize(InitializeInput("s", None, None))


@pytest.mark.unit
def test_a_child_flooding_stdout_is_read_no_further_ahead_than_the_bounded_queue():
    """The reader stops reading when MAX_QUEUED_LINES wait (a child then blocks on its
    pipe); every line still comes, in order, as the protocol takes them."""
    lines = [f'{{"action": "status", "n": {i}}}\n' for i in range(10_000)]
    stream = io.StringIO("".join(lines))
    reader = LineReader(stream, "stdout-flood")
    wait_for(reader._lines.full, 5, "the reader's queue full")
    assert stream.tell() <= len("".join(lines[:MAX_QUEUED_LINES + 1]))  # one line in hand
    assert [reader.next_line(5) for _ in lines] == lines
    assert reader.next_line(5) is None


@pytest.mark.unit
def test_a_reader_blocked_on_its_full_queue_ends_when_stdout_is_closed():
    stream = io.StringIO("".join(f"line {i}\n" for i in range(100)))
    reader = LineReader(stream, "stdout-closed")
    wait_for(reader._lines.full, 5, "the reader's queue full")
    stream.close()  # what reaping the child does
    reader._thread.join(5)
    assert not reader._thread.is_alive()
