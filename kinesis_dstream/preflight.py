"""Can Spark's Python workers import what our executor code needs? Asked before the first batch.

Every read of ours runs in Spark's Python workers on the executors, and those run the
interpreter Spark was told about (``PYSPARK_PYTHON``, ``spark.pyspark.python`` through
spark-submit), else ``python3`` from PATH: often not the driver's virtualenv. Without this
check such a job fails about ten seconds in with Spark's unpickling traceback and nothing that
names the interpreter. Here, one tiny task asks the workers to import the modules and the
error says which interpreter ran, what it could not import, and how to fix it.

On a local master the driver's own interpreter is the right one for the workers: when
nothing chose one, ``SparkContext.pythonExec`` is pointed at ``sys.executable`` (what
``venv/bin/python job.py`` users expect), before the probe.

The probe function is compiled here into a module Spark's workers do not have to import,
so cloudpickle ships it by value: it runs even where ``kinesis_dstream`` is missing.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from .errors import ExecutorEnvironmentError

log = logging.getLogger(__name__)

# What a DStream read task imports; the SQL source and sink add pyarrow.
DSTREAM_MODULES = ("kinesis_dstream", "boto3", "google.protobuf.message")
SQL_MODULES = DSTREAM_MODULES + ("pyarrow",)
PYSPARK_PYTHON, CONF_PYTHON = "PYSPARK_PYTHON", "spark.pyspark.python"
PROBE_TIMEOUT_S = 120.0

_PROBE_SOURCE = '''
def probe(_partition):
    import importlib, sys
    missing = {}
    for name in MODULES:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            missing[name] = "%s: %s" % (type(exc).__name__, exc)
    yield {"python": sys.executable, "version": sys.version.split()[0], "missing": missing}
'''

_checked: set[tuple[int, str, tuple[str, ...]]] = set()
_lock = threading.Lock()


def _probe_function(modules: tuple[str, ...]) -> Any:
    namespace: dict[str, Any] = {"__name__": "kinesis_dstream_preflight_probe",
                                 "MODULES": modules}
    exec(compile(_PROBE_SOURCE, "<kinesis_dstream preflight probe>", "exec"), namespace)
    return namespace["probe"]


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith(("local[", "local-cluster["))


def chosen_python(sc: Any) -> str | None:
    """Where the workers' interpreter was chosen (for messages), None when nobody chose."""
    if os.environ.get(PYSPARK_PYTHON):
        return f"{PYSPARK_PYTHON}={os.environ[PYSPARK_PYTHON]}"
    conf = sc.getConf().get(CONF_PYTHON)
    if conf:
        return f"{CONF_PYTHON}={conf}"
    return None


def use_driver_python_on_local_master(sc: Any) -> None:
    """On a local master with no interpreter chosen, the workers run this driver's Python."""
    if is_local_master(sc.master) and chosen_python(sc) is None \
            and sc.pythonExec != sys.executable:
        log.info("local master %s and neither %s nor %s set: Spark's Python workers run "
                 "this driver's interpreter %s (not %r from PATH)", sc.master, PYSPARK_PYTHON,
                 CONF_PYTHON, sys.executable, sc.pythonExec)
        sc.pythonExec = sys.executable


def fix_hint() -> str:
    return (f"Set {PYSPARK_PYTHON} (or spark-submit --conf {CONF_PYTHON}=...) to a Python that "
            "has kinesis-dstream installed (pip install 'kinesis-dstream[spark]', with "
            f"'[sql]' for format(\"aws-kinesis\")), e.g. {PYSPARK_PYTHON}={sys.executable} "
            "for this driver's own interpreter on one machine; on a cluster install the "
            "package on every node or ship a packed virtualenv (README: \"Running on a "
            "cluster\")")


# How a probe runs: given the probe function (partition -> reports), the reports of its tasks.
ProbeJob = Callable[[Callable[[Any], Iterator[dict[str, Any]]]], list[dict[str, Any]]]


@contextmanager
def python_exec(sc: Any, python: str) -> Iterator[None]:
    """``sc.pythonExec`` set to ``python`` meanwhile: the interpreter a Python function (an
    RDD's, a data source's) wrapped meanwhile runs in."""
    previous = sc.pythonExec
    sc.pythonExec = python
    try:
        yield
    finally:
        sc.pythonExec = previous


