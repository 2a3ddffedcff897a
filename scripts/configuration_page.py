"""Write docs/configuration.md from the option declarations of every front end.

``python scripts/configuration_page.py`` rewrites the page; ``--check`` exits 1 when the
committed page differs from what the declarations say (tests/test_settings.py runs the same
comparison, so the page cannot drift).
"""
from __future__ import annotations

import sys
from pathlib import Path

from kinesis_dstream.multilang.property_keys import PROPERTIES
from kinesis_dstream.settings import FrontEnd, render_markdown
from kinesis_dstream.spark_conf import SPARK_CONF
from kinesis_dstream.sql.option_table import SQL_SINK, SQL_SOURCE

FRONT_ENDS: tuple[FrontEnd, ...] = (SPARK_CONF, SQL_SOURCE, SQL_SINK, PROPERTIES)
PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def page() -> str:
    return render_markdown(FRONT_ENDS)


def main(argv: list[str]) -> int:
    text = page()
    if "--check" in argv:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
            sys.stderr.write(f"{PAGE} is out of date: run python scripts/configuration_page.py\n")
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
