"""Layers point one way: Spark glue / multilang -> worker -> retrieval -> AWS -> shared modules.

``layer_violations(package_root)`` reads every module's imports (ast, nothing imported) and
returns one line per forbidden import; the tests run it on the package and on modules
written into tmp_path, so the checker itself is shown to catch what it is meant to.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "kinesis_dstream"

SHARED = {"config", "errors", "retry", "records", "position_text", "settings", "spark_conf",
          "worker_id"}
TOP = {"spark", "sql"}            # the Spark glue: may import anything below it
EVERYTHING = (SHARED | {"aws", "retrieval", "worker", "multilang", "local", "local_command",
                        "fanout_front", "preflight", "operations"} | TOP | {"cli", "pyspark"})
# part of the package -> what it may import at module level (parts of kinesis_dstream, or
# "pyspark"). Lazy imports (inside a function) are held to the same rule except in
# __init__, whose lazy imports of the Spark names are its way of not importing pyspark.
ALLOWED: dict[str, set[str]] = {
    **{name: set(SHARED) for name in SHARED},
    "aws": SHARED | {"aws"},
    # How a shard is read, for every entry point (and in Spark tasks of both APIs): no
    # pyspark, no Spark glue, nothing of the worker or the daemon that read through it.
    "retrieval": SHARED | {"aws", "retrieval"},
    "worker": SHARED | {"aws", "retrieval", "worker"},
    "multilang": SHARED | {"aws", "retrieval", "worker", "multilang"},
    # The local emulators, the fan-out endpoint in front of kinesis-local, and the command
    # that serves both: development tools, beside the library, importing none of it.
    "fanout_front": set(SHARED),
    "local": SHARED | {"fanout_front"},
    "local_command": SHARED | {"local"},
    # The operator's command line: the lease table and Kinesis clients, no pyspark (and no
    # sql/, whose offset format it reads as text), so it runs wherever the package does.
    "operations": SHARED | {"aws", "operations"},
    # Driver-side Spark glue both APIs use (it is handed a SparkContext; imports no pyspark).
    "preflight": set(SHARED),
    # The DStream glue must not need the sql package (pyspark >= 4.0): DStream users on 3.5.
    # The two Spark APIs share the retrieval package, not each other's modules.
    "spark": EVERYTHING - {"cli", "sql", "operations"},
    "sql": EVERYTHING - {"cli", "spark", "operations"},
    "cli": EVERYTHING,
    "__main__": {"cli"},
    "__init__": set(SHARED),
}
LAZY_ALLOWED = {"__init__": SHARED | {"spark"}}


def _part_of(module: Path, root: Path) -> str:
    """The top-level part a module belongs to: a subpackage or a top-level module's name."""
    relative = module.relative_to(root)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _imports(module: Path, root: Path) -> list[tuple[str, bool, int]]:
    """(imported part, lazily?, line) for each kinesis_dstream part or pyspark imported."""
    tree = ast.parse(module.read_text(), filename=str(module))
    package = (root.name, *module.relative_to(root).with_suffix("").parts[:-1])
    found: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.extend(_classify(alias.name.split("."), root.name, inner, child.lineno))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = list(package[: len(package) - child.level + 1])
                    target = base + (child.module.split(".") if child.module else [])
                    if len(target) == 1:   # from . import x, y: each name is a part
                        for alias in child.names:
                            found.append((alias.name, inner, child.lineno))
                        continue
                else:
                    target = (child.module or "").split(".")
                found.extend(_classify(target, root.name, inner, child.lineno))
            visit(child, inner)

    visit(tree, False)
    return found


def _classify(dotted: list[str], package_name: str, lazy: bool,
              line: int) -> list[tuple[str, bool, int]]:
    if dotted[0] == "pyspark":
        return [("pyspark", lazy, line)]
    if dotted[0] == package_name and len(dotted) > 1:
        return [(dotted[1], lazy, line)]
    return []


def layer_violations(root: Path) -> list[str]:
    """Every import in the package at ``root`` that breaks the layering, as readable lines."""
    problems = []
    for module in sorted(root.rglob("*.py")):
        part = _part_of(module, root)
        allowed = ALLOWED.get(part, set(SHARED))
        for imported, lazy, line in _imports(module, root):
            if imported == part and part not in ("__init__", "cli", "__main__"):
                continue  # within its own package
            ok = allowed | (LAZY_ALLOWED.get(part, set()) if lazy else set())
            if imported not in ok:
                how = "lazily " if lazy else ""
                problems.append(f"{module.relative_to(root)}:{line} ({part}) {how}imports "
                                f"{imported}")
    return problems


def test_the_package_keeps_its_layers():
    assert layer_violations(PACKAGE) == []


