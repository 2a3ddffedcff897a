"""Child processes of the tests: none outlives the test that started it."""
from __future__ import annotations

import subprocess


def reap(proc: subprocess.Popen, timeout: float = 10.0) -> int:
    """Kill ``proc`` unless it has ended, then wait for it; for a test's ``finally``."""
    if proc.poll() is None:
        proc.kill()
    return proc.wait(timeout)
