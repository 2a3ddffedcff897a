"""Where a new SQL query starts, as each connector's users write it.

The awslabs and qubole connectors write ``LATEST``, ``TRIM_HORIZON``/``EARLIEST`` or (ours)
``AT_TIMESTAMP <ISO 8601 time>``, read by ``position_text`` as everywhere else; Databricks'
``initialPosition`` writes them in lower case and a time as JSON, ``{"at_timestamp":
"06/25/2020 10:23:45 PDT", "format": "MM/dd/yyyy HH:mm:ss ZZZ"}``, the format a Java
date-time pattern (that one by default). Anything else is refused naming the option: a query
that silently starts at LATEST loses what it was asked to read. The parser returns
retrieval's ``StartingPosition``, the value every read starts from.

qubole's connector also takes a JSON map of shard id -> ``{"iteratorType": ...,
"iteratorPosition": ...}`` (the form its offsets are written in; a ``"metadata"`` entry is
ignored, as qubole does), iterator types TRIM_HORIZON, LATEST, AT_TIMESTAMP (epoch
milliseconds), AT_SEQUENCE_NUMBER, AFTER_SEQUENCE_NUMBER and SHARD_END; a shard not in the
map starts at LATEST, as there. That reads as ``ShardStarts``.
"""
from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import ConfigurationError
from ..position_text import TimeTextError, iso_time, parse_position_text
from ..retrieval import StartingPosition

# Databricks' default pattern for {"at_timestamp": ...} without a "format".
DEFAULT_TIMESTAMP_FORMAT = "MM/dd/yyyy HH:mm:ss ZZZ"

# Zone abbreviations a Java pattern's zone letters read (Java knows more; these are the ones
# without two meanings). An IANA name (America/Los_Angeles) or an offset reads too.
_ZONE_HOURS = {"UTC": 0, "GMT": 0, "Z": 0, "UT": 0, "PST": -8, "PDT": -7, "MST": -7, "MDT": -6,
               "CST": -6, "CDT": -5, "EST": -5, "EDT": -4, "AKST": -9, "AKDT": -8, "HST": -10,
               "WET": 0, "WEST": 1, "CET": 1, "CEST": 2, "EET": 2, "EEST": 3, "JST": 9,
               "KST": 9, "AEST": 10, "AEDT": 11}

# Java pattern letters -> (field, regex). Runs of a letter are one field.
_FIELDS = {"y": ("year", r"\d{4}"), "u": ("year", r"\d{4}"), "M": ("month", r"\d{1,2}"),
           "d": ("day", r"\d{1,2}"), "H": ("hour", r"\d{1,2}"), "h": ("hour12", r"\d{1,2}"),
           "m": ("minute", r"\d{1,2}"), "s": ("second", r"\d{1,2}"), "S": ("fraction", r"\d+"),
           "a": ("ampm", r"[AaPp][Mm]"), "z": ("zone", r"[A-Za-z_/+\-:0-9]+"),
           "Z": ("zone", r"[A-Za-z_/+\-:0-9]+"), "X": ("zone", r"[A-Za-z_/+\-:0-9]+"),
           "x": ("zone", r"[+\-][0-9:]+"), "V": ("zone", r"[A-Za-z_/+\-:0-9]+")}
_OFFSET = re.compile(r"([+-])(\d{2}):?(\d{2})?")


def _pattern_regex(pattern: str, key: str) -> re.Pattern[str]:
    """A Java date-time pattern (``MM/dd/yyyy HH:mm:ss ZZZ``) as a regex of named groups."""
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if char == "'":  # quoted literal text; '' is a quote
            end = pattern.find("'", i + 1)
            if end < 0:
                raise ConfigurationError(f"{key}: unclosed quote in format {pattern!r}")
            out.append(re.escape(pattern[i + 1:end] or "'"))
            i = end + 1
            continue
        run = len(pattern[i:]) - len(pattern[i:].lstrip(char))
        if char in _FIELDS:
            name, regex = _FIELDS[char]
            if name == "year" and run == 2:
                name, regex = "year2", r"\d{2}"
            if name == "month" and run >= 3:
                name, regex = "month_name", r"[A-Za-z]+"
            out.append(f"(?P<{name}>{regex})")
        elif char.isalpha():
            raise ConfigurationError(f"{key}: the format letter {char!r} in {pattern!r} is not "
                                     "read here (use y M d H h m s S a z Z X)")
        else:
            out.append(re.escape(char * run))
        i += run
    try:
        return re.compile("".join(out), re.IGNORECASE)
    except re.error:
        raise ConfigurationError(f"{key}: format {pattern!r} repeats a field") from None


