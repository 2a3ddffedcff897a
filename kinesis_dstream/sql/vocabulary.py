"""Which connector's names a query's options are written in, and the defaults that follow.

Where the anchors' defaults differ (qubole's failOnDataLoss is true, awslabs' false), the
default follows the names the options use. A name tells its connector only when one anchor
documents it: the names are read from the anchors' lists (``anchor_options``), the one place
each anchor's documented options are written, so detection and the migration page cannot
drift apart. Two exceptions are written here: qubole's prefixes (its README documents
``kinesis.executor.*`` and ``kinesis.client.*`` knobs beyond those listed, and spells one
``kniesis.``), and names of ours that one anchor also documents but a job moved from another
may add (``kinesis.dynamodb.tableName``: our range table's name, which awslabs has and a
qubole job needs).
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping

from .anchor_options import ANCHORS, Anchor

QUBOLE_ONLY_PREFIXES = ("kinesis.executor.", "kniesis.executor.", "kinesis.client.")
# Documented by one anchor, yet anyone's here: they tell no connector apart.
NEUTRAL_NAMES = frozenset({"kinesis.dynamodb.tablename"})


def _only_names(anchors: tuple[Anchor, ...]) -> Mapping[str, frozenset[str]]:
    """Per anchor, the lower-cased names no other anchor documents (Spark lower-cases keys)."""
    names = {anchor.key: {row.name.lower() for row in anchor.options} for anchor in anchors}
    documented_by = Counter(name for listed in names.values() for name in listed)
    return {key: frozenset(name for name in listed
                           if documented_by[name] == 1 and name not in NEUTRAL_NAMES)
            for key, listed in names.items()}


ONLY_NAMES = _only_names(ANCHORS)


def vocabulary(keys: Iterable[str]) -> str | None:
    """``"qubole"``, ``"databricks"`` or ``"awslabs"``: the one connector whose own names the
    options use; None when they use none, or several connectors' (mixed: no anchor's
    defaults can be told, ours, the awslabs ones, apply)."""
    found = set()
    for key in (str(key).lower() for key in keys):
        if key.startswith(QUBOLE_ONLY_PREFIXES):
            found.add("qubole")
        found.update(anchor for anchor, names in ONLY_NAMES.items() if key in names)
    return found.pop() if len(found) == 1 else None


# failOnDataLoss when not given, by vocabulary: qubole's README and code default to true, the
# awslabs connector's to false; Databricks documents no such option: ours, false.
FAIL_ON_DATA_LOSS_DEFAULTS: Mapping[str | None, bool] = {
    "qubole": True, "awslabs": False, "databricks": False, None: False}


def default_fail_on_data_loss(keys: Iterable[str]) -> bool:
    """failOnDataLoss's default for options given under ``keys`` (the one place it is
    decided): true when they are written in qubole's names, as qubole's connector fails the
    query on trimmed data unless told otherwise."""
    return FAIL_ON_DATA_LOSS_DEFAULTS[vocabulary(keys)]
