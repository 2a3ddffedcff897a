"""An executor's Python worker process as a reader sets it up: its clients kept out of the
per-task garbage collection, its log lines. Each test runs a fresh Python process."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.emulator


def test_a_reader_process_keeps_its_clients_out_of_the_per_task_garbage_collection() -> None:
    """PySpark's reused workers run gc.collect() after every task; boto3's objects must not be
    walked each time (they were most of the executors' CPU at 200 records/s)."""
    out = _in_a_fresh_reader_process("import gc\n",
                                     "print(gc.get_freeze_count(), len(gc.get_objects()))\n")
    frozen, walked = map(int, out.stdout.split())
    assert frozen > 20_000  # botocore's loaded models and the clients
    assert walked < 2_000  # what a task's gc.collect() still walks



def test_an_executor_process_logs_with_time_level_and_logger() -> None:
    """A Python worker has no logging set up; our lines must still say when, how bad and who."""
    import re
    out = _in_a_fresh_reader_process("", "shard_reader.log.info('not shown')\n"
                                         "shard_reader.log.warning('reading shard x failing')\n")
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING "
                    r"kinesis_dstream\.executor\.shard_reader \[pid \d+\]: reading shard x failing$",
                    lines[0]), lines[0]


def _in_a_fresh_reader_process(before: str, after: str):
    """Run ``before``, an executor reader's clients being made, then ``after``, in a new
    Python process (as a Spark Python worker starts); its completed process."""
    import os
    import subprocess
    import sys

    code = (before + "from kinesis_dstream.config import ConsumerConfig\n"
            "from kinesis_dstream.executor import shard_reader\n"
            "config = ConsumerConfig(application_name='app', stream_name='s', "
            "region_name='us-east-1', kinesis_endpoint='http://127.0.0.1:9', "
            "dynamodb_endpoint='http://127.0.0.1:9')\n"
            "shard_reader.clients_for(config)\n" + after)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "AWS_ACCESS_KEY_ID": "x",
                                          "AWS_SECRET_ACCESS_KEY": "y"})
    assert out.returncode == 0, out.stderr
    return out
