"""Layers point one way: Spark glue / multilang -> worker -> AWS -> shared modules."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "kinesis_dstream"
SHARED = {"config", "errors", "retry", "records"}
# layer -> the top-level parts of kinesis_dstream it may import
ALLOWED = {
    "aws": SHARED | {"aws"},
    "worker": SHARED | {"aws", "worker"},
    # Spark SQL glue: the producer and pyspark (>= 4.0), never the DStream glue or the worker.
    "sql": SHARED | {"aws", "sql", "pyspark"},
}


def _imports(path: Path) -> set[str]:
    """Top-level kinesis_dstream parts imported by a module (relative or absolute)."""
    tree = ast.parse(path.read_text())
    parts = set()
    package_parts = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package_parts[: len(package_parts) - node.level + 1])
                target = base + (node.module.split(".") if node.module else [])
                if len(target) > 1:
                    parts.add(target[1])
                else:
                    parts.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("kinesis_dstream."):
                parts.add(node.module.split(".")[1])
            elif node.module == "pyspark" or (node.module or "").startswith("pyspark."):
                parts.add("pyspark")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "pyspark":
                    parts.add("pyspark")
                elif alias.name.startswith("kinesis_dstream."):
                    parts.add(alias.name.split(".")[1])
    return parts


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_lower_layers_do_not_import_higher_ones(layer):
    for path in sorted((PACKAGE / layer).glob("*.py")):
        forbidden = _imports(path) - ALLOWED[layer]
        assert not forbidden, f"{path.name} in {layer}/ imports {sorted(forbidden)}"


def test_the_checker_sees_a_forbidden_import(tmp_path):
    module = PACKAGE / "worker" / "scheduler.py"
    assert "aws" in _imports(module)
    assert "pyspark" not in _imports(module)


def test_dstream_glue_does_not_import_the_sql_package():
    """The sql package needs pyspark >= 4.0; DStream users on 3.5 must not need it."""
    for path in sorted((PACKAGE / "spark").glob("*.py")) + [PACKAGE / "__init__.py"]:
        assert "sql" not in _imports(path), f"{path.name} imports kinesis_dstream.sql"
