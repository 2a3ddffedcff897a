"""Write the per-anchor option tables of docs/migration.md from ``sql.anchor_options``, and
the KCL daemon's key table from ``multilang.kcl_key_fates``.

Each table sits between ``<!-- anchor-options:<anchor> -->`` and ``<!-- /anchor-options -->``
on the page; the prose around them is hand-written and kept. ``python
scripts/migration_tables.py`` rewrites the tables; ``--check`` exits 1 when the committed page
differs (tests/test_anchor_options.py runs the same comparison, so the tables cannot drift
from the lists or from the option declarations they name).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from kinesis_dstream.multilang.kcl_key_fates import fates
from kinesis_dstream.sql.anchor_options import ANCHORS, HONOURED, Anchor, our_option

PAGE = Path(__file__).resolve().parent.parent / "docs" / "migration.md"
END = "<!-- /anchor-options -->"
KCL_START, KCL_END = "<!-- kcl-keys -->", "<!-- /kcl-keys -->"


def _start(anchor: Anchor) -> str:
    return f"<!-- anchor-options:{anchor.key} -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{_cell(text)}`" if text else ""


def table(anchor: Anchor) -> str:
    """One row per documented option: where it applies, its fate, and what it is here."""
    lines = [f"Generated from `kinesis_dstream/sql/anchor_options.py`; each row is parsed by "
             f"`tests/test_anchor_options.py` with `format(\"{anchor.format_name}\")`'s "
             "parser.", "",
             "| option | for | fate | here | its default | ours | why, or what to know |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in anchor.options:
        ours = our_option(row.name, row.roles[0])
        here = ""
        if row.fate == HONOURED and ours is not None:
            here = "same name" if ours.name.lower() == row.name.lower() else f"`{ours.name}`"
        ours_default = ours.default if ours is not None and row.fate == HONOURED else ""
        why = "; ".join(part for part in (row.differs, row.reason()) if part)
        lines.append(f"| `{row.name}` | {', '.join(row.roles)} | {row.fate} | {here} | "
                     f"{_code(row.default)} | {_code(ours_default)} | {_cell(why)} |")
    return "\n".join(lines)


def kcl_table() -> str:
    """One row per key of the KCL's multilang properties format: its fate and where it lands."""
    lines = ["Generated from `kinesis_dstream/multilang/kcl_key_fates.py` (fates read from the "
             "key table, `property_keys.py`); each row is parsed from a properties file by "
             "`tests/test_kcl_key_fates.py`.", "",
             "| key | fate | here | why, or what to know |", "| --- | --- | --- | --- |"]
    for row in fates():
        here = f"`{row.lands}`" if row.lands else ""
        lines.append(f"| `{row.key}` | {row.fate} | {here} | {_cell(row.reason)} |")
    return "\n".join(lines)


def updated(text: str) -> str:
    """``text`` with each anchor's table regenerated between its markers."""
    for anchor in ANCHORS:
        pattern = re.compile(re.escape(_start(anchor)) + r".*?" + re.escape(END), re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"{PAGE}: no {_start(anchor)} ... {END} markers")
        block = f"{_start(anchor)}\n{table(anchor)}\n{END}"
        text = pattern.sub(lambda _, block=block: block, text, count=1)
    pattern = re.compile(re.escape(KCL_START) + r".*?" + re.escape(KCL_END), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{PAGE}: no {KCL_START} ... {KCL_END} markers")
    block = f"{KCL_START}\n{kcl_table()}\n{KCL_END}"
    return pattern.sub(lambda _: block, text, count=1)


def main(argv: list[str]) -> int:
    text = PAGE.read_text(encoding="utf-8")
    new = updated(text)
    if "--check" in argv:
        if new != text:
            sys.stderr.write(f"{PAGE} is out of date: run python scripts/migration_tables.py\n")
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