def _zone(text: str, key: str) -> _dt.tzinfo:
    offset = _OFFSET.fullmatch(text)
    if offset:
        minutes = int(offset.group(2)) * 60 + int(offset.group(3) or 0)
        return _dt.timezone(_dt.timedelta(minutes=-minutes if offset.group(1) == "-" else minutes))
    if text.upper() in _ZONE_HOURS:
        return _dt.timezone(_dt.timedelta(hours=_ZONE_HOURS[text.upper()]))
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(text)
    except Exception:  # noqa: BLE001 - ZoneInfo raises several kinds for a bad name
        raise ConfigurationError(f"{key}: unknown time zone {text!r} (use an offset such as "
                                 "-0700, or a name such as America/Los_Angeles)") from None


def parse_java_time(text: str, pattern: str, key: str) -> float:
    """Epoch seconds of ``text`` read with the Java date-time ``pattern``."""
    match = _pattern_regex(pattern, key).fullmatch(text.strip())
    if match is None:
        raise ConfigurationError(f"{key}: cannot read {text!r} with the format {pattern!r}")
    parts = {k: v for k, v in match.groupdict().items() if v is not None}
    try:
        year = (int(parts["year"]) if "year" in parts else
                2000 + int(parts["year2"]) if "year2" in parts else 1970)
        if "month_name" in parts:
            month = _dt.datetime.strptime(parts["month_name"][:3].title(), "%b").month
        else:
            month = int(parts.get("month", 1))
        hour = int(parts.get("hour", 0))
        if "hour12" in parts:
            hour = int(parts["hour12"]) % 12 + (12 if parts.get("ampm", "").upper() == "PM" else 0)
        fraction = parts.get("fraction", "0")
        micro = int((fraction + "000000")[:6])
        zone = _zone(parts["zone"], key) if "zone" in parts else _dt.timezone.utc
        moment = _dt.datetime(year, month, int(parts.get("day", 1)), hour,
                              int(parts.get("minute", 0)), int(parts.get("second", 0)), micro,
                              tzinfo=zone)
    except ValueError as exc:
        raise ConfigurationError(f"{key}: cannot read {text!r} with the format {pattern!r}: "
                                 f"{exc}") from None
    return moment.timestamp()


def _iso_time(raw: str, key: str) -> float:
    try:
        return iso_time(raw).timestamp()
    except TimeTextError as exc:
        raise ConfigurationError(f"{key}: {exc}") from None


def _at_timestamp_json(text: str, key: str) -> StartingPosition:
    """Databricks' ``{"at_timestamp": "<time>", "format": "<Java pattern>"}``."""
    try:
        value: Any = json.loads(text)
    except ValueError:
        raise ConfigurationError(f"{key}: cannot read {text!r} as JSON") from None
    fields = {str(k).lower(): v for k, v in value.items()} if isinstance(value, dict) else {}
    moment, pattern = fields.get("at_timestamp"), fields.get("format")
    if not isinstance(moment, str) or set(fields) - {"at_timestamp", "format"} or \
            (pattern is not None and not isinstance(pattern, str)):
        raise ConfigurationError(
            f"{key}: expected {{\"at_timestamp\": \"<time>\", \"format\": \"<pattern>\"}} "
            f"(format optional), got {text!r}")
    if pattern is None:  # Databricks' default pattern; an ISO 8601 time reads too
        try:
            return StartingPosition("AT_TIMESTAMP", timestamp=_iso_time(moment, key))
        except ConfigurationError:
            pattern = DEFAULT_TIMESTAMP_FORMAT
    return StartingPosition("AT_TIMESTAMP", timestamp=parse_java_time(moment, pattern, key))


# qubole's iterator types of a per-shard start (KinesisPosition), and which need a position.
SHARD_END = "SHARD_END"
_SHARD_ITERATOR_TYPES = {"TRIM_HORIZON": False, "LATEST": False, "AT_TIMESTAMP": True,
                         "AT_SEQUENCE_NUMBER": True, "AFTER_SEQUENCE_NUMBER": True,
                         SHARD_END: False}
