"""The source's driver-side process deciding, as it ends, whether Spark stopped its query
(``sql.source_stop``), in a real process that gets real signals (no Spark: the JVM's socket
is a pipe). The decisions' logic: test_source_stop_unit.py; on a real query:
test_sql_no_register.py.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

pytestmark = pytest.mark.emulator

# The source's driver-side process as PySpark runs it (python_streaming_source_runner: a
# loop reading commands from the JVM's socket, the reader's stop() in its ``finally``), on
# a pipe for the socket and with the reader's driver and deregistration replaced. It prints
# "ready", then what stop() decided.
SOURCE_PROCESS = textwrap.dedent("""
    import sys, types
    from pyspark.serializers import read_int
    sys.modules["__main__"].__spec__ = types.SimpleNamespace(
        name="pyspark.sql.streaming.python_streaming_source_runner")
    from kinesis_dstream.aws import stream_consumer
    from kinesis_dstream.sql import reader, source_stop
    from kinesis_dstream.sql.options import parse_source_options
    from test_source_stop_unit import AWSLABS, FakeDriver

    source_stop.SPARK_STOP_WAIT_S = float(sys.argv[1])
    stream_consumer.deregister_stream_consumer = (
        lambda kinesis, arn: print("deregistered", flush=True))
    deciding = source_stop.stopped_by_spark
    def noted_deciding():
        print("deciding", flush=True)
        return deciding()
    source_stop.stopped_by_spark = noted_deciding
    source = reader.KinesisStreamReader(parse_source_options(AWSLABS))
    source._driver = FakeDriver()
    assert source_stop.install(id(source), source.stop)
    try:
        try:
            print("ready", flush=True)  # inside: a SIGTERM may come before print returns
            while True:
                if read_int(sys.stdin.buffer) == 7:
                    raise ValueError("the source's own error")
        finally:
            source.stop()
            print("stopped", flush=True)
    except BaseException:
        sys.exit(-1)
""")


def source_process(tmp_path: Any, wait_s: float) -> subprocess.Popen[str]:
    script = tmp_path / "source_process.py"
    script.write_text(SOURCE_PROCESS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(__file__)] + os.environ.get("PYTHONPATH", "").split(os.pathsep))}
    proc = subprocess.Popen([sys.executable, str(script), str(wait_s)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def close_socket(proc: subprocess.Popen[str]) -> None:
    """The JVM's end of the socket closes."""
    assert proc.stdin is not None
    proc.stdin.close()
    proc.stdin = None


def decided(proc: subprocess.Popen[str]) -> list[str]:
    out, _ = proc.communicate(timeout=60)
    return out.split()


def test_spark_s_sigterm_while_the_source_waits_for_a_command_deregisters(tmp_path):
    proc = source_process(tmp_path, wait_s=60)
    proc.send_signal(signal.SIGTERM)
    assert decided(proc) == ["deciding", "deregistered", "stopped"]


def test_the_socket_closed_by_stop_then_spark_s_sigterm_deregisters(tmp_path):
    """stop() interrupts the query's thread as it waits for the source: the socket closes
    first, Spark's SIGTERM comes once that thread reaches stopSources (seconds, loaded)."""
    proc = source_process(tmp_path, wait_s=60)
    close_socket(proc)
    assert proc.stdout is not None and proc.stdout.readline() == "deciding\n"
    proc.send_signal(signal.SIGTERM)
    assert decided(proc) == ["deregistered", "stopped"]


def test_the_socket_closed_and_no_sigterm_keeps_the_consumer(tmp_path):
    """A driver that died sends nothing: after the wait the consumer is kept."""
    proc = source_process(tmp_path, wait_s=1)
    close_socket(proc)
    assert decided(proc) == ["deciding", "stopped"]


def test_the_source_s_own_error_keeps_the_consumer_at_once(tmp_path):
    """No wait for a SIGTERM: the error reaches the query only once stop() returned (with
    the wait at 60 s, communicate()'s 60 s would time out)."""
    proc = source_process(tmp_path, wait_s=600)
    assert proc.stdin is not None
    proc.stdin.write("\x00\x00\x00\x07")
    proc.stdin.flush()
    assert decided(proc) == ["deciding", "stopped"]
