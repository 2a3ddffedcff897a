"""What installs without pyspark, and what the protobuf import leaves behind (subprocesses)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.emulator

REPO = Path(__file__).resolve().parent.parent

# Any import of pyspark fails, as when it is not installed. (six cannot be blocked the same
# way: python-dateutil, a botocore dependency, declares and imports it.)
_BLOCK = """
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pyspark":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Block())
"""


def run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", _BLOCK + code, *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)


def test_worker_multilang_and_the_package_import_without_pyspark_or_sys_path_changes():
    proc = run("""
import pkgutil, importlib, sys
import kinesis_dstream
path_before = list(sys.path)
for package in ("aws", "worker", "multilang"):
    module = importlib.import_module(f"kinesis_dstream.{package}")
    for info in pkgutil.iter_modules(module.__path__):
        importlib.import_module(f"kinesis_dstream.{package}.{info.name}")
import kinesis_dstream.cli, kinesis_dstream.local
assert sys.path == path_before, "an import changed sys.path"
assert "config_pb2" not in sys.modules, "a plain config_pb2 module was left behind"
assert "aws_kinesis_agg.deaggregator" not in sys.modules  # the module that needs six
assert not [m for m in sys.modules if m.split(".")[0] == "pyspark"]
print("imported")
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "imported"


def test_the_multilang_command_runs_without_pyspark(tmp_path):
    bad = tmp_path / "bad.properties"
    bad.write_text("executableName = x.py\nstreamName = s\napplicationName = a\n"
                   "maxRecords = many\n")
    proc = run("import sys\nfrom kinesis_dstream.cli import main\n"
               "sys.exit(main(['multilang', '--properties-file', sys.argv[1]]))", str(bad))
    assert proc.returncode == 2, proc.stderr      # the properties were read: no ImportError
    assert "maxRecords" in proc.stderr and "pyspark" not in proc.stderr


def test_kinesis_utils_without_pyspark_names_the_extra():
    proc = run("from kinesis_dstream import KinesisUtils")
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and "kinesis-dstream[spark]" in proc.stderr
