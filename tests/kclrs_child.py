"""A kcl-rs (the Rust KCL's Python package) multi-stream worker, as a child process of a test.

``python kclrs_child.py '{"ids": [...], "app": ..., "out": ..., "worker": ...}'``: reads the
streams named by their serialized identifiers (account:stream:creationEpoch) with polling,
endpoints from the AWS_ENDPOINT_URL_* variables, writes one JSON line per event to ``out``
and checkpoints every batch; SIGTERM shuts it down gracefully.
"""
from __future__ import annotations

import json
import signal
import sys
import threading

from kcl_rs import RecordProcessorBase, Scheduler


def main() -> None:
    args = json.loads(sys.argv[1])
    out = open(args["out"], "a", buffering=1, encoding="utf-8")

    def emit(**event: object) -> None:
        out.write(json.dumps(event) + "\n")

    class Processor(RecordProcessorBase):
        shard = "?"

        def initialize(self, i):  # type: ignore[no-untyped-def]
            self.shard = i.shard_id
            emit(e="init", shard=i.shard_id, seq=i.sequence_number)

        def process_records(self, p):  # type: ignore[no-untyped-def]
            for record in p.records:
                emit(e="rec", shard=self.shard, data=record.binary_data.decode())
            p.checkpointer.checkpoint()

        def lease_lost(self, _):  # type: ignore[no-untyped-def]
            emit(e="lost", shard=self.shard)

        def shard_ended(self, s):  # type: ignore[no-untyped-def]
            s.checkpointer.checkpoint()

        def shutdown_requested(self, s):  # type: ignore[no-untyped-def]
            s.checkpointer.checkpoint()
            emit(e="shutdown", shard=self.shard)

    scheduler = Scheduler(stream_identifiers=args["ids"], application_name=args["app"],
                          record_processor_factory=Processor, worker_identifier=args["worker"],
                          region="us-east-1", initial_position="TRIM_HORIZON",
                          retrieval_mode="POLLING", idle_time_between_reads_millis=200,
                          shard_sync_interval_millis=5000)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    scheduler.start()
    emit(e="started")
    while not stop.wait(0.2):
        pass
    scheduler.shutdown()
    emit(e="stopped")


if __name__ == "__main__":
    main()