_QUBOLE_METADATA = "metadata"  # qubole's offset JSON carries it beside the shards


@dataclass(frozen=True)
class ShardStarts:
    """qubole's per-shard ``startingPosition``: each named shard's start (types as
    GetShardIterator's, plus SHARD_END: nothing to read); any other shard starts at
    ``default`` (LATEST, as in qubole's connector)."""

    shards: Mapping[str, StartingPosition]
    default: StartingPosition = field(default_factory=lambda: StartingPosition("LATEST"))


def _shard_start(shard: str, entry: Any, text: str, key: str) -> StartingPosition:
    where = f"{key}: shard {shard!r} in {text!r}"
    if not isinstance(entry, dict) or set(entry) - {"iteratorType", "iteratorPosition"}:
        raise ConfigurationError(f"{where}: expected {{\"iteratorType\": \"<type>\", "
                                 "\"iteratorPosition\": \"<position>\"}")
    kind = str(entry.get("iteratorType", "")).upper()
    position = entry.get("iteratorPosition", "")
    if kind not in _SHARD_ITERATOR_TYPES:
        raise ConfigurationError(f"{where}: iteratorType {entry.get('iteratorType')!r} is not "
                                 f"one of {', '.join(_SHARD_ITERATOR_TYPES)}")
    if not _SHARD_ITERATOR_TYPES[kind]:
        return StartingPosition(kind)
    position = str(position if position is not None else "").strip()
    if kind == "AT_TIMESTAMP":
        try:  # qubole writes epoch milliseconds
            return StartingPosition(kind, timestamp=int(position) / 1000.0)
        except ValueError:
            raise ConfigurationError(f"{where}: AT_TIMESTAMP's iteratorPosition {position!r} "
                                     "is not epoch milliseconds") from None
    if not position.isdigit():
        raise ConfigurationError(f"{where}: {kind}'s iteratorPosition {position!r} is not a "
                                 "sequence number")
    return StartingPosition(kind, sequence_number=position)


def _shard_starts_json(value: dict[str, Any], text: str, key: str) -> ShardStarts:
    """qubole's ``{"shardId-...": {"iteratorType": ..., "iteratorPosition": ...}, ...}``."""
    shards = {str(shard): _shard_start(str(shard), entry, text, key)
              for shard, entry in value.items() if shard != _QUBOLE_METADATA}
    if not shards:
        raise ConfigurationError(f"{key}: no shard in {text!r}: expected "
                                 "{\"<shard id>\": {\"iteratorType\": ..., "
                                 "\"iteratorPosition\": ...}, ...}")
    return ShardStarts(shards)


def parse_starting_position(text: Any, key: str) -> StartingPosition | ShardStarts:
    """``LATEST``, ``TRIM_HORIZON``/``EARLIEST``, ``AT_TIMESTAMP <ISO 8601 time>`` (any case),
    Databricks' ``{"at_timestamp": ..., "format": ...}`` or qubole's per-shard JSON map;
    anything else is refused."""
    raw = str(text).strip()
    if raw.startswith("{"):
        try:
            value: Any = json.loads(raw)
        except ValueError as exc:
            raise ConfigurationError(f"{key}: cannot read {raw!r} as JSON ({exc})") from None
        if isinstance(value, dict) and value and \
                not {str(k).lower() for k in value} & {"at_timestamp", "format"}:
            return _shard_starts_json(value, raw, key)
        return _at_timestamp_json(raw, key)
    try:
        parsed = parse_position_text(raw, sequences=False)
    except TimeTextError as exc:
        raise ConfigurationError(f"{key}: {exc}") from None
    except ValueError:
        raise ConfigurationError(
            f"{key}: expected latest, trim_horizon, earliest, 'AT_TIMESTAMP <ISO time>', "
            f"{{\"at_timestamp\": \"<time>\", \"format\": \"<pattern>\"}} or {{\"<shard id>\": "
            f"{{\"iteratorType\": ..., \"iteratorPosition\": ...}}}}, got {text!r}; the query "
            "would otherwise start somewhere it was not asked to") from None
    if parsed.timestamp is not None:
        return StartingPosition(parsed.kind, timestamp=parsed.timestamp.timestamp())
    return StartingPosition(parsed.kind)
