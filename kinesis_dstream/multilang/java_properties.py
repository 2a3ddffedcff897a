"""The java.util.Properties text format, as the Java MultiLangDaemon reads its file.

Kept apart from the keys (``properties.py``): this is only the file's syntax, separators,
comments, continuations and escapes, with no idea of what a key means.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from ..errors import ConfigurationError

log = logging.getLogger(__name__)


def parse_properties(text: str) -> dict[str, str]:
    """Read java.util.Properties text: ``=``/``:``/space separators, ``#``/``!`` comments,
    backslash continuations and escapes. Values are stripped of trailing whitespace
    (the Java daemon's converters trim them too). The last of duplicated keys wins."""
    result: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while _ends_with_continuation(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip(" \t\f")
            i += 1
        if _ends_with_continuation(line):
            line = line[:-1]
        key, value = _split_key_value(line)
        if key in result:
            log.debug("properties: %s given more than once; the last value wins", key)
        result[key] = value.rstrip()
    return result


def _ends_with_continuation(line: str) -> bool:
    backslashes = len(line) - len(line.rstrip("\\"))
    return backslashes % 2 == 1


def _split_key_value(line: str) -> tuple[str, str]:
    key_chars: list[str] = []
    j = 0
    while j < len(line):
        c = line[j]
        if c == "\\" and j + 1 < len(line):
            key_chars.append(c + line[j + 1])
            j += 2
            continue
        if c in "=: \t\f":
            break
        key_chars.append(c)
        j += 1
    rest = line[j:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return _unescape("".join(key_chars)), _unescape(rest)


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    j = 0
    while j < len(text):
        c = text[j]
        if c != "\\" or j + 1 >= len(text):
            out.append(c)
            j += 1
            continue
        nxt = text[j + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[j + 2:j + 6] or ""):
            out.append(chr(int(text[j + 2:j + 6], 16)))
            j += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        j += 2
    return "".join(out)


def read_properties_file(path: str | os.PathLike) -> dict[str, str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read properties file {str(path)!r}: {exc}") from exc
    return parse_properties(text)
