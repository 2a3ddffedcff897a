"""One trace line appended to ``KD_TRACE_FILE``: shared by ``sitecustomize`` (every traced
process) and ``bench_sql_backlog`` (its own marks)."""
from __future__ import annotations

import json
import os
from typing import Any


def append(event: dict[str, Any]) -> None:
    """Append ``event`` as a JSON line (one write, so lines of processes do not mix)."""
    path = os.environ.get("KD_TRACE_FILE")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(event, default=str) + "\n").encode())
    finally:
        os.close(fd)
