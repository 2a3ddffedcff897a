"""A record processor for tests: appends every record and checkpoint to a JSON-lines file.

Importable by worker processes (``tests.recording_processor:make_factory``), so tests can
read what each worker delivered and checkpointed even after a kill -9.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.worker.process import spawn_worker
from kinesis_dstream.worker.processor import RecordProcessor

_lock = threading.Lock()


class RecordingProcessor(RecordProcessor):
    def __init__(self, path: str, shard_id: str, checkpoint_every_batch: bool = True):
        self.path = path
        self.shard_id = shard_id
        self.checkpoint_every_batch = checkpoint_every_batch

    def _write(self, entries: list[dict]) -> None:
        with _lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write("".join(json.dumps(e) + "\n" for e in entries))
            handle.flush()
            os.fsync(handle.fileno())

    def initialize(self, initialize_input) -> None:
        self._write([{"event": "initialize", "shard": self.shard_id, "pid": os.getpid(),
                      "seq": initialize_input.sequence_number,
                      "sub": initialize_input.sub_sequence_number}])

    def process_records(self, process_records_input) -> None:
        self._write([{"event": "record", "shard": self.shard_id, "pid": os.getpid(),
                      "pk": r.partition_key, "data": r.binary_data.decode("utf-8", "replace"),
                      "seq": r.sequence_number, "sub": r.sub_sequence_number,
                      "ts": r.approximate_arrival_timestamp}
                     for r in process_records_input.records])
        if self.checkpoint_every_batch and process_records_input.records:
            last = process_records_input.records[-1]
            process_records_input.checkpointer.checkpoint(last.sequence_number,
                                                          last.sub_sequence_number)
            self._write([{"event": "checkpoint", "shard": self.shard_id, "pid": os.getpid(),
                          "seq": last.sequence_number, "sub": last.sub_sequence_number}])

    def lease_lost(self, lease_lost_input) -> None:
        self._write([{"event": "lease_lost", "shard": self.shard_id, "pid": os.getpid()}])

    def shard_ended(self, shard_ended_input) -> None:
        shard_ended_input.checkpointer.checkpoint()
        self._write([{"event": "shard_ended", "shard": self.shard_id, "pid": os.getpid()}])

    def shutdown_requested(self, shutdown_requested_input) -> None:
        self._write([{"event": "shutdown_requested", "shard": self.shard_id, "pid": os.getpid()}])


def make_factory(path: str, checkpoint_every_batch: bool = True):
    def factory(shard_id: str) -> RecordingProcessor:
        return RecordingProcessor(path, shard_id, checkpoint_every_batch)

    return factory


def read_events(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def start_worker(config: ConsumerConfig, log_path: Path, tmp_path: Path, name: str,
                 **factory_args: Any) -> subprocess.Popen:
    """A worker process running this processor; its stderr goes to ``tmp_path/name.stderr``."""
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p))
    with open(tmp_path / f"{name}.stderr", "wb") as stderr:
        return spawn_worker(config, tmp_path / f"{name}.json", "recording_processor:make_factory",
                            {"path": str(log_path), **factory_args},
                            env=env, stdout=subprocess.DEVNULL, stderr=stderr)
