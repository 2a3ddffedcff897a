"""``kinesis-dstream checkpoint show DIR``: a Structured Streaming checkpoint of our source.

Spark writes ``offsets/N`` when it plans batch N (a version line, a metadata line, then one
line per source: its offset as JSON, or ``-``) and ``commits/N`` once batch N is done. Our
source's offset (format in ``kinesis_dstream.sql.offsets``; read as text here, as that
package needs pyspark) gives, per shard, where batch N's reading starts; where it ended is
in the batch-range table (a query of several streams names its shards ``stream/shardId``).
So a batch planned but not committed names exactly where the
query resumes, and a committed one where its last reading started.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path
from typing import Any

from .connection import EXIT_OK, BadInput, emit_json, emit_table, main_of

EPILOG = "exit codes: 0 done; 2 usage, or DIR is not a Structured Streaming checkpoint"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kinesis-dstream checkpoint", epilog=EPILOG,
                                  description="Read a Structured Streaming checkpoint.")
    # No required=True: amazon-kclpy pulls in the PyPI argparse 1.4, which lacks it.
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    show = commands.add_parser("show", epilog=EPILOG,
                               help="last committed batch, shard positions, a batch in flight")
    show.add_argument("dir", metavar="DIR", help="the query's checkpointLocation (a local path)")
    show.add_argument("--json", action="store_true", help="print JSON for scripts")
    show.set_defaults(handler=show_checkpoint)
    return top


def main(argv: list[str]) -> int:
    return main_of(parser, argv)


def _batches(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def describe_position(position: dict[str, Any]) -> str:
    """One shard's start, in words: ``after SEQ/SUB``, ``at TRIM_HORIZON``, ``ended`` ..."""
    if position.get("ended"):
        text = "ended"
    elif "after" in position:
        text = f"after {position['after']}/{position.get('sub', 0)}"
    elif position.get("at") == "AT_TIMESTAMP" and "ts" in position:
        moment = _dt.datetime.fromtimestamp(float(position["ts"]), tz=_dt.timezone.utc)
        text = f"at AT_TIMESTAMP {moment.isoformat()}"
    else:
        text = f"at {position.get('at', '?')}"
    if position.get("wait"):
        text += f" (waits for {', '.join(position['wait'])})"
    if position.get("quiet"):
        text += " (quiet)"
    return text


def read_offsets(path: Path) -> dict[str, Any]:
    """One offsets/N file: Spark's batch metadata and each source's offset."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or not lines[0].startswith("v"):
        raise BadInput(f"{path} is not a Spark offset log entry (no version line)")
    try:
        metadata = json.loads(lines[1]) if len(lines) > 1 else {}
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: metadata line is not JSON ({exc})") from None
    sources = []
    for index, line in enumerate(lines[2:]):
        entry: dict[str, Any] = {"index": index, "kinesis_dstream": False}
        try:
            offset = json.loads(line) if line.strip() not in ("", "-") else None
        except json.JSONDecodeError:
            offset = None
        shards = None
        if isinstance(offset, dict) and offset.get("v") == 1 and "shards" in offset:
            shards = offset["shards"]
        elif isinstance(offset, dict) and offset.get("v") == 2 and "streams" in offset:
            shards = {f"{stream}/{shard}": position  # a query of several streams
                      for stream, positions in offset["streams"].items()
                      for shard, position in positions.items()}
        if shards is not None and isinstance(offset, dict):
            entry.update(kinesis_dstream=True, query=offset.get("query"),
                         reading=offset.get("batch"), limit=offset.get("limit"),
                         shards={shard: {"position": describe_position(position), "raw": position}
                                 for shard, position in sorted(shards.items())})
        else:
            entry["offset"] = line
        sources.append(entry)
    return {"batch_timestamp_ms": metadata.get("batchTimestampMs"), "sources": sources}


def show_checkpoint(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not (root / "offsets").is_dir():
        raise BadInput(f"{root} is not a Structured Streaming checkpoint: no offsets directory")
    planned, committed = _batches(root / "offsets"), _batches(root / "commits")
    last_committed = committed[-1] if committed else None
    in_flight = [n for n in planned if last_committed is None or n > last_committed]
    shown = ([last_committed] if last_committed is not None and last_committed in planned
             else []) + in_flight
    query_id = None
    if (root / "metadata").is_file():
        query_id = json.loads((root / "metadata").read_text(encoding="utf-8") or "{}").get("id")
    report = {
        "checkpoint": str(root), "spark_query_id": query_id,
        "last_committed_batch": last_committed,
        "planned_not_committed": in_flight,
        "batches": [{"batch": n, "committed": n in committed,
                     **read_offsets(root / "offsets" / str(n))} for n in shown],
    }
    if args.json:
        emit_json(report)
    else:
        _print(report)
    return EXIT_OK


def _print(report: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(f"checkpoint {report['checkpoint']} (Spark query id {report['spark_query_id']})\n")
    last = report["last_committed_batch"]
    out.write(f"last committed batch: {'none' if last is None else last}\n")
    flight = report["planned_not_committed"]
    out.write(f"planned, not committed: {', '.join(map(str, flight)) or 'none'}"
              f"{' (the query resumes by running it again)' if flight else ''}\n")
    for batch in report["batches"]:
        state = "committed" if batch["committed"] else "planned, not committed"
        for source in batch["sources"]:
            out.write(f"\nbatch {batch['batch']} ({state}), source {source['index']}")
            if not source["kinesis_dstream"]:
                out.write(": not a kinesis-dstream offset\n")
                continue
            out.write(f": query {source['query']}, reading {source['reading']}, "
                      f"at most {source['limit']} records a shard\n")
            emit_table(["SHARD", "READING STARTS"],
                       [[shard, entry["position"]] for shard, entry in source["shards"].items()])
