"""An executor's Python worker process as a reader sets it up: its clients kept out of the
per-task garbage collection, its log lines. Each test runs a fresh Python process."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.emulator


def test_a_reader_process_keeps_its_clients_out_of_the_per_task_garbage_collection() -> None:
    """PySpark's reused workers run gc.collect() after every task; boto3's objects must not be
    walked each time (they were most of the executors' CPU at 200 records/s)."""
    out = _in_a_fresh_reader_process("import gc, types\n", """
clients = executor_process.clients_for(config)
walked = {id(o) for o in gc.get_objects()}  # what a collection walks: never the frozen
# The clients' own objects (botocore's clients, their service models, ...): all that they
# reach, short of modules, classes and functions (whose globals reach everything).
held, seen, todo = [], set(), [clients]
while todo:
    o = todo.pop()
    if id(o) in seen or isinstance(o, (type, types.ModuleType, types.FunctionType,
                                       types.BuiltinFunctionType)):
        continue
    seen.add(id(o))
    if gc.is_tracked(o):
        held.append(o)
    todo.extend(gc.get_referents(o))
later = [object()]  # a task's garbage, made after the clients
print(len(held), sum(id(o) in walked for o in held), id(later) in {id(o) for o in gc.get_objects()})
""")
    held, walked, later_walked = out.stdout.split()
    assert int(held) > 100, held  # the clients hold a graph of objects, not a few
    assert int(walked) == 0, f"{walked} of the clients' {held} objects still walked by gc"
    assert later_walked == "True"  # what tasks make later is collected as before


def test_an_executor_process_logs_with_time_level_and_logger() -> None:
    """A Python worker has no logging set up; our lines must still say when, how bad and who."""
    import re
    out = _in_a_fresh_reader_process("", "executor_process.log.info('not shown')\n"
                                         "executor_process.log.warning('reading shard x failing')\n")
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING "
                    r"kinesis_dstream\.retrieval\.executor_process \[pid \d+\]: reading shard x failing$",
                    lines[0]), lines[0]


def test_an_executor_process_reads_a_zip_archive_again_only_when_it_changed(tmp_path) -> None:
    """PySpark 3.5's worker invalidates the import caches before every task; on Python 3.10
    and 3.11 that re-read pyspark.zip's directory a dozen times a task, and DStream batches
    fell behind. An unchanged archive is read no more; a changed one still is."""
    archive = tmp_path / "lib.zip"
    out = _in_a_fresh_reader_process(f"""
import importlib, sys, zipfile, zipimport
archive = {str(archive)!r}
with zipfile.ZipFile(archive, "w") as z:
    z.writestr("zpkg/__init__.py", "")
    z.writestr("zpkg/first.py", "X = 1")
sys.path.insert(0, archive)
import zpkg.first
""", """
reads = []
eager_read = zipimport._read_directory
zipimport._read_directory = lambda path: reads.append(path) or eager_read(path)
importlib.invalidate_caches()  # as a task's worker does
reads.clear()
for _ in range(3):
    importlib.invalidate_caches()
unchanged = len(reads)
with zipfile.ZipFile(archive, "a") as z:
    z.writestr("zpkg/second.py", "X = 2")
importlib.invalidate_caches()
import zpkg.second
print(unchanged, zpkg.second.X)
""")
    unchanged, second = out.stdout.split()
    assert unchanged == "0", f"{unchanged} reads of an unchanged archive in 3 invalidations"
    assert second == "2"  # a module added to the archive is found after an invalidation


def _in_a_fresh_reader_process(before: str, after: str):
    """Run ``before``, an executor reader's clients being made, then ``after``, in a new
    Python process (as a Spark Python worker starts); its completed process."""
    import os
    import subprocess
    import sys

    code = (before + "from kinesis_dstream.config import ConsumerConfig\n"
            "from kinesis_dstream.retrieval import executor_process\n"
            "config = ConsumerConfig(application_name='app', stream_name='s', "
            "region_name='us-east-1', kinesis_endpoint='http://127.0.0.1:9', "
            "dynamodb_endpoint='http://127.0.0.1:9')\n"
            "executor_process.clients_for(config)\n" + after)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "AWS_ACCESS_KEY_ID": "x",
                                          "AWS_SECRET_ACCESS_KEY": "y"})
    assert out.returncode == 0, out.stderr
    return out
