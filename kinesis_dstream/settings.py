"""One settings engine for the three ways users configure us.

SQL ``.option()``s, Spark conf keys and KCL properties files used to be read by three sets of
parsers that disagreed (``yes`` was true in a properties file only, ``latest`` a position in
SQL only). Here each front end declares its options once (name, aliases, type, default, doc)
and reads them through the same rules: one for booleans, one for choices (any case, the
declared spelling returned), one duration parser; unknown keys are warned about by name or
refused, as the front end says. The configuration page of the docs is rendered from the same
declarations, so it cannot drift from what is parsed.
"""
from __future__ import annotations

import difflib
import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import ConfigurationError

# -- the value rules -----------------------------------------------------------------------------
# Booleans: what the Java MultiLangDaemon's converter reads, any case, in every front end.
TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")


def parse_boolean(label: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ConfigurationError(f"{label}: expected true or false (or yes/no, on/off, 1/0), "
                             f"got {value!r}")


def parse_choice(label: str, value: Any, choices: tuple[str, ...]) -> str:
    """Any case in, the declared spelling out."""
    by_lower = {choice.lower(): choice for choice in choices}
    text = str(value).strip().lower()
    if text not in by_lower:
        raise ConfigurationError(f"{label}: expected one of {', '.join(choices)}, got {value!r}")
    return by_lower[text]


_SPARK_UNITS = (("ms", 1), ("min", 60_000), ("s", 1000), ("m", 60_000), ("h", 3_600_000))
# java.time.Duration's text: PnDTnHnMn.nS, each part optional, signs allowed per part.
_ISO_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+(?:[.,]\d+)?)S)?)?",
    re.IGNORECASE)


def parse_duration_ms(value: str | int | float, key: str) -> int:
    """Milliseconds from Spark's form ("100ms", "2s", "1min", "1h"; a bare number is ms) or
    ISO-8601 as java.time.Duration writes it ("PT15M", "P2D", "PT0.5S")."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    text = str(value).strip()
    iso = _ISO_DURATION.fullmatch(text)
    if iso and any(iso.groups()[1:]) and not text.upper().endswith("T"):
        days, hours, minutes, seconds = (float((part or "0").replace(",", "."))
                                         for part in iso.groups()[1:])
        total = ((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000
        return int(-total if iso.group(1) == "-" else total)
    lowered = text.lower()
    for suffix, factor in _SPARK_UNITS:  # noqa: B007 - factor is read after the break
        if lowered.endswith(suffix):
            number = lowered[: -len(suffix)].strip()
            break
    else:
        number, factor = lowered, 1
    try:
        parsed = float(number) * factor
        if not math.isfinite(parsed):
            raise ValueError(number)
        return int(parsed)
    except (ValueError, OverflowError):
        raise ConfigurationError(
            f"{key}: cannot read {value!r} as a duration (250ms, 2s, 1min or PT15M)") from None


def parse_whole(label: str, value: Any, minimum: int | None = None,
                maximum: int | None = None) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigurationError(f"{label}: not a whole number: {value!r}") from None
    if minimum is not None and number < minimum:
        raise ConfigurationError(f"{label}: must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ConfigurationError(f"{label}: must be at most {maximum}, got {number}")
    return number


# -- types ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ValueType:
    """How an option's text becomes a value, and how the docs name that."""

    description: str
    read: Callable[[str, str], Any]

    def parse(self, label: str, value: Any) -> Any:
        return self.read(label, value)


def Text(description: str = "text") -> ValueType:  # noqa: N802 - reads as a type
    def read(label: str, value: Any) -> str:
        text = str(value).strip()
        if not text:
            raise ConfigurationError(f"{label}: a value is required, got {value!r}")
        return text
    return ValueType(description, read)


def Whole(minimum: int | None = None, maximum: int | None = None,  # noqa: N802
          then: Callable[[int], Any] | None = None) -> ValueType:
    bounds = (f" >= {minimum}" if minimum is not None and maximum is None else
              f" in {minimum}..{maximum}" if minimum is not None else "")

    def read(label: str, value: Any) -> Any:
        number = parse_whole(label, value, minimum, maximum)
        return then(number) if then else number
    return ValueType(f"whole number{bounds}", read)


def Number(minimum: float | None = None) -> ValueType:  # noqa: N802
    def read(label: str, value: Any) -> float:
        try:
            number = float(str(value).strip())
        except ValueError:
            raise ConfigurationError(f"{label}: not a number: {value!r}") from None
        if minimum is not None and not number >= minimum:
            raise ConfigurationError(f"{label}: must be at least {minimum:g}, got {value!r}")
        return number
    return ValueType("number" if minimum is None else f"number >= {minimum:g}", read)


