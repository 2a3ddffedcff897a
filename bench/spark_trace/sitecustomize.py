"""A timeline of every Python process Spark starts for a query, for the benchmarks only.

``bench_sql_backlog.py --trace FILE`` puts this directory first on ``PYTHONPATH`` and sets
``KD_TRACE_FILE``: each Python process (Spark's daemons, their forked workers, the source's
runner) then appends JSON lines to that file: when it started and reached this module,
when its worker's ``main`` ran, how long the heavy imports took, our reader's calls, and
each AWS call. Nothing here is imported by the library; without ``KD_TRACE_FILE`` it does
nothing.
"""
from __future__ import annotations

import functools
import importlib.abc
import os
import sys
import time
from typing import Any

from trace_file import append  # beside this file, on PYTHONPATH with it

_FILE = os.environ.get("KD_TRACE_FILE")
_HEAVY = {"pyspark", "boto3", "botocore", "pyarrow", "kinesis_dstream", "pandas"}
_CALLS = {
    "pyspark.worker": {"": ["main"]},
    "pyspark.sql.worker.lookup_data_sources": {"": ["main"]},
    "pyspark.sql.worker.create_data_source": {"": ["main"]},
    "pyspark.sql.worker.plan_data_source_read": {"": ["main"]},
    "pyspark.sql.datasource_internal": {"": ["_streamReader"]},
    "kinesis_dstream.sql.datasource": {"KinesisDataSource": ["schema", "streamReader"]},
    "kinesis_dstream.sql.reader": {"KinesisStreamReader": [
        "__init__", "getDefaultReadLimit", "initialOffset", "latestOffset", "partitions",
        "reportLatestOffset", "commit"]},
    "kinesis_dstream.sql.partition_reader": {"": ["read_partition"]},
    "kinesis_dstream.sql.driver_state": {"DriverState": [
        "prepare_ranges", "list_shards", "recorded_ranges", "consumer_arn", "kinesis_of",
        "warm_up"]},
    "kinesis_dstream.sql.prober": {"ShardProber": ["probed", "probe_soon", "kinesis"]},
    "botocore.client": {"BaseClient": ["_make_api_call"]},
}


def _started_at() -> float:
    """This process's start (the kernel's), in the epoch's seconds."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:  # btime is whole seconds: uptime is finer
            up = float(f.read().split()[0])
        return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def emit(event: str, **fields: Any) -> None:
    if _FILE:
        append({"t": time.time(), "pid": os.getpid(), "ev": event, **fields})


def _traced(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        begun = time.time()
        what = args[1] if name.endswith("_make_api_call") and len(args) > 1 else None
        try:
            out = fn(*args, **kwargs)
        finally:
            emit("call", name=name, op=what, begun=begun, s=round(time.time() - begun, 4))
        if name.endswith("read_partition"):
            return _traced_iterator(out, begun)
        return out
    return call


def _traced_iterator(rows: Any, begun: float) -> Any:
    n = 0
    for row in rows:
        if n == 0:
            emit("first_row", name="read_partition", s=round(time.time() - begun, 4))
        n += 1
        yield row
    emit("rows_done", name="read_partition", rows=n, s=round(time.time() - begun, 4))


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        begun = time.time()
        self.inner.exec_module(module)
        if self.name in _HEAVY:
            emit("import", name=self.name, begun=begun, s=round(time.time() - begun, 4))
        for owner, names in _CALLS.get(self.name, {}).items():
            target = getattr(module, owner, None) if owner else module
            for attr in names:
                if getattr(target, attr, None) is None:  # renamed: traced no more, not broken
                    emit("untraced", name=f"{self.name}.{owner}.{attr}")
                    continue
                setattr(target, attr, _traced(f"{self.name}.{owner}.{attr}".replace("..", "."),
                                              getattr(target, attr)))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _HEAVY and name not in _CALLS:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, name)
                return spec
        return None


if _FILE:
    sys.meta_path.insert(0, _Finder())
    emit("process", argv=" ".join(sys.argv[:3]) or "-", started=_started_at())
    _fork_parent = os.getpid()
    os.register_at_fork(after_in_child=lambda: emit("forked", parent=_fork_parent))
