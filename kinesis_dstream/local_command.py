"""``kinesis-dstream local``: emulators in the foreground, and the shell lines that reach them.

It starts one Kinesis and one DynamoDB emulator (``kinesis_dstream.local``), prints ``export``
lines for a shell, and stays in the foreground until SIGINT or SIGTERM. With kinesis-local the
printed Kinesis endpoint is the fan-out front (``kinesis_dstream.fanout_front``), so boto3's
``subscribe_to_shard`` works too; ``--no-fanout`` prints the emulator's own endpoint.
"""
from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading
from typing import Sequence

from .local import DYNAMODB_KINDS, KINESIS_KINDS, EmulatorError, LocalStack

log = logging.getLogger(__name__)


def export_lines(environment: dict[str, str]) -> list[str]:
    return [f"export {name}={shlex.quote(value)}" for name, value in environment.items()]


def main(argv: Sequence[str] | None = None) -> int:
    """``kinesis-dstream local``: emulators in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="kinesis-dstream local",
        description="Start local Kinesis and DynamoDB emulators on 127.0.0.1 and print the "
                    "shell lines that point boto3 and the Java SDK at them.",
    )
    parser.add_argument("--kinesis", choices=KINESIS_KINDS, default="kinesis-local")
    parser.add_argument("--dynamodb", choices=DYNAMODB_KINDS, default="moto")
    parser.add_argument("--start-timeout", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--no-fanout", action="store_true",
                        help="print kinesis-local's own endpoint, without the fan-out front "
                             "that serves SubscribeToShard to boto3")
    parser.add_argument("--fanout-lifetime", type=float, default=300.0, metavar="SECONDS",
                        help="how long a SubscribeToShard subscription lasts (Kinesis: 300)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.fanout_lifetime <= 0:
        parser.error("--fanout-lifetime must be positive")

    stop_requested = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; stopping emulators", signal.Signals(signum).name)
        stop_requested.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    fanout = args.kinesis == "kinesis-local" and not args.no_fanout
    stack = LocalStack(args.kinesis, args.dynamodb, fanout=fanout,
                       fanout_lifetime_s=args.fanout_lifetime)
    try:
        try:
            stack.start(args.start_timeout)
        except EmulatorError as exc:
            log.error("%s", exc)
            return 1
        if stop_requested.is_set():
            return 0
        sys.stdout.write("\n".join(export_lines(stack.environment())) + "\n")
        sys.stdout.flush()
        log.info("Kinesis (%s%s) at %s, DynamoDB (%s) at %s; Ctrl-C to stop", args.kinesis,
                 " behind the fan-out front" if fanout else "", stack.kinesis_endpoint,
                 args.dynamodb, stack.dynamodb.endpoint)
        while not stop_requested.wait(1.0):
            for emulator in stack.emulators:
                if emulator.process is not None and emulator.process.poll() is not None:
                    log.error("%s exited unexpectedly with %s", emulator.kind,
                              emulator.process.returncode)
                    return 1
        return 0
    finally:
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
