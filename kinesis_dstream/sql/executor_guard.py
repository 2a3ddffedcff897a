"""The executors' environment check of the SQL formats, made as Spark unpickles our objects.

Spark ships the data source, its stream reader and its writers to the executors' Python
workers pickled. A worker whose interpreter lacks the package (or boto3, protobuf, pyarrow)
would fail there with ``ModuleNotFoundError`` inside Spark's unpickling traceback, which
names neither the interpreter nor the fix. ``register(spark)`` asks the workers before a
query starts (``preflight.check_executors``); a user who only writes
``format("aws-kinesis")`` never calls it. So every object of ours that Spark pickles is
rebuilt through ``rebuild``, a function that cloudpickle ships by value (it is compiled into
a module no worker imports, as the preflight probe is): it finds what the reads and writes
need first and, if one is missing, raises an ``ExecutorEnvironmentError`` naming the worker's
interpreter, what it could not import and how to fix it. It finds them without importing
them (``importlib.util.find_spec``): the driver-side processes that unpickle the source
(its runner, the read's planning) would otherwise import boto3 for nothing, a tenth of a
second each; a module that is there but fails as it is imported fails where it is used.
That error fails the task, and Spark's task retries then the first batch, within seconds.
(A worker without pyarrow fails before: PySpark's own read function, unpickled first, needs
it; measured on pyspark 4.3.)

Only our own classes are rebuilt this way: a subclass defined elsewhere (a test's, a
user's) pickles as Python would, since its module may be one the workers cannot import.
"""
from __future__ import annotations

import sys
from typing import Any

from ..preflight import CONF_PYTHON, PYSPARK_PYTHON, SQL_MODULES

_GUARD_SOURCE = '''
class ExecutorEnvironmentError(RuntimeError):
    """kinesis_dstream.errors.ExecutorEnvironmentError, for a worker that cannot import it."""


def rebuild(modules, what, hint, module, qualname, state):
    import importlib, importlib.util, pickle, sys
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                raise ModuleNotFoundError("No module named %r" % name, name=name)
        except BaseException as exc:
            raise ExecutorEnvironmentError(
                "Spark's Python workers run %s (Python %s), which cannot import %s (%s: %s); "
                "%s run there. %s" % (sys.executable, sys.version.split()[0], name,
                                      type(exc).__name__, exc, what, hint)) from None
    cls = getattr(importlib.import_module(module), qualname)
    obj = cls.__new__(cls)
    obj.__dict__.update(pickle.loads(state))
    return obj
'''
# Where the rebuilt classes live: anything else pickles as Python would.
_OURS = ("kinesis_dstream.", "pyspark_kinesis")
# The SQL workers' interpreter, when set apart from PYSPARK_PYTHON.
SQL_WORKER_PYTHON = "spark.sql.execution.pyspark.python"


def _rebuild_function() -> Any:
    namespace: dict[str, Any] = {"__name__": "kinesis_dstream_executor_guard"}
    exec(compile(_GUARD_SOURCE, "<kinesis_dstream executor guard>", "exec"), namespace)
    return namespace["rebuild"]


_rebuild = _rebuild_function()


def fix_hint() -> str:
    """How to fix it, naming this process's interpreter, which has the package (the source's
    driver-side process, where Spark pickles what it ships)."""
    return (f"Point the executors' Python workers at a Python that has kinesis-dstream with its "
            f"[sql] extra: {PYSPARK_PYTHON} / spark-submit --conf {CONF_PYTHON}=..., or "
            f"{SQL_WORKER_PYTHON} for the SQL workers alone (e.g. {sys.executable}, this "
            "driver's, on one machine); on a cluster install the package on every node or "
            "ship a packed virtualenv (README: \"Running on a cluster\")")


def guarded_reduce(obj: Any, state: dict[str, Any], what: str) -> tuple[Any, ...] | None:
    """``obj``'s pickled form through ``rebuild``, or None for a class defined elsewhere."""
    cls = type(obj)
    if not cls.__module__.startswith(_OURS):
        return None
    from pyspark import cloudpickle

    return (_rebuild, (SQL_MODULES, what, fix_hint(), cls.__module__, cls.__qualname__,
                       cloudpickle.dumps(state)))
