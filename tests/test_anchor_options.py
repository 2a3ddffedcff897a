"""Every documented option of each anchor (awslabs, qubole, Databricks) has its fate: the
migration page's tables are what ``sql.anchor_options`` generates, and each row is parsed in
that anchor's names, written as documented and as Spark hands them (lower-cased): a honoured
option sets our option's field and keeps the anchor's default, an accepted one is taken
without an unknown-option warning, a refused one fails naming it (tier 1, no I/O)."""
from __future__ import annotations

import logging
from typing import Any

import pytest
from repo_scripts import load_script

from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.sql import other_connectors, vocabulary
from kinesis_dstream.sql.anchor_options import (
    ACCEPTED,
    ANCHORS,
    HONOURED,
    QUBOLE,
    REFUSED,
    Anchor,
    AnchorOption,
    our_option,
)
from kinesis_dstream.sql.datasource import KinesisDataSource, KinesisShortNameDataSource
from kinesis_dstream.sql.option_table import PARSER_LOGGER, ROLES
from kinesis_dstream.sql.options import parse_options, parse_source_options

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

PARSERS = {"source": parse_source_options, "sink": parse_options}
# Where each target's fields end up on the parsed options.
TARGET_PATHS = {"config": "config.{}", "source": "{}", "sink": "sink.{}"}


def _tables_module():
    return load_script("migration_tables")


def rows() -> list[Any]:
    return [pytest.param(anchor, row, role, id=f"{anchor.key}-{role}-{row.name}")
            for anchor in ANCHORS for row in anchor.options for role in row.roles]


@pytest.fixture(autouse=True)
def _no_ambient_aws(monkeypatch):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL_KINESIS",
                 "AWS_ENDPOINT_URL_DYNAMODB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setattr(other_connectors, "_WARNED", set())  # every test sees its warnings


def _options(anchor: Anchor, row: AnchorOption, role: str, value: str | None,
             lower: bool) -> dict[str, str]:
    options = {**anchor.base[role], **row.needs}
    if value is not None:
        options = {key: v for key, v in options.items() if key.lower() != row.name.lower()}
        options[row.name] = value
    return {key.lower(): v for key, v in options.items()} if lower else options


def _get(parsed: Any, path: str) -> Any:
    for part in path.split("."):
        parsed = getattr(parsed, part)
    return parsed


def _unknown_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == PARSER_LOGGER and r.levelno >= logging.WARNING]


def _effect(row: AnchorOption, role: str) -> tuple[str, Any]:
    """Where the example shows and what it is there: the row's ``sets``, else the mapped
    option's own field, read as that option reads the example."""
    if row.sets is not None:
        return row.sets[0], row.sets[1]
    option = our_option(row.name, role)
    assert option is not None and option.field, f"{row.name}: no field to check"
    return TARGET_PATHS[option.target].format(option.field), \
        option.type.parse(option.name, row.example)


@pytest.mark.parametrize("lower", [False, True], ids=["as-documented", "as-spark-hands-it"])
@pytest.mark.parametrize("anchor, row, role", rows())
def test_every_documented_option_meets_its_fate(anchor, row, role, lower, caplog):
    caplog.set_level(logging.INFO)
    parse = PARSERS[role]
    options = _options(anchor, row, role, row.example, lower)
    if row.fate == REFUSED:
        with pytest.raises(ConfigurationError, match=row.name.split(".")[-1]) as refused:
            parse(options)
        assert row.name.lower() in str(refused.value).lower()
        assert row.reason() and row.reason() in str(refused.value), "the error says why"
        return
    parsed = parse(options)
    assert parsed.unknown == (), f"{row.name} is unknown to the {role}"
    assert not [m for m in _unknown_warnings(caplog) if "unknown" in m or "does not apply" in m]
    assert our_option(row.name, role) is not None
    if row.fate == ACCEPTED:
        assert row.reason(), f"{row.name}: an accepted option says why it does nothing"
        return
    assert row.fate == HONOURED
    path, expected = _effect(row, role)
    assert _get(parsed, path) == expected
    try:
        without = parse(_options(anchor, row, role, None, lower))
    except ConfigurationError:  # a pair's other half (a secret key) means nothing alone
        without = parse({k.lower() if lower else k: v for k, v in anchor.base[role].items()})
    assert _get(without, path) != expected, f"{row.name}: the example is the default"
    if row.default:
        with_default = parse(_options(anchor, row, role, row.default, lower))
        same = _get(with_default, path) == _get(without, path)
        assert same != bool(row.differs), (
            f"{row.name}: the anchor's default {row.default!r} "
            + ("now means ours: drop the row's differs" if same else
               "is not ours: say so in the row's differs"))


