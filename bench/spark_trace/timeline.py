"""Prints a trace file (``sitecustomize``'s JSON lines) as one timeline per query defined.

``python bench/spark_trace/timeline.py FILE``: every event in seconds after the line that
defined the query (the bench's ``defined`` mark), a line each, with its process's pid and
role; then per process its start, its imports and its calls, summed.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import Any


def load(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def roles(events: list[dict[str, Any]]) -> dict[int, str]:
    """A name for each pid: its argv, or the worker main it ran."""
    out: dict[int, str] = {}
    for e in events:
        if e["ev"] == "process":
            out[e["pid"]] = e["argv"].replace("-m ", "")
        if e["ev"] == "forked":
            out.setdefault(e["pid"], f"fork of {e['parent']}")
        if e["ev"] == "call" and e["name"].endswith(".main"):
            out[e["pid"]] = e["name"].rsplit(".", 1)[0].rsplit(".", 1)[-1]
    return out


def _at(e: dict[str, Any]) -> float:
    return float(e.get("begun", e.get("started", e["t"])))


def render_all(events: list[dict[str, Any]]) -> str:
    """One timeline per query defined (a variant run each), from its definition to the
    next one."""
    starts = sorted(e["t"] for e in events if e["ev"] == "mark" and e["name"] == "defined")
    if not starts:
        return render(events, events[0]["t"])
    bounds = [*starts, float("inf")]
    return "\n\n".join(render([e for e in events if bounds[i] <= _at(e) < bounds[i + 1]],
                               bounds[i], roles(events)) for i in range(len(starts)))


def render(events: list[dict[str, Any]], t0: float,
           who: dict[int, str] | None = None) -> str:
    who = who if who is not None else roles(events)
    lines = []
    for e in sorted(events, key=_at):
        at = _at(e) - t0
        if e["ev"] == "process":
            what = "process started (sitecustomize at +%.2f s)" % (e["t"] - e["started"])
        elif e["ev"] == "call":
            what = f"{e['name'].split('.', 2)[-1]}{' ' + e['op'] if e.get('op') else ''}"
            what += f" {e['s']:.3f} s"
        elif e["ev"] == "import":
            what = f"import {e['name']} {e['s']:.3f} s"
        elif e["ev"] == "mark":
            what = f"== {e['name']}"
        else:
            what = e["ev"] + (f" {e['s']:.3f} s" if "s" in e else "") + \
                (f" rows={e['rows']}" if "rows" in e else "")
        lines.append(f"{at:8.3f}  {e['pid']:>7} {who.get(e['pid'], '?')[:28]:<28} {what}")
    sums: dict[tuple[int, str], float] = defaultdict(float)
    for e in events:
        if e["ev"] == "call" and e["name"].endswith("_make_api_call"):
            sums[(e["pid"], "aws " + str(e.get("op")))] += e["s"]
    lines.append("")
    lines.append("AWS calls, summed per process:")
    for (pid, op), s in sorted(sums.items()):
        lines.append(f"  {pid:>7} {who.get(pid, '?')[:28]:<28} {op} {s:.3f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render_all(load(sys.argv[1])) + "\n")
