"""The README says what the code does: its Python blocks import what exists, its Layout table
lists the modules there are, its errors import from `kinesis_dstream`, its npm line is
package.json's."""
from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

import kinesis_dstream
from kinesis_dstream.local import NPM_EMULATORS

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def imported_names(block: str) -> list[tuple[str, str | None]]:
    """(module, name or None) for each import statement of a block."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.extend((node.module or "", alias.name) for alias in node.names)
    return found


def test_the_readme_has_python_blocks_and_they_parse():
    assert len(PYTHON_BLOCKS) >= 6
    for block in PYTHON_BLOCKS:
        ast.parse(block)


@pytest.mark.parametrize("module, name", sorted(
    {pair for block in PYTHON_BLOCKS for pair in imported_names(block)}, key=str))
def test_every_name_the_readme_imports_exists(module, name):
    imported = importlib.import_module(module)
    if name is not None:
        assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), \
            f"from {module} import {name}"


def test_the_documented_errors_and_kinesis_record_import_from_the_package():
    section = README[README.index("Bad input fails within bounded time"):]
    section = section[:section.index("\n## ")]
    names = set(re.findall(r"`([A-Z][A-Za-z]+(?:Error|Record))`", section))
    assert {"StreamNotFoundError", "CredentialsError", "EndpointUnreachableError",
            "PutRecordsFailedError", "ExecutorEnvironmentError", "KinesisRecord"} <= names
    for name in names:
        assert name in kinesis_dstream.__all__
        assert getattr(kinesis_dstream, name).__name__ == name


def layout_rows() -> list[tuple[str, str]]:
    section = README[README.index("## Layout"):]
    section = section[:section.index("\n## ", 1)]
    rows = re.findall(r"^\| (.+?) \| (.+?) \|$", section, flags=re.M)
    return [(cell, role) for cell, role in rows if cell not in ("module", "---")]


def test_the_layout_table_lists_existing_modules_once_and_covers_every_module():
    listed: list[str] = []
    for cell, role in layout_rows():
        for path in re.findall(r"`([^`]+)`", cell):
            base = "kinesis_dstream/" if not path.startswith(("kinesis_dstream", "pyspark_")) else ""
            listed.append(base + path)
        # modules named in the role column of a package's row (`options.py`, ...)
        package = re.fullmatch(r"`(kinesis_dstream/\w+/)`", cell)
        if package:
            listed.extend(package.group(1) + m for m in re.findall(r"`(\w+\.py)`", role))
    assert len(listed) == len(set(listed)), sorted(p for p in listed if listed.count(p) > 1)
    for path in listed:
        assert (REPO / path).exists(), path
    modules = {str(p.relative_to(REPO)) for p in (REPO / "kinesis_dstream").rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py")}
    covered = {m for m in modules
               if m in listed or any(m.startswith(d) for d in listed if d.endswith("/"))}
    assert modules == covered, sorted(modules - covered)


def test_the_npm_line_is_package_json():
    pinned = json.loads((REPO / "package.json").read_text())["dependencies"]
    assert sorted(NPM_EMULATORS) == sorted(f"{name}@{version}" for name, version in pinned.items())
    assert f"npm install {' '.join(NPM_EMULATORS)}" in README
