"""Each key of the KCL's multilang properties format does what the migration page's KCL
table says: parsed from a properties file, a honoured key reaches the daemon's settings, an
accepted one is read and dropped, a refused one stops the start with an error naming it."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.multilang.kcl_key_fates import (
    ACCEPTED,
    HONOURED,
    KCL_KEYS,
    REFUSED,
    KeyFate,
    fates,
)
from kinesis_dstream.multilang.properties import MultiLangSettings, load_properties
from kinesis_dstream.multilang.property_keys import PROPERTIES

pytestmark = pytest.mark.unit

# A fixed worker id: without one each load draws its own. POLLING said outright, so that
# the KCL's polling-only keys (accepted) do not turn retrievalMode DEFAULT into polling.
BASE = {"executableName": "app.py", "streamName": "s", "applicationName": "a",
        "workerIdentifier": "w", "retrievalMode": "POLLING"}
# Keys the KCL reads that our table declares under our own name only (none today): a KCL key
# missing from KCL_KEYS would not be on the page.
OURS_ONLY = {"cloudWatchEndpoint", "billingMode", "stalledShardLagMillis",
             "stalledShardTimeMillis"}


def _load(directory: Path, extra: dict[str, str]) -> MultiLangSettings:
    for script in ("app.py", KCL_KEYS["executableName"]):
        (directory / script).write_text("print('hi')\n")
    base = {key: value for key, value in BASE.items()
            if not (key == "workerIdentifier" and "workerId" in extra)}
    path = directory / "app.properties"
    path.write_text("".join(f"{key} = {value}\n" for key, value in {**base, **extra}.items()))
    return load_properties(path)


def _at(settings: MultiLangSettings, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), settings)


def test_every_declared_key_is_on_the_page() -> None:
    declared = {option.name for option in PROPERTIES.options}
    assert declared - set(KCL_KEYS) == OURS_ONLY


@pytest.mark.parametrize("row", fates(), ids=lambda row: row.key)
def test_key_does_what_its_row_says(row: KeyFate, tmp_path: Path) -> None:
    if row.fate == REFUSED:
        with pytest.raises(ConfigurationError, match=row.key.replace(".", r"\.")):
            _load(tmp_path, {row.key: row.example})
        return
    base = _load(tmp_path, {})
    given = _load(tmp_path, {row.key: row.example})
    if row.fate == ACCEPTED:
        assert row.reason
        assert row.key in given.ignored_keys
        assert given.config == base.config
        return
    assert row.fate == HONOURED
    assert _at(given, row.lands) != _at(base, row.lands), row.lands
    read = PROPERTIES.read({row.key: row.example}, source="t")
    option = PROPERTIES.by_key[row.key]
    if option.target in ("config", "settings"):
        assert _at(given, row.lands) == read.of(option.target)[option.field]


def test_a_bean_property_given_by_both_its_names_is_refused_naming_both(tmp_path: Path) -> None:
    """The Java daemon sets one property from both (which wins is commons-beanutils' order);
    here neither wins quietly."""
    with pytest.raises(ConfigurationError, match=r"maxRecords.*pollingConfig\.maxRecords"):
        _load(tmp_path, {"maxRecords": "100", "pollingConfig.maxRecords": "200"})
