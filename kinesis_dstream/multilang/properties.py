"""KCL MultiLangDaemon properties files -> ``ConsumerConfig`` plus the multilang settings.

The same file runs under the Java MultiLangDaemon and under ours, so the keys are the
KCL 2.x and 3.x names (``MultiLangDaemonConfiguration`` bean properties, case-sensitive as
in the Java daemon) and values are read the way it reads them. Where the Java daemon silently
ignores a key it does not know, we warn naming it: a typo in ``failoverTimeMilis`` should
not cost a day. Keys that the Java daemon knows but that mean nothing for our engine
(metrics buffering, thread pools, ...) are checked for a well-formed value and then
ignored with a debug line.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from ..config import INITIAL_POSITIONS, METRICS_LEVELS, ConsumerConfig
from ..errors import ConfigurationError

log = logging.getLogger(__name__)

# Java daemon default is "no timeout" (a hung child stalls its shard for ever); a restart
# from the last checkpoint after a minute of silence loses nothing and unblocks the shard.
DEFAULT_ACTION_TIMEOUT_S = 60.0
RETRIEVAL_MODES = ("POLLING", "FANOUT", "DEFAULT")
CLIENT_VERSIONS = ("CLIENT_VERSION_CONFIG_3X", "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X")
BILLING_MODES = ("PAY_PER_REQUEST", "PROVISIONED")
_DEFAULT_PROVIDERS = {"DefaultAWSCredentialsProviderChain", "DefaultCredentialsProvider"}
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0"}


@dataclass(frozen=True)
class MultiLangSettings:
    """What a properties file says: the engine's config plus how to run the child."""

    config: ConsumerConfig
    executable_name: str
    # argv for one child process, resolved when the file was read (see resolve_command).
    command: tuple[str, ...]
    processing_language: str | None = None
    retrieval_mode: str = "POLLING"
    # timeoutInSeconds: longest silence of a child while it handles one action.
    action_timeout_s: float = DEFAULT_ACTION_TIMEOUT_S
    properties_file: Path | None = None
    ignored_keys: tuple[str, ...] = field(default=())


# --------------------------------------------------------------------------- file format