def _format(anchor: Anchor) -> type[KinesisDataSource]:
    """The data source registered under the anchor's format name."""
    found = [cls for cls in (KinesisDataSource, KinesisShortNameDataSource)
             if cls.name() == anchor.format_name]
    assert len(found) == 1, anchor.format_name
    return found[0]


@pytest.mark.parametrize("anchor, row, role",
                         [p for p in rows() if p.values[2] == "source"])
def test_load_on_the_anchors_format_name_takes_or_refuses_each_option(anchor, row, role):
    """What ``spark.readStream.format(<the anchor's name>)...load()`` asks the source:
    its schema, which parses the options as Spark hands them."""
    source = _format(anchor)(_options(anchor, row, role, row.example, lower=True))
    if row.fate == REFUSED:
        with pytest.raises(ConfigurationError, match=row.name):
            source.schema()
    else:
        assert source.schema().fieldNames()


def test_a_refused_value_says_which_option_and_why():
    """What refusal looks like: a credential class with no meaning here, and the awslabs
    floor of kinesis.maxFetchTimePerShardSec."""
    base = {"kinesis.streamName": "s", "kinesis.region": "eu-west-1"}
    with pytest.raises(ConfigurationError, match="kinesis.credentialProviderClass"):
        parse_source_options({**base, "kinesis.credentialProviderClass": "com.example.Mine"})
    with pytest.raises(ConfigurationError, match="kinesis.maxFetchTimePerShardSec.*at least 10"):
        parse_source_options({**base, "kinesis.maxFetchTimePerShardSec": "5"})


def test_every_qubole_prefixed_name_of_ours_is_in_qubole_s_list():
    """Nothing documented is forgotten: the vocabulary takes any name under qubole's prefixes
    as qubole's, so each such name or alias of option_table must be a row of qubole's list."""
    listed = {(row.name.lower(), role) for row in QUBOLE.options for role in row.roles}
    missing = [f"{name} ({role})" for role, front in ROLES.items() for option in front.options
               for name in (option.name, *option.aliases)
               if name.lower().startswith(vocabulary.QUBOLE_ONLY_PREFIXES)
               and (name.lower(), role) not in listed]
    assert not missing, f"qubole's names missing from its list: {missing}"


@pytest.mark.parametrize("anchor", ANCHORS, ids=lambda anchor: anchor.key)
def test_a_name_only_one_anchor_documents_tells_that_anchor(anchor):
    """The vocabulary is read from the lists: a row's name that no other anchor lists (and
    that is not anyone's here) names its anchor; one that two anchors list names none."""
    others = {row.name.lower() for other in ANCHORS if other is not anchor for row in other.options}
    for row in anchor.options:
        name = row.name.lower()
        expected = None if name in others or name in vocabulary.NEUTRAL_NAMES else anchor.key
        if name.startswith(vocabulary.QUBOLE_ONLY_PREFIXES):
            expected = "qubole"
        assert vocabulary.vocabulary([row.name]) == expected, row.name


@pytest.mark.parametrize("anchor", ANCHORS, ids=lambda anchor: anchor.key)
def test_each_list_names_an_option_once(anchor):
    names = [row.name.lower() for row in anchor.options]
    assert len(names) == len(set(names))
    assert all(row.fate in (HONOURED, ACCEPTED, REFUSED) and row.example
               for row in anchor.options)


def test_the_committed_migration_tables_are_what_the_lists_generate():
    module = _tables_module()
    committed = module.PAGE.read_text(encoding="utf-8")
    assert committed == module.updated(committed), \
        "docs/migration.md is stale: run python scripts/migration_tables.py"
