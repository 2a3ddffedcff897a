"""sql.datasource.register: its probe and our sources share one environment (no Spark: the
session faked), so the Python workers the probe starts are the ones the first query reads in
(Spark pools its Python workers by interpreter and environment)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kinesis_dstream.sql import datasource

pytestmark = pytest.mark.unit


class Conf(dict):
    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key, default)

    def set(self, key: str, value: Any) -> None:
        self[key] = value

    def unset(self, key: str) -> None:
        self.pop(key, None)


def test_the_probe_is_made_in_the_environment_our_sources_are_registered_in(
        monkeypatch: pytest.MonkeyPatch):
    sc = SimpleNamespace(environment={"USER_SET": "kept"}, pythonExec="python3", master="yarn",
                         defaultParallelism=2)
    spark = SimpleNamespace(sparkContext=sc, conf=Conf())
    seen: dict[str, dict[str, str]] = {}
    monkeypatch.setattr(datasource, "source_runner_environment",
                        lambda sc: {"SPARK_BUFFER_SIZE": "65536"})
    monkeypatch.setattr(datasource, "check_executors",
                        lambda sc, *a, **k: seen.setdefault("probe", dict(sc.environment)))
    monkeypatch.setattr("kinesis_dstream.sql.worker_probe.data_source_probe_job",
                        lambda *a, **k: None)
    monkeypatch.setattr(datasource, "_register_unless_found",
                        lambda spark, source: seen.setdefault("sources", dict(sc.environment)))
    monkeypatch.setattr(datasource, "_listen_for_stops", lambda spark: None)
    datasource.register(spark)
    assert seen["probe"] == seen["sources"]
    assert seen["probe"]["USER_SET"] == "kept" and "SPARK_BUFFER_SIZE" in seen["probe"]
    assert sc.environment == {"USER_SET": "kept"}  # put back after
