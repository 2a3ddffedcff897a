"""The README and the docs say what the code does: their Python blocks import what exists, the
README has an example per entry point and stays short, its Scheduler and Structured Streaming
examples run as written against the emulators (the DStream example runs in test_new_user.py,
the cluster recipe in test_distribution.py), the docs' Layout table lists the modules there
are, the documented errors import from `kinesis_dstream`, the npm line is package.json's, and
every docs page is in the site's nav."""
from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kinesis_dstream
from kinesis_dstream.local import NPM_EMULATORS

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in sorted((REPO / "docs").glob("*.md"))}
README_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
PYTHON_BLOCKS = README_BLOCKS + [block for text in DOCS.values()
                                 for block in re.findall(r"```python\n(.*?)```", text, flags=re.S)]
# "about 200 lines" (issue 23): the rest lives in docs/
README_MAX_LINES = 220


def section(text: str, heading: str) -> str:
    """From ``heading`` to the next second-level heading, or to the end."""
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def imported_names(block: str) -> list[tuple[str, str | None]]:
    """(module, name or None) for each import statement of a block."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.extend((node.module or "", alias.name) for alias in node.names)
    return found


@pytest.mark.unit
def test_the_readme_and_docs_have_python_blocks_and_they_parse():
    assert len(PYTHON_BLOCKS) >= 6
    for block in PYTHON_BLOCKS:
        ast.parse(block)


@pytest.mark.unit
@pytest.mark.parametrize("module, name", sorted(
    {pair for block in PYTHON_BLOCKS for pair in imported_names(block)}, key=str))
def test_every_name_the_readme_and_docs_import_exists(module, name):
    imported = importlib.import_module(module)
    if name is not None:
        assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), \
            f"from {module} import {name}"


@pytest.mark.unit
def test_the_readme_is_short_and_has_an_example_per_entry_point():
    assert len(README.splitlines()) <= README_MAX_LINES
    code = "\n".join(README_BLOCKS)
    assert "KinesisUtils.createStream(" in code                      # DStream
    assert 'readStream.format("aws-kinesis")' in code                # SQL source
    assert 'write.format("aws-kinesis")' in code                     # SQL sink
    assert "Scheduler(" in code                                      # worker
    assert "kinesis-dstream multilang --properties-file kcl_properties/" in README
    multilang = re.search(r"kinesis-dstream multilang --properties-file (\S+)", README).group(1)
    assert (REPO / multilang).is_file(), multilang
    for extra in ("spark", "sql", "local", "docs"):
        assert f"'kinesis-dstream[{extra}]'" in README, extra
    assert "make test" in README and "make demo" in README


@pytest.mark.unit
def test_the_readmes_links_into_docs_exist():
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert links
    for link in links:
        assert (REPO / link).exists(), link


@pytest.mark.unit
def test_the_documented_errors_and_kinesis_record_import_from_the_package():
    errors = section(DOCS["operations.md"], "Bad input fails within bounded time")
    names = set(re.findall(r"`([A-Z][A-Za-z]+(?:Error|Record))`", errors))
    assert {"StreamNotFoundError", "CredentialsError", "EndpointUnreachableError",
            "PutRecordsFailedError", "ExecutorEnvironmentError", "KinesisRecord"} <= names
    for name in names:
        assert name in kinesis_dstream.__all__
        assert getattr(kinesis_dstream, name).__name__ == name


def layout_rows() -> list[tuple[str, str]]:
    rows = re.findall(r"^\| (.+?) \| (.+?) \|$", section(DOCS["how-it-works.md"], "## Layout"),
                      flags=re.M)
    return [(cell, role) for cell, role in rows if cell not in ("module", "---")]


@pytest.mark.unit
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


@pytest.mark.unit
def test_the_path_of_one_record_names_existing_modules_and_counts_its_hops():
    path = section(DOCS["how-it-works.md"], "## The path of one record")
    rows = re.findall(r"^\| (\d+) \| \w+ \| `([^`]+)` \|", path, flags=re.M)
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1))
    for _, module in rows:
        assert (REPO / "kinesis_dstream" / module).is_file(), module
    assert f"**Today: {len(rows)} rows, {len(rows) - 1} hops**" in path
    assert f"through {len({m for _, m in rows})} modules" in path


@pytest.mark.unit
def test_the_npm_line_is_package_json():
    pinned = json.loads((REPO / "package.json").read_text())["dependencies"]
    assert sorted(NPM_EMULATORS) == sorted(f"{name}@{version}" for name, version in pinned.items())
    assert f"npm install {' '.join(NPM_EMULATORS)}" in README


@pytest.mark.unit
def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    mkdocs = (REPO / "mkdocs.yml").read_text()
    nav = re.findall(r"^\s+- [^:]+: (\S+\.md)$", mkdocs, flags=re.M)
    assert sorted(nav) == sorted(DOCS), (nav, sorted(DOCS))


def readme_block(containing: str) -> str:
    (block,) = [b for b in README_BLOCKS if containing in b]
    return block


def put_in(block: str, old: str, new: str) -> str:
    """The block as written, but for names a test must make unique."""
    assert block.count(old) == 1, f"{old!r} not once in the README block:\n{block}"
    return block.replace(old, new)


def run_example(code: str, tmp_path: Path, timeout_s: float) -> subprocess.CompletedProcess:
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)   # local_env is in os.environ
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout_s,
                          start_new_session=True)


@pytest.mark.emulator
def test_the_readmes_scheduler_example_runs_and_prints_the_records(
        local_env, make_stream, put_records, unique_app_name, tmp_path):
    stream = make_stream(2)
    keys = [f"readme-{i}" for i in range(6)]
    put_records(stream, [(key, f"data of {key}") for key in keys])
    code = readme_block("Scheduler(")
    code = put_in(code, 'stream_name="words"', f'stream_name="{stream}"')
    code = put_in(code, 'application_name="my-app"', f'application_name="{unique_app_name}"')
    done = run_example(code, tmp_path, timeout_s=120)
    assert done.returncode == 0, done.stderr[-5000:]
    for key in keys:
        assert re.search(rf"^{key} b'data of {key}' \d+ 0$", done.stdout, flags=re.M), done.stdout
    # print(scheduler.metrics()): every record counted, over the stream's two shards
    assert sum(int(n) for n in re.findall(r"\brecords=(\d+)", done.stdout)) == 6, done.stdout


@pytest.mark.spark
def test_the_readmes_structured_streaming_example_writes_then_reads_the_stream(
        local_env, make_stream, tmp_path):
    stream = make_stream(2)
    code = readme_block('readStream.format("aws-kinesis")')
    code = code.replace('"kinesis.streamName", "words"', f'"kinesis.streamName", "{stream}"')
    code = put_in(code, '"/tmp/words-checkpoint"', repr(str(tmp_path / "checkpoint")))
    # The README's 30 s window, as a condition: every record written is through the query.
    code = put_in(code, "query.awaitTermination(30)", "query.processAllAvailable()")
    done = run_example(code, tmp_path, timeout_s=240)
    (tmp_path / "stdout.txt").write_text(done.stdout)
    assert done.returncode == 0, done.stderr[-5000:]
    rows = re.findall(r"^\|\s*(key-\d)\s*\|\s*(\d+)\s*\|$", done.stdout, flags=re.M)
    assert rows, done.stdout[-5000:] + done.stderr[-3000:]
    assert all(int(data) % 10 == int(key[-1]) for key, data in rows), rows
