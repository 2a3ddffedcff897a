"""Puts random words into a Kinesis stream, like Spark's KinesisWordProducerASL.

Usage: kinesis_word_producer.py <stream-name> <endpoint-url> <recordsPerSec> <wordsPerRecord>
         [--region R] [--aggregate [--per-aggregate N]] [--total N | --seconds S]

Each record is wordsPerRecord words from Spark's list ("spark", "you", "are", "my",
"father") separated by spaces. --aggregate packs records KPL-style (aws_kinesis_agg), so
consumers see sub-sequence numbers. At the end it prints how many of each word it put:
the totals a word count must reach. Without --total/--seconds it runs until Ctrl-C.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter

import boto3
import botocore.config

WORDS = ["spark", "you", "are", "my", "father"]


def region_from_endpoint(endpoint: str) -> str | None:
    match = re.search(r"kinesis[.-]([a-z0-9-]+)\.amazonaws\.com", endpoint)
    return match.group(1) if match else None


def make_entries(records: list[tuple[str, bytes]], aggregate: bool, per_aggregate: int) -> list[dict]:
    if not aggregate:
        return [{"PartitionKey": pk, "Data": data} for pk, data in records]
    from aws_kinesis_agg.aggregator import RecordAggregator

    entries = []
    for start in range(0, len(records), per_aggregate):
        aggregator = RecordAggregator()
        for pk, data in records[start:start + per_aggregate]:
            full = aggregator.add_user_record(pk, data)
            if full is not None:
                entries.append(full.get_contents())
        last = aggregator.clear_and_get()
        if last is not None and last.get_num_user_records():
            entries.append(last.get_contents())
    out = []
    for pk, ehk, blob in entries:
        entry = {"PartitionKey": pk, "Data": blob}
        if ehk:
            entry["ExplicitHashKey"] = ehk
        out.append(entry)
    return out


def put_all(kinesis, stream: str, entries: list[dict]) -> None:
    """PutRecords in chunks of 500, retrying the entries Kinesis refused."""
    for start in range(0, len(entries), 500):
        pending = entries[start:start + 500]
        for attempt in range(10):
            reply = kinesis.put_records(StreamName=stream, Records=pending)
            if not reply.get("FailedRecordCount"):
                break
            pending = [e for e, r in zip(pending, reply["Records"]) if "ErrorCode" in r]
            time.sleep(0.1 * 2 ** attempt)
        else:
            raise RuntimeError(f"gave up putting {len(pending)} records")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stream")
    parser.add_argument("endpoint")
    parser.add_argument("records_per_sec", type=int)
    parser.add_argument("words_per_record", type=int)
    parser.add_argument("--region", default=None)
    parser.add_argument("--aggregate", action="store_true", help="KPL-aggregate the records")
    parser.add_argument("--per-aggregate", type=int, default=50)
    parser.add_argument("--total", type=int, default=None, help="stop after this many records")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    args = parser.parse_args(argv)
    if args.records_per_sec < 1 or args.words_per_record < 1:
        parser.error("recordsPerSec and wordsPerRecord must be positive")

    region = (args.region or region_from_endpoint(args.endpoint) or os.environ.get("AWS_REGION")
              or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
    kinesis = boto3.client("kinesis", endpoint_url=args.endpoint, region_name=region,
                           config=botocore.config.Config(retries={"max_attempts": 5}))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    totals: Counter = Counter()
    sent = 0
    started = time.monotonic()
    rng = random.Random()
    while not stop.is_set():
        if args.seconds is not None and time.monotonic() - started >= args.seconds:
            break
        want = args.records_per_sec
        if args.total is not None:
            want = min(want, args.total - sent)
            if want <= 0:
                break
        second_started = time.monotonic()
        records = []
        for _ in range(want):
            words = [rng.choice(WORDS) for _ in range(args.words_per_record)]
            totals.update(words)
            records.append((f"partitionKey-{rng.randrange(1 << 30)}", " ".join(words).encode()))
        put_all(kinesis, args.stream, make_entries(records, args.aggregate, args.per_aggregate))
        sent += want
        print(f"Sent {want} records{' (aggregated)' if args.aggregate else ''}; {sent} in all",
              flush=True)
        stop.wait(max(0.0, 1.0 - (time.monotonic() - second_started)))
    print(f"Totals: {sent} records; " + ", ".join(f"{w}={totals[w]}" for w in WORDS), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
