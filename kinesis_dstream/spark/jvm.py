"""Runs in the driver: the JVM classes and static methods a batch calls, looked up once.

py4j resolves ``sc._jvm.org.apache.spark.streaming.Time`` one name at a time, a round trip
to the JVM each, and a class's static method by one more: a batch's located RDD and its
input report made some 60 such lookups (0.4 ms each, more on a loaded driver) before their
few real calls.
"""
from __future__ import annotations

import threading
from typing import Any

_found: dict[tuple[Any, str], Any] = {}
_lock = threading.Lock()


def jvm(sc: Any, name: str) -> Any:
    """The JVM class or static method ``name`` (``"java.util.ArrayList"``,
    ``"org.apache.spark.api.python.PythonUtils.toSeq"``), looked up once per gateway."""
    key = (sc._gateway._gateway_client, name)
    with _lock:
        found = _found.get(key)
    if found is None:
        found = sc._jvm
        for part in name.split("."):
            found = getattr(found, part)
        with _lock:
            _found[key] = found
    return found
