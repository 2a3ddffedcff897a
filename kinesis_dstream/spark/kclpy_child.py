"""The record processor child the Java MultiLangDaemon runs for ``engine="java-kcl"``.

``python -m kinesis_dstream.spark.kclpy_child`` is the daemon's ``executableName``: one
process per shard lease, speaking the multilang protocol through amazon-kclpy's
``KCLProcess``. It forwards records to the driver with the Python engine's forwarder. The
one difference: the multilang protocol accepts a checkpoint only while the child handles
processRecords, shardEnded or shutdownRequested, so the positions the driver confirmed
(batch completed) wait in the ``DriverLink`` and are written during the next callback.
With ``callProcessRecordsEvenForEmptyRecordList`` the daemon calls back every
``idleTimeBetweenReadsInMillis``, so they wait no longer than that.

Stdout is the protocol: it is kept for ``KCLProcess`` and fd 1 is pointed at stderr, so
nothing else (a stray print, a library's warning) can corrupt it. Logs go to stderr,
which the daemon copies into its own log.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from ..errors import CheckpointError
from ..worker.processor import Checkpointer, ShardEndedInput, ShutdownRequestedInput
from .forwarder import DriverLink, ForwardingProcessor

log = logging.getLogger(__name__)

# The daemon's environment carries the child's settings (JSON): address, authkey_file,
# worker_id, drain_timeout_s. The environment, not the command line, which ps shows.
ARGS_ENV = "KINESIS_DSTREAM_KCLPY_CHILD"


class KclpyCheckpointer:
    """amazon-kclpy's checkpointer raising our ``CheckpointError``, which DriverLink handles."""

    def __init__(self, inner: Any):
        self._inner = inner

    def checkpoint(self, sequence_number: str | None = None,
                   sub_sequence_number: int | None = None) -> None:
        from amazon_kclpy.checkpoint_error import CheckpointError as KclpyCheckpointError

        try:
            self._inner.checkpoint(sequence_number, sub_sequence_number)
        except KclpyCheckpointError as exc:
            raise CheckpointError(str(exc.value), "refused by the MultiLangDaemon") from None


class KclpyForwardingProcessor(ForwardingProcessor):
    """The forwarder under amazon-kclpy's v3 interface; checkpoints only inside callbacks."""

    version = 3  # KCLProcess: the v3 interface (initialize, process_records, ...)

    def _checkpointer(self, checkpointer: Checkpointer) -> Checkpointer:
        return KclpyCheckpointer(checkpointer)

    @staticmethod
    def _wire(record: Any) -> tuple:
        # kclpy's approximate_arrival_timestamp is a datetime; the wire carries epoch ms.
        return (record.binary_data, record.partition_key, record.sequence_number,
                record.sub_sequence_number, record.timestamp_millis)

    def process_records(self, process_records_input: Any) -> None:
        super().process_records(process_records_input)
        self.link.apply_deferred(self.shard_id)

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        self._apply_confirmed(shard_ended_input.checkpointer)
        super().shard_ended(shard_ended_input)

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        # What was confirmed is written first, even if the drain below runs out of time.
        self._apply_confirmed(shutdown_requested_input.checkpointer)
        super().shutdown_requested(shutdown_requested_input)

    def _apply_confirmed(self, checkpointer: Checkpointer) -> None:
        self.link.hold_checkpointer(self.shard_id, self._checkpointer(checkpointer))
        self.link.apply_deferred(self.shard_id)


def main() -> None:
    protocol_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")
    try:
        args = json.loads(os.environ[ARGS_ENV])
    except (KeyError, ValueError) as exc:
        log.error("%s is missing or not JSON (%s): this program is started by the Java "
                  "MultiLangDaemon of createStream(engine='java-kcl')", ARGS_ENV, exc)
        sys.exit(2)
    from amazon_kclpy import kcl

    link = DriverLink(tuple(args["address"]), args["authkey_file"], args["worker_id"],
                      defer_checkpoints=True)
    processor = KclpyForwardingProcessor(link, "", float(args["drain_timeout_s"]))
    kcl.KCLProcess(processor, input_file=sys.stdin, output_file=protocol_out,
                   error_file=sys.stderr).run()


if __name__ == "__main__":
    main()