BOOLEAN = ValueType("boolean", parse_boolean)

# Spark's byte strings: a unit of 1024s, any case; a bare number is bytes.
_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}
_BYTE_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


def parse_bytes(label: str, value: Any) -> int:
    """Bytes from Spark's form: ``512``, ``64k``, ``10mb``, ``20gb`` (units of 1024)."""
    match = _BYTE_SIZE.fullmatch(str(value).strip().lower())
    if match is None or match.group(2) not in _BYTE_UNITS:
        raise ConfigurationError(f"{label}: cannot read {value!r} as a size (512, 64k, 10mb, "
                                 "20gb)")
    return int(float(match.group(1)) * _BYTE_UNITS[match.group(2)])


def Bytes(minimum: int = 0) -> ValueType:  # noqa: N802
    def read(label: str, value: Any) -> int:
        number = parse_bytes(label, value)
        if number < minimum:
            raise ConfigurationError(f"{label}: must be at least {minimum} bytes, got {value!r}")
        return number
    return ValueType("size in bytes (512, 64k, 10mb, 20gb)", read)


def Choice(*choices: str) -> ValueType:  # noqa: N802
    return ValueType(f"one of {', '.join(choices)} (any case)",
                     lambda label, value: parse_choice(label, value, choices))


def Refused(reason: str) -> ValueType:  # noqa: N802
    """An option that is known and refused whatever its value: a setting a job relies on
    that cannot be honoured here, so it fails at start naming the option and ``reason``
    rather than running without it."""
    def read(label: str, value: Any) -> Any:
        raise ConfigurationError(f"{label} is not supported here: {reason}")
    return ValueType("refused", read)


def Duration(minimum_ms: int | None = 0, unit_ms: int = 1) -> ValueType:  # noqa: N802
    """A duration in ms (or in ``unit_ms`` units: 1000 gives seconds as a float)."""
    def read(label: str, value: Any) -> Any:
        number = parse_duration_ms(value, label)
        if minimum_ms is not None and number < minimum_ms:
            raise ConfigurationError(f"{label}: must be at least {minimum_ms} ms, got {value!r}")
        return number if unit_ms == 1 else number / unit_ms
    floor = "" if minimum_ms is None else f" >= {minimum_ms} ms"
    return ValueType(f"duration{floor} (250ms, 2s, 1min, PT15M; a bare number is ms)", read)


