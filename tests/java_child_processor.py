"""An amazon-kclpy v3 record processor run by the Java MultiLangDaemon, one process per shard.

It appends every record and checkpoint to the JSON-lines file named by JAVA_CHILD_EVENTS, in
the format of tests/recording_processor.py, and checkpoints after every batch, so a test reads
what the Java side delivered and checkpointed exactly as it reads our workers' files. ``pid``
is this child's pid and ``daemon`` the Java daemon's (our worker writes its own pid only).
Each line is written with O_APPEND and fsync'ed before the checkpoint, so a kill -9 of the
daemon leaves the file consistent: a logged checkpoint was accepted by the daemon.
"""
from __future__ import annotations

import json
import os

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor


class JsonLinesRecorder(processor.RecordProcessorBase):
    def __init__(self, path: str) -> None:
        self.path = path
        self.shard_id: str | None = None

    def _write(self, entries: list[dict]) -> None:
        if not entries:
            return
        for entry in entries:
            entry.update(shard=self.shard_id, pid=os.getpid(), daemon=os.getppid())
        data = "".join(json.dumps(e) + "\n" for e in entries).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def initialize(self, initialize_input) -> None:
        self.shard_id = initialize_input.shard_id
        self._write([{"event": "initialize", "seq": initialize_input.sequence_number,
                      "sub": initialize_input.sub_sequence_number}])

    def process_records(self, process_records_input) -> None:
        records = process_records_input.records
        self._write([{"event": "record", "pk": r.partition_key,
                      "data": r.binary_data.decode("utf-8", "replace"),
                      "seq": r.sequence_number, "sub": r.sub_sequence_number or 0,
                      "ts": r.timestamp_millis}
                     for r in records])
        if records:
            last = records[-1]
            process_records_input.checkpointer.checkpoint(last.sequence_number,
                                                          last.sub_sequence_number)
            self._write([{"event": "checkpoint", "seq": last.sequence_number,
                          "sub": last.sub_sequence_number or 0}])

    def lease_lost(self, lease_lost_input) -> None:
        self._write([{"event": "lease_lost"}])

    def shard_ended(self, shard_ended_input) -> None:
        shard_ended_input.checkpointer.checkpoint()
        self._write([{"event": "shard_ended"}])

    def shutdown_requested(self, shutdown_requested_input) -> None:
        self._write([{"event": "shutdown_requested"}])


if __name__ == "__main__":
    kcl.KCLProcess(JsonLinesRecorder(os.environ["JAVA_CHILD_EVENTS"])).run()
