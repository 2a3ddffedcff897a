"""Runs amazon-kclpy's own sample record processor, unmodified, and records what it saw.

The sample (samples/sample_kclpy_app.py in the amazon_kclpy wheel) only writes its records
to stderr without newlines; to check deliveries, this driver wraps the sample instance's
process_records: after the sample has processed a batch, each record is appended to the
JSON-lines file named by KCLPY_RECORD_LOG. The sample's class and code are not changed.

KCLPY_CRASH_MARKER (optional): the first child to see a batch creates this file and exits
at once, before the sample processes the batch (a child dying mid-batch); later children
run normally. KCLPY_HANG_MARKER: the same, but that child hangs instead of exiting.
KCLPY_CHECKPOINT_FREQ_S (optional): the sample's checkpoint period instead of its 60 s (set on
the instance; the class is not changed).
"""
import json
import os
import time

from amazon_kclpy import kcl

from samples import sample_kclpy_app

processor = sample_kclpy_app.RecordProcessor()
if os.environ.get("KCLPY_CHECKPOINT_FREQ_S"):  # the sample checkpoints every 60 s by default
    processor._CHECKPOINT_FREQ_SECONDS = float(os.environ["KCLPY_CHECKPOINT_FREQ_S"])
shard = {"id": None}
original_initialize = processor.initialize
original_process_records = processor.process_records


def initialize(initialize_input):
    shard["id"] = initialize_input.shard_id
    original_initialize(initialize_input)


def first_to_create(marker):
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def process_records(process_records_input):
    if os.environ.get("KCLPY_CRASH_MARKER") and first_to_create(os.environ["KCLPY_CRASH_MARKER"]):
        os._exit(7)
    if os.environ.get("KCLPY_HANG_MARKER") and first_to_create(os.environ["KCLPY_HANG_MARKER"]):
        time.sleep(3600)
    original_process_records(process_records_input)
    with open(os.environ["KCLPY_RECORD_LOG"], "a") as log:
        for record in process_records_input.records:
            log.write(json.dumps({"shard": shard["id"], "seq": record.sequence_number,
                                  "sub": record.sub_sequence_number,
                                  "data": record.binary_data.decode(), "pid": os.getpid()}) + "\n")


processor.initialize = initialize
processor.process_records = process_records

if __name__ == "__main__":
    kcl.KCLProcess(processor).run()