def parse_properties(text: str) -> dict[str, str]:
    """Read java.util.Properties text: ``=``/``:``/space separators, ``#``/``!`` comments,
    backslash continuations and escapes. Values are stripped of trailing whitespace
    (the Java daemon's converters trim them too). The last of duplicated keys wins."""
    result: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while _ends_with_continuation(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip(" \t\f")
            i += 1
        if _ends_with_continuation(line):
            line = line[:-1]
        key, value = _split_key_value(line)
        if key in result:
            log.debug("properties: %s given more than once; the last value wins", key)
        result[key] = value.rstrip()
    return result


def _ends_with_continuation(line: str) -> bool:
    backslashes = len(line) - len(line.rstrip("\\"))
    return backslashes % 2 == 1


def _split_key_value(line: str) -> tuple[str, str]:
    key_chars: list[str] = []
    j = 0
    while j < len(line):
        c = line[j]
        if c == "\\" and j + 1 < len(line):
            key_chars.append(c + line[j + 1])
            j += 2
            continue
        if c in "=: \t\f":
            break
        key_chars.append(c)
        j += 1
    rest = line[j:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return _unescape("".join(key_chars)), _unescape(rest)


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    j = 0
    while j < len(text):
        c = text[j]
        if c != "\\" or j + 1 >= len(text):
            out.append(c)
            j += 1
            continue
        nxt = text[j + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[j + 2:j + 6] or ""):
            out.append(chr(int(text[j + 2:j + 6], 16)))
            j += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        j += 2
    return "".join(out)


# --------------------------------------------------------------------------- value readers

def _text(key: str, value: str) -> str:
    if not value:
        raise ConfigurationError(f"{key}: a value is required, got {value!r}")
    return value


def _int(minimum: int) -> Callable[[str, str], int]:
    def read(key: str, value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise ConfigurationError(f"{key}: not a whole number: {value!r}") from None
        if number < minimum:
            raise ConfigurationError(f"{key}: must be at least {minimum}, got {value!r}")
        return number
    return read


def _any(key: str, value: str) -> str:
    return value


def _number(key: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ConfigurationError(f"{key}: not a number: {value!r}") from None
    if number < 0:
        raise ConfigurationError(f"{key}: must not be negative, got {value!r}")
    return number


def _duration(key: str, value: str) -> str:
    """An ISO-8601 duration as java.time.Duration parses it (PT15M, P2D, PT0.5S)."""
    if not re.fullmatch(r"[-+]?P(?:[-+]?\d+D)?(?:T(?:[-+]?\d+H)?(?:[-+]?\d+M)?(?:[-+]?\d+(?:[.,]\d+)?S)?)?",
                        value, re.IGNORECASE) or value.upper().rstrip("T").endswith("P"):
        raise ConfigurationError(f"{key}: not an ISO-8601 duration (PT15M, P2D): {value!r}")
    return value


def _bool(key: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "yes", "on", "1"):
        return True
    if lowered in ("false", "no", "off", "0"):
        return False
    raise ConfigurationError(f"{key}: not a boolean (true/false): {value!r}")


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def read(key: str, value: str) -> str:
        if value not in choices:
            raise ConfigurationError(f"{key}: must be one of {', '.join(choices)}, got {value!r}")
        return value
    return read


def normalise_endpoint(key: str, value: str) -> str:
    """The Java SDK needs a scheme; users often write ``host:port``. Local hosts get
    ``http://`` (emulators rarely serve TLS), anything else ``https://``."""
    value = _text(key, value)
    if "://" not in value:
        host = value.split("/")[0].rsplit(":", 1)[0] if not value.startswith("[") else \
            value.split("]")[0] + "]"
        scheme = "http" if host.lower() in _LOCAL_HOSTS else "https"
        log.debug("%s: %r has no scheme; using %s://", key, value, scheme)
        value = f"{scheme}://{value}"
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"{key}: not an http(s) endpoint URL: {value!r}")
    try:
        parts.port  # noqa: B018 - raises on a non-numeric port
    except ValueError:
        raise ConfigurationError(f"{key}: bad port in endpoint URL: {value!r}") from None
    return value


def _stream_name_from_arn(key: str, value: str) -> str:
    match = re.fullmatch(r"arn:aws[a-zA-Z-]*:kinesis:[a-z0-9-]+:\d{12}:stream/([A-Za-z0-9_.-]{1,128})",
                         value)
    if not match:
        raise ConfigurationError(
            f"{key}: not a Kinesis stream ARN (arn:aws:kinesis:<region>:<account>:stream/<name>): "
            f"{value!r}")
    return match.group(1)


def _timestamp(key: str, value: str) -> float:
    """Epoch seconds as the Java daemon reads them; ISO-8601 also accepted (ours only)."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigurationError(f"{key}: not a timestamp (epoch seconds): {value!r}") from None
    return parsed.timestamp()


def _credentials_provider(key: str, value: str) -> str:
    names = [part.strip().rsplit(".", 1)[-1] for part in value.split("|") if part.strip()]
    if not names:
        raise ConfigurationError(f"{key}: a credentials provider is required, got {value!r}")
    if not any(name in _DEFAULT_PROVIDERS for name in names):
        log.warning("%s = %s: only DefaultAWSCredentialsProviderChain is implemented; using "
                    "boto3's default chain (environment, profile, container/instance role)",
                    key, value)
    return value


# --------------------------------------------------------------------------- key table

# key -> (reader, target). Target "config:<field>" sets a ConsumerConfig field,
# "settings:<name>" a MultiLangSettings one, "special" is handled in _apply.
_KEYS: dict[str, tuple[Callable[[str, str], Any], str]] = {
    "streamName": (_text, "config:stream_name"),
    "streamArn": (_stream_name_from_arn, "special"),
    "applicationName": (_text, "config:application_name"),
    "tableName": (_text, "special"),
    "executableName": (_text, "settings:executable_name"),
    "processingLanguage": (_text, "settings:processing_language"),
    "regionName": (_text, "config:region_name"),
    "initialPositionInStream": (_choice(INITIAL_POSITIONS), "config:initial_position"),
    "initialPositionInStreamExtended": (_timestamp, "special"),
    "AWSCredentialsProvider": (_credentials_provider, "none"),
    "AWSCredentialsProviderDynamoDB": (_credentials_provider, "none"),
    "AWSCredentialsProviderCloudWatch": (_credentials_provider, "none"),
    "kinesisEndpoint": (normalise_endpoint, "config:kinesis_endpoint"),
    "dynamoDBEndpoint": (normalise_endpoint, "config:dynamodb_endpoint"),
    # Not a Java daemon key (it has no CloudWatch endpoint setting); ours.
    "cloudWatchEndpoint": (normalise_endpoint, "config:cloudwatch_endpoint"),
    "maxRecords": (_int(1), "config:max_records"),
    "idleTimeBetweenReadsInMillis": (_int(0), "config:idle_time_between_reads_ms"),
    "failoverTimeMillis": (_int(1), "config:failover_time_ms"),
    "shardSyncIntervalMillis": (_int(1), "config:shard_sync_interval_ms"),
    "workerId": (_text, "config:worker_id"),
    "workerIdentifier": (_text, "config:worker_id"),
    "callProcessRecordsEvenForEmptyRecordList":
        (_bool, "config:call_process_records_even_for_empty_record_list"),
    "retrievalMode": (_choice(RETRIEVAL_MODES), "special"),
    "metricsLevel": (_choice(METRICS_LEVELS), "config:metrics_level"),
    "metricsBufferTimeMillis": (_int(1), "config:metrics_buffer_time_ms"),
    "shutdownGraceMillis": (_int(0), "config:shutdown_grace_ms"),
    "maxLeasesForWorker": (_int(1), "config:max_leases_for_worker"),
    "maxLeasesToStealAtOneTime": (_int(1), "config:max_leases_to_steal_at_one_time"),
    "parentShardPollIntervalMillis": (_int(0), "config:parent_shard_poll_interval_ms"),
    "timeoutInSeconds": (_int(1), "settings:action_timeout_s"),
    # KCL 3.x: how often its leader assigns leases; here, how often this worker looks for
    # leases to take (by default we look every renew period, failover / 3).
    "leaseAssignmentIntervalMillis": (_int(1), "config:lease_taker_interval_ms"),
    # Known to the Java daemon, no effect here: value checked, then ignored.
    "maxActiveThreads": (_int(-2**31), "ignore"),
    "metricsMaxQueueSize": (_int(0), "ignore"),
    "metricsEnabledDimensions": (_any, "ignore"),
    "validateSequenceNumberBeforeCheckpointing": (_bool, "ignore"),
    "taskBackoffTimeMillis": (_int(0), "ignore"),
    "cleanupLeasesUponShardCompletion": (_bool, "ignore"),
    "ignoreUnexpectedChildShards": (_bool, "ignore"),
    "initialLeaseTableReadCapacity": (_int(0), "ignore"),
    "initialLeaseTableWriteCapacity": (_int(0), "ignore"),
    "maxLeaseRenewalThreads": (_int(1), "ignore"),
    "listShardsBackoffTimeInMillis": (_int(0), "ignore"),
    "maxListShardsRetryAttempts": (_int(0), "ignore"),
    "logWarningForTaskAfterMillis": (_int(0), "ignore"),
    "maxGetRecordsThreadPool": (_int(0), "ignore"),
    "retryGetRecordsInSeconds": (_int(0), "ignore"),
    "schedulerInitializationBackoffTimeMillis": (_int(0), "ignore"),
    "shardPrioritization": (_any, "ignore"),
    "skipShardSyncAtWorkerInitializationIfLeasesExist": (_bool, "ignore"),
    "consumerArn": (_any, "ignore"),
    "consumerName": (_any, "ignore"),
    "maxDescribeStreamConsumerRetries": (_int(0), "ignore"),
    "maxDescribeStreamSummaryRetries": (_int(0), "ignore"),
    "registerStreamConsumerRetries": (_int(0), "ignore"),
    "retryBackoffMillis": (_int(0), "ignore"),
    # KCL 3.x (MultiLangDaemonConfiguration of 3.1.3). This engine speaks the 2.x lease
    # protocol, has no leader, no worker metrics and no extra tables; a 3.x file is accepted
    # as it is, these keys checked and then left to the Java daemon.
    "clientVersionConfig": (_choice(CLIENT_VERSIONS), "ignore"),
    "enablePriorityLeaseAssignment": (_bool, "ignore"),
    "leaseTableDeletionProtectionEnabled": (_bool, "ignore"),
    "leaseTablePitrEnabled": (_bool, "ignore"),
    "millisBehindLatestThresholdForReducedTps": (_int(0), "ignore"),
    "gracefulLeaseHandoffTimeoutMillis": (_int(0), "ignore"),
    "isGracefulLeaseHandoffEnabled": (_bool, "ignore"),
    **{f"{table}{name}": reader for table in ("coordinatorState", "workerMetrics")
       for name, reader in (("TableName", (_text, "ignore")),
                            ("BillingMode", (_choice(BILLING_MODES), "ignore")),
                            ("ReadCapacity", (_int(0), "ignore")),
                            ("WriteCapacity", (_int(0), "ignore")),
                            ("PointInTimeRecoveryEnabled", (_bool, "ignore")),
                            ("DeletionProtectionEnabled", (_bool, "ignore")),
                            ("Tags", (_any, "ignore")))},
    "inMemoryWorkerMetricsCaptureFrequencyMillis": (_int(0), "ignore"),
    "workerMetricsReporterFreqInMillis": (_int(0), "ignore"),
    "noOfPersistedMetricsPerWorkerMetrics": (_int(0), "ignore"),
    "disableWorkerMetrics": (_bool, "ignore"),
    "maxThroughputPerHostKBps": (_number, "ignore"),
    "dampeningPercentage": (_int(0), "ignore"),
    "reBalanceThresholdPercentage": (_int(0), "ignore"),
    "allowThroughputOvershoot": (_bool, "ignore"),
    "varianceBalancingFrequency": (_int(0), "ignore"),
    "workerMetricsEMAAlpha": (_number, "ignore"),
    "staleWorkerMetricsEntryCleanupDuration": (_duration, "ignore"),
}
KNOWN_KEYS = frozenset(_KEYS)
_CREDENTIALS_PREFIX = "AWSCredentialsProvider"


def canonical_key(key: str) -> str:
    """KCL 3.x reads the credentials keys in any case (kclpy 3's sample writes
    ``AwsCredentialsProvider``); the rest of the name stays case-sensitive, as there."""
    if key.lower().startswith(_CREDENTIALS_PREFIX.lower()):
        return _CREDENTIALS_PREFIX + key[len(_CREDENTIALS_PREFIX):]
    return key


def _apply(props: Mapping[str, str], source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read every key; returns (ConsumerConfig changes, MultiLangSettings changes)."""
    config: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    ignored: list[str] = []
    arn_stream: str | None = None
    table_name: str | None = None
    for written, raw in props.items():
        key = canonical_key(written)
        if key not in _KEYS:
            near = [k for k in _KEYS if k.lower() == key.lower()]
            hint = f" (did you mean {near[0]}?)" if near else ""
            log.warning("%s: unknown property %r ignored%s", source, written, hint)
            continue
        reader, target = _KEYS[key]
        value = reader(written, raw)
        if target.startswith("config:"):
            config[target[7:]] = value
        elif target.startswith("settings:"):
            settings[target[9:]] = value
        elif target == "ignore":
            log.debug("%s: %s has no effect on this engine; ignored", source, key)
            ignored.append(key)
        elif key == "streamArn":
            arn_stream = value
        elif key == "tableName":
            table_name = value
        elif key == "initialPositionInStreamExtended":
            config["initial_position_timestamp"] = value
            config["initial_position"] = "AT_TIMESTAMP"
        elif key == "retrievalMode":
            if value != "POLLING":
                log.warning("%s: retrievalMode = %s (enhanced fan-out) is not implemented; "
                            "polling with GetRecords instead", source, value)
            settings["retrieval_mode"] = value
    if arn_stream is not None:
        # As the Java daemon: streamArn takes precedence over streamName.
        if config.get("stream_name") not in (None, arn_stream):
            log.warning("%s: streamArn names stream %r, streamName %r; using the ARN's",
                        source, arn_stream, config["stream_name"])
        config["stream_name"] = arn_stream
    if table_name is not None and table_name != config.get("application_name", table_name):
        raise ConfigurationError(
            f"tableName: {table_name!r} differs from applicationName "
            f"{config.get('application_name')!r}; this engine names the lease table after the "
            "application (as the KCL does by default)")
    settings["ignored_keys"] = tuple(ignored)
    return config, settings


# --------------------------------------------------------------------------- public API

def read_properties_file(path: str | os.PathLike) -> dict[str, str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read properties file {str(path)!r}: {exc}") from exc
    return parse_properties(text)


def _build_config(config_changes: dict[str, Any], overrides: Mapping[str, Any],
                  source: str) -> ConsumerConfig:
    merged = {**config_changes, **overrides}
    for required, key in (("application_name", "applicationName"),
                          ("stream_name", "streamName or streamArn")):
        if not merged.get(required):
            raise ConfigurationError(f"{source}: {key} is required")
    try:
        return ConsumerConfig(**merged)
    except TypeError as exc:  # an unknown override name
        raise ConfigurationError(f"{source}: {exc}") from exc
    except ConfigurationError as exc:
        # ConsumerConfig's cross-field checks name its fields; name the file's keys too.
        keys = [key for key, (_, target) in _KEYS.items()
                if target.startswith("config:") and str(exc).startswith(target[7:])]
        prefix = f"{keys[0]}: " if keys else ""
        raise ConfigurationError(f"{source}: {prefix}{exc}") from None


def consumer_config_from_properties(path: str | os.PathLike, **overrides: Any) -> ConsumerConfig:
    """The engine config a properties file describes; ``overrides`` (ConsumerConfig field
    names) win over the file. executableName is not needed here (the Spark glue uses the
    file only as a settings source)."""
    source = str(path)
    config_changes, _ = _apply(read_properties_file(path), source)
    return _build_config(config_changes, overrides, source)


def resolve_command(executable_name: str, base_dir: Path | None = None) -> tuple[str, ...]:
    """argv for the child. Split like a shell command (the Java daemon splits on spaces);
    a relative program is looked up next to the properties file, then in the working
    directory, then on PATH; a ``.py`` script, and a ``python``/``python3`` command, run
    with this interpreter so the child sees the same installed amazon_kclpy."""
    try:
        argv = shlex.split(executable_name)
    except ValueError as exc:
        raise ConfigurationError(f"executableName: cannot split {executable_name!r}: {exc}") from None
    if not argv:
        raise ConfigurationError(f"executableName: empty command {executable_name!r}")
    program = argv[0]
    if program in ("python", "python3"):
        # Ours only: the daemon's own interpreter, which has amazon_kclpy installed.
        return (sys.executable, *argv[1:])
    candidates = [Path(program)] if os.path.isabs(program) else \
        [p for p in ((base_dir / program) if base_dir else None, Path.cwd() / program) if p]
    found = next((p for p in candidates if p.is_file()), None)
    if found is not None:
        # Absolute, but symlinks kept: a venv's bin/python is a symlink whose target runs
        # without the venv's packages (the Java daemon runs the path as written too).
        program = os.path.abspath(found)
    elif os.sep in program or program.endswith(".py") or shutil.which(program) is None:
        raise ConfigurationError(
            f"executableName: {argv[0]!r} not found (looked in "
            f"{', '.join(str(p.parent) for p in candidates)} and PATH)")
    if program.endswith(".py"):
        return (sys.executable, program, *argv[1:])
    return (program, *argv[1:])


def load_properties(path: str | os.PathLike, **overrides: Any) -> MultiLangSettings:
    """Everything our MultiLangDaemon needs from a KCL properties file."""
    source = str(path)
    config_changes, settings_changes = _apply(read_properties_file(path), source)
    config = _build_config(config_changes, overrides, source)
    executable = settings_changes.pop("executable_name", None)
    if not executable:
        raise ConfigurationError(
            f"{source}: executableName is required, e.g. executableName = sample_kclpy_app.py")
    base_dir = Path(path).resolve().parent
    return MultiLangSettings(
        config=config,
        executable_name=executable,
        command=resolve_command(executable, base_dir),
        properties_file=Path(path).resolve(),
        **settings_changes,
    )