# -- options and front ends ----------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """One setting as a user writes it.

    ``target`` names what takes the value (``"config"`` for a ``ConsumerConfig`` field, or a
    front end's own object) and ``field`` the field there; an option with no ``field`` is
    checked and then has no effect here (``doc`` says why). ``default`` is what the docs show.
    """

    name: str
    type: ValueType
    doc: str
    default: str = ""
    aliases: tuple[str, ...] = ()
    target: str = "config"
    field: str = ""


@dataclass
class Read:
    """What one front end made of one set of keys."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)  # target -> field -> value
    given: dict[str, str] = field(default_factory=dict)  # option name -> the key it came as
    unknown: tuple[str, ...] = ()

    def of(self, target: str) -> dict[str, Any]:
        return self.values.setdefault(target, {})


@dataclass(frozen=True)
class FrontEnd:
    """One way of configuring us: its options and its key rules.

    ``case_sensitive``: whether keys are (Spark conf and properties files: yes; SQL options:
    no, Spark lower-cases them). ``unknown``: ``"warn"`` (by name, once per read, with the
    closest known name) or ``"reject"``. Only keys starting with one of ``owned_prefixes``
    (all keys when empty) can be unknown: a Spark conf holds every other component's keys too;
    ``host_keys`` are keys the host itself passes. ``canonical`` maps a key as written to the
    form looked up (before case folding). Warnings go to the front end's ``logger``.
    """

    name: str
    doc: str
    options: tuple[Option, ...]
    case_sensitive: bool
    unknown: str = "warn"
    noun: str = "option"
    owned_prefixes: tuple[str, ...] = ()
    host_keys: frozenset[str] = frozenset()
    canonical: Callable[[str], str] | None = None
    logger: str = __name__

    def _fold(self, key: str) -> str:
        return key if self.case_sensitive else key.lower()

    @property
    def by_key(self) -> dict[str, Option]:
        return {self._fold(key): option for option in self.options
                for key in (option.name, *option.aliases)}

    def _canonical(self, key: str) -> str:
        return self.canonical(key) if self.canonical else key

    def read(self, values: Mapping[str, Any], *, source: str, warn: bool = True,
             elsewhere: Mapping[str, str] | None = None) -> Read:
        """Parse every known key; an invalid value raises ``ConfigurationError`` naming the
        option (and the key it came as, if an alias). ``elsewhere``: folded key -> why it
        does not apply here, for keys another front end owns."""
        known = self.by_key
        result = Read()
        unknown: list[str] = []
        for raw_key, value in values.items():
            key = str(raw_key)
            folded = self._fold(self._canonical(key))
            option = known.get(folded)
            if option is None:
                if self._owned(key) and self._fold(key) not in self.host_keys:
                    unknown.append(key)
                continue
            if option.name in result.given:
                # Two spellings of one option: which one won would depend on dict order.
                raise ConfigurationError(f"{option.name}: given twice, as "
                                         f"{result.given[option.name]!r} and as {key!r}; keep one")
            result.given[option.name] = key
            label = (option.name if self._fold(key) == self._fold(option.name) else
                     key if folded == self._fold(option.name) else f"{option.name} (as {key})")
            parsed = option.type.parse(label, value)
            if option.field:
                result.of(option.target)[option.field] = parsed
        result.unknown = tuple(unknown)
        if unknown and self.unknown == "reject":
            raise ConfigurationError(f"{source}: unknown {self.noun}(s): {', '.join(unknown)}")
        if warn:
            for key in dict.fromkeys(unknown):
                self._warn_unknown(key, source, known, elsewhere or {})
        return result

    def _owned(self, key: str) -> bool:
        return not self.owned_prefixes or key.startswith(self.owned_prefixes)

    def _warn_unknown(self, key: str, source: str, known: Mapping[str, Option],
                      elsewhere: Mapping[str, str]) -> None:
        folded = self._fold(key)
        if folded in elsewhere:
            logging.getLogger(self.logger).warning("%s: %s %r %s; ignored", source, self.noun,
                                                   key, elsewhere[folded])
            return
        close = difflib.get_close_matches(folded, list(known), n=1, cutoff=0.8) or \
            [k for k in known if k.lower() == key.lower()][:1]
        hint = f"; did you mean {known[close[0]].name}?" if close else ""
        logging.getLogger(self.logger).warning("%s: unknown %s %r ignored%s", source,
                                               self.noun, key, hint)


# -- the docs page -------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_markdown(front_ends: tuple[FrontEnd, ...], title: str = "Configuration") -> str:
    """The configuration reference: one table per front end, one row per option."""
    lines = [f"# {title}", "",
             "<!-- Generated by scripts/configuration_page.py from the option declarations "
             "(kinesis_dstream/settings.py); do not edit by hand. -->", "",
             "Every front end reads values by the same rules: booleans are `true`/`false`, "
             "`yes`/`no`, `on`/`off` or `1`/`0` in any case; choices are accepted in any case; "
             "durations are Spark's (`250ms`, `2s`, `1min`, `1h`, a bare number is "
             "milliseconds) or ISO-8601 (`PT15M`). An invalid value fails at start, naming "
             "the option.", "",
             "Credentials pair the same way everywhere: a key id and a secret key come "
             "together; a role to assume needs a session name and may have an external id "
             "(only roles whose trust policy asks for one need it); a session name or an "
             "external id without a role is refused. `KinesisUtils.createStream`'s "
             "positional STS arguments follow PySpark's rule: all three or none. A secret "
             "key or external id is never in a repr, one of our log lines or an error "
             "message, and no checkpoint holds a secret key; what is written where: "
             "[operations](operations.md#secrets).", ""]
    for front in front_ends:
        unknown = ("refused" if front.unknown == "reject" else "logged as a warning naming it")
        keys = "case-sensitive" if front.case_sensitive else "case-insensitive"
        lines += [f"## {front.name}", "", _cell(front.doc), "",
                  f"Keys are {keys}; an unknown {front.noun} is {unknown}.", "",
                  "| Name | Type | Default | Aliases | Description |",
                  "| --- | --- | --- | --- | --- |"]
        for option in front.options:
            aliases = ", ".join(f"`{alias}`" for alias in option.aliases)
            default = f"`{option.default}`" if option.default else ""
            lines.append(f"| `{option.name}` | {_cell(option.type.description)} | {default} | "
                         f"{aliases} | {_cell(option.doc)} |")
        lines.append("")
    return "\n".join(lines)