def test_both_spark_apis_read_through_the_retrieval_package():
    """spark/ and sql/ share the retrieval model and reader (and not each other's modules,
    which the table forbids): each imports it."""
    for part in TOP:
        imported = {name for module in (PACKAGE / part).rglob("*.py")
                    for name, _, _ in _imports(module, PACKAGE)}
        assert "retrieval" in imported, part
        assert not imported & (TOP - {part}), part


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "kinesis_dstream"
    for name, text in {"__init__.py": "", "config.py": "", "errors.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for directory in {p.parent for p in root.rglob("*.py")}:
        (directory / "__init__.py").touch()
    return root


@pytest.mark.parametrize("files, expected", [
    ({"worker/bad.py": "import pyspark\n"}, "worker/bad.py:1 (worker) imports pyspark"),
    ({"worker/bad.py": "from ..multilang import daemon\n"},
     "worker/bad.py:1 (worker) imports multilang"),
    ({"aws/bad.py": "from kinesis_dstream.worker.scheduler import Scheduler\n"},
     "aws/bad.py:1 (aws) imports worker"),
    ({"config.py": "from .aws import clients\n"}, "config.py:1 (config) imports aws"),
    ({"retry.py": "def f():\n    from .worker import x\n"},
     "retry.py:2 (retry) lazily imports worker"),
    ({"multilang/bad.py": "from ..spark import receiver\n"},
     "multilang/bad.py:1 (multilang) imports spark"),
    ({"multilang/bad.py": "from pyspark.streaming import StreamingContext\n"},
     "multilang/bad.py:1 (multilang) imports pyspark"),
    ({"worker/bad.py": "def f():\n    import kinesis_dstream.sql.source\n"},
     "worker/bad.py:2 (worker) lazily imports sql"),
    ({"__init__.py": "from .spark import kinesis_utils\n"},
     "__init__.py:1 (__init__) imports spark"),
    ({"spark/bad.py": "from ..sql import source\n"}, "spark/bad.py:1 (spark) imports sql"),
    ({"__init__.py": "def f():\n    from .sql import source\n"},
     "__init__.py:2 (__init__) lazily imports sql"),
    ({"local.py": "from . import worker\n"}, "local.py:1 (local) imports worker"),
    ({"fanout_front/bad.py": "from ..aws import kinesis\n"},
     "fanout_front/bad.py:1 (fanout_front) imports aws"),
    ({"sql/bad.py": "from ..spark.planner import BatchPlanner\n"}, "sql/bad.py:1 (sql) imports spark"),
    ({"retrieval/bad.py": "import pyspark\n"}, "retrieval/bad.py:1 (retrieval) imports pyspark"),
    ({"retrieval/bad.py": "def f():\n    from pyspark import SparkContext\n"},
     "retrieval/bad.py:2 (retrieval) lazily imports pyspark"),
    ({"retrieval/bad.py": "from ..spark import planner\n"},
     "retrieval/bad.py:1 (retrieval) imports spark"),
    ({"retrieval/bad.py": "from kinesis_dstream.sql.source import KinesisSource\n"},
     "retrieval/bad.py:1 (retrieval) imports sql"),
    ({"retrieval/bad.py": "from ..multilang import daemon\n"},
     "retrieval/bad.py:1 (retrieval) imports multilang"),
    ({"retrieval/bad.py": "from ..worker.consumer import ShardConsumer\n"},
     "retrieval/bad.py:1 (retrieval) imports worker"),
    ({"operations/bad.py": "from ..sql.source import KinesisSource\n"},
     "operations/bad.py:1 (operations) imports sql"),
    ({"operations/bad.py": "def f():\n    import pyspark\n"},
     "operations/bad.py:2 (operations) lazily imports pyspark"),
    ({"operations/bad.py": "from ..worker.lease_taker import LeaseTaker\n"},
     "operations/bad.py:1 (operations) imports worker"),
])
def test_the_checker_flags_a_forbidden_import(tmp_path, files, expected):
    assert expected in layer_violations(_package(tmp_path, files))


def test_the_checker_accepts_what_the_layers_allow(tmp_path):
    root = _package(tmp_path, {
        "worker/ok.py": "from ..aws import clients\nfrom ..config import ConsumerConfig\n"
                        "from . import scheduler\n",
        "multilang/ok.py": "from ..worker.scheduler import Scheduler\n",
        "spark/ok.py": "import pyspark\nfrom ..worker import scheduler\nfrom ..multilang import y\n",
        "sql/ok.py": "from pyspark.sql.datasource import DataSource\nfrom ..retrieval import y\n",
        "spark/reads.py": "from ..retrieval.shard_groups import read_shards\n",
        "worker/reads.py": "from ..retrieval.pacer import Pacer\n",
        "retrieval/ok.py": "from ..aws.kinesis import KinesisClient\nfrom . import model\n",
        "__init__.py": "from .config import ConsumerConfig\n"
                      "def __getattr__(name):\n    from .spark import kinesis_utils\n",
        "cli.py": "from .spark import z\n",
        "operations/ok.py": "from ..aws.lease_table import LeaseTable\nfrom . import connection\n",
    })
    assert layer_violations(root) == []