def rdd_probe_job(sc: Any, python: str) -> ProbeJob:
    """The probe as one RDD task in ``python``: the workers DStream reads run in."""
    def run(probe: Callable[[Any], Iterator[dict[str, Any]]]) -> list[dict[str, Any]]:
        with python_exec(sc, python):
            rdd = sc.parallelize([0], 1).mapPartitions(probe)
            rdd._jrdd  # noqa: B018 - the Python function is wrapped (with its interpreter) here
        return list(rdd.collect())
    return run


def check_executors(sc: Any, modules: Iterable[str] = DSTREAM_MODULES, *,
                    purpose: str = "the Kinesis reads", python: str | None = None,
                    timeout_s: float = PROBE_TIMEOUT_S, job: ProbeJob | None = None) -> None:
    """Raise ExecutorEnvironmentError unless a Python worker imports every module.

    ``python`` overrides the interpreter for the probe (the SQL side's); ``job`` runs the
    probe where the reads will run (an RDD task by default; the SQL formats' runs it as a
    Python data source read, which also leaves those workers started). Once per context,
    interpreter and module list. A probe that gets no executor within ``timeout_s`` is
    cancelled with a warning: a busy cluster is no reason to refuse to start.
    """
    modules = tuple(modules)
    python = python or sc.pythonExec
    key = (id(sc._jsc), python, modules)
    with _lock:
        if key in _checked:
            return
    outcome: dict[str, Any] = {}
    group = f"kinesis-dstream-preflight-{id(outcome)}"
    run_probe = job or rdd_probe_job(sc, python)

    def run() -> None:
        try:
            sc.setJobGroup(group, f"kinesis-dstream: can executors import {', '.join(modules)}?")
            outcome["result"] = run_probe(_probe_function(modules))
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="kinesis-dstream-preflight", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        sc.cancelJobGroup(group)
        log.warning("no executor ran the %s probe within %.0f s; not checked whether Spark's "
                    "Python workers (%s) can import %s", purpose, timeout_s, python,
                    ", ".join(modules))
        return
    where = chosen_python(sc) or f"neither {PYSPARK_PYTHON} nor {CONF_PYTHON} is set"
    if "error" in outcome:
        detail = _first_line_of_interest(str(outcome["error"]))
        raise ExecutorEnvironmentError(
            f"Spark's Python workers could not run {python!r} ({where}), the interpreter "
            f"{purpose} run in on the executors: {detail}. {fix_hint()}") from outcome["error"]
    for report in outcome["result"]:
        if report["missing"]:
            name, error = next(iter(report["missing"].items()))
            raise ExecutorEnvironmentError(
                f"Spark's Python workers run {report['python']} (Python {report['version']}; "
                f"{python!r}, {where}), which cannot import {name} ({error}); {purpose} run "
                f"there. {fix_hint()}")
    with _lock:
        _checked.add(key)


def _first_line_of_interest(text: str) -> str:
    """The line of a Java/Python error worth quoting, rather than its whole stack."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for marker in ("Cannot run program", "Error:", "Exception:"):
        for line in lines:
            if marker in line and not line.startswith("at "):
                return line[line.index(marker) if marker[0] == "C" else 0:][:500]
    return (lines[0] if lines else text)[:500]


def check_local_imports(modules: Iterable[str], role: str) -> None:
    """Raise ExecutorEnvironmentError unless this interpreter imports every module.

    For the SQL data source's own Python processes: Spark starts them with the interpreter
    its executors use for the reads and writes too, unless spark.sql.execution.pyspark.python
    says otherwise. Each module is found, not imported (``find_spec``; a dotted name imports
    its parents): most of those processes never use boto3, whose import costs a tenth of
    a second in each. A module that is there but fails as it is imported fails where it is
    first used, with its own error.
    """
    for name in modules:
        try:
            find_module(name)
        except ImportError as exc:
            raise ExecutorEnvironmentError(
                f"{role} runs {sys.executable} (Python {sys.version.split()[0]}), which cannot "
                f"import {name} ({exc}). Install it there (pip install 'kinesis-dstream[sql]' "
                f"brings pyarrow), or point {PYSPARK_PYTHON} / "
                "spark.sql.execution.pyspark.python at a Python that has it") from exc


def find_module(name: str) -> None:
    """Raise ModuleNotFoundError, as ``import name`` would, unless the module is there to
    import; imports nothing but its parent packages."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
