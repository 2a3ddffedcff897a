"""KCL MultiLangDaemon properties files -> ``ConsumerConfig`` plus the multilang settings.

The same file runs under the Java MultiLangDaemon and under ours, so the keys are the
KCL 2.x and 3.x names (``MultiLangDaemonConfiguration`` bean properties, case-sensitive as
in the Java daemon), declared as the ``PROPERTIES`` front end of the settings engine, which
reads values by the rules every front end shares. Where the Java daemon silently ignores a
key it does not know, we warn naming it: a typo in ``failoverTimeMilis`` should not cost a
day. Keys that mean nothing for our engine (thread pools, KCL 3.x's worker metrics) are
checked for a well-formed value and then ignored with a debug line.
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..config import (
    ConsumerConfig,
    parse_stream_arn,
)
from ..errors import ConfigurationError
from ..settings import (
    Read,
)
from .java_properties import read_properties_file
from .property_keys import (
    CLIENT_KEYS_REFUSAL,
    CLIENT_PREFIXES,
    DEFAULT_ACTION_TIMEOUT_S,
    KNOWN_KEYS,
    POLLING_KEYS,
    PRIMITIVE_POLLING_KEYS,
    PROPERTIES,
)

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class MultiLangSettings:
    """What a properties file says: the engine's config plus how to run the child."""

    config: ConsumerConfig
    executable_name: str
    # argv for one child process, resolved when the file was read (see resolve_command).
    command: tuple[str, ...]
    processing_language: str | None = None
    retrieval_mode: str = "FANOUT"  # resolved: FANOUT or POLLING
    # timeoutInSeconds: longest silence of a child while it handles one action.
    action_timeout_s: float = DEFAULT_ACTION_TIMEOUT_S
    properties_file: Path | None = None
    ignored_keys: tuple[str, ...] = field(default=())




def _apply(props: Mapping[str, str], source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read every key; returns (ConsumerConfig changes, MultiLangSettings changes)."""
    client_keys = sorted(key for key in props if key.startswith(CLIENT_PREFIXES)
                         and key not in KNOWN_KEYS)
    if client_keys:
        raise ConfigurationError(f"{source}: {', '.join(client_keys)}: {CLIENT_KEYS_REFUSAL} "
                                 "(<client>.endpointOverride is read: an endpoint key)")
    read = PROPERTIES.read(props, source=source)
    config, settings, special = read.of("config"), read.of("settings"), read.of("special")
    ignored = [read.given[name] for name in read.of("ignore")]  # as written
    for key in ignored:
        log.debug("%s: %s has no effect on this engine; ignored", source, key)
    if "initialPositionInStreamExtended" in special:
        config["initial_position_timestamp"] = special["initialPositionInStreamExtended"]
        config["initial_position"] = "AT_TIMESTAMP"
    settings["retrieval_mode"] = retrieval_mode(special.get("retrievalMode", "DEFAULT"), read,
                                                source)
    for key in ("consumerArn", "consumerName"):
        if key in read.given:
            log.warning("%s: %s is read as fanoutConfig.%s, by the Java daemon and here; "
                        "ignored", source, key, key)
    stream_arn = special.get("streamArn")
    if stream_arn is not None:
        arn_stream = parse_stream_arn(stream_arn)
        assert arn_stream is not None  # the key's type checked it
        # As the Java daemon: streamArn takes precedence over streamName.
        if config.get("stream_name") not in (None, arn_stream.stream_name):
            log.warning("%s: streamArn names stream %r, streamName %r; using the ARN's",
                        source, arn_stream.stream_name, config["stream_name"])
        config["stream_name"] = arn_stream.stream_name
        if config.get("region_name", arn_stream.region) == arn_stream.region:
            config["stream_arn"] = stream_arn
        else:
            # The Java daemon keeps only the ARN's name and reads it in regionName; amazon-
            # kclpy's own sample.properties has an ARN of a made-up region beside regionName.
            log.warning("%s: streamArn is in %s, regionName %s: reading stream %r in %s by "
                        "name, as the Java daemon does", source, arn_stream.region,
                        config["region_name"], arn_stream.stream_name, config["region_name"])
    kinesis_credentials = special.get("AWSCredentialsProvider")
    if kinesis_credentials is not None:
        config.update({name: value for name, value in kinesis_credentials.items()
                       if value is not None})
    for service in ("DynamoDB", "CloudWatch"):
        if f"AWSCredentialsProvider{service}" in special:
            config[f"{service.lower()}_credentials"] = special[f"AWSCredentialsProvider{service}"]
    # The KCL's default; ConsumerConfig's is false, for the front ends without this key.
    config.setdefault("cleanup_leases_upon_shard_completion", True)
    settings["ignored_keys"] = tuple(ignored)
    return config, settings


def retrieval_mode(mode: str, read: Read, source: str) -> str:
    """FANOUT or POLLING, by the KCL's rule for DEFAULT: polling once a polling key is set."""
    if mode != "DEFAULT":
        return mode
    values = {**read.of("config"), **read.of("ignore")}
    polling = [key for key in POLLING_KEYS if key in read.given
               and (key not in PRIMITIVE_POLLING_KEYS
                    or values.get(PROPERTIES.by_key[key].field) != 0)]
    if not polling:
        return "FANOUT"
    log.warning("%s: %s set, so retrievalMode DEFAULT reads by polling (GetRecords), as the "
                "KCL's; set retrievalMode = FANOUT for enhanced fan-out, or POLLING to say so",
                source, ", ".join(polling))
    return "POLLING"


# --------------------------------------------------------------------------- public API

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
        keys = [option.name for option in PROPERTIES.options
                if option.target == "config" and str(exc).startswith(option.field)]
        prefix = f"{keys[0]}: " if keys else ""
        raise ConfigurationError(f"{source}: {prefix}{exc}") from None


def consumer_config_from_properties(path: str | os.PathLike, **overrides: Any) -> ConsumerConfig:
    """The engine config a properties file describes; ``overrides`` (ConsumerConfig field
    names) win over the file. executableName is not needed here (the Spark glue uses the
    file only as a settings source, and reads by polling: an explicit FANOUT is warned)."""
    source = str(path)
    props = read_properties_file(path)
    config_changes, _ = _apply(props, source)
    if str(props.get("retrievalMode", "")).strip().upper() == "FANOUT":
        log.warning("%s: retrievalMode = FANOUT: createStream reads by polling (GetRecords); "
                    "enhanced fan-out is the worker's and the multilang daemon's", source)
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
    config = _build_config({**config_changes,
                            "retrieval_mode": settings_changes.get("retrieval_mode", "FANOUT")},
                           overrides, source)
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
