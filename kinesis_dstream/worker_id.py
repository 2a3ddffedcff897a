"""Worker ids: unique per process, and what one made elsewhere tells about its maker.

A default id names its host and pid, so a driver recovered from a Spark checkpoint can tell
an id pickled there by its predecessor, and whether that predecessor is proven gone (then
its leases can be taken at once rather than after the failover time).
"""
from __future__ import annotations

import os
import re
import socket
import uuid


def default_worker_id() -> str:
    """Unique per process, readable in the lease table (the KCL uses a UUID alone)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


_WORKER_ID = re.compile(r"^(?P<host>.+):(?P<pid>[0-9]+):[0-9a-f]{8}$")


def made_by_another_process(worker_id: str) -> bool:
    """A default worker id (``default_worker_id``) made in another process: one pickled into
    Spark's checkpoint by the driver this one recovers from. An id a user chose is never."""
    match = _WORKER_ID.match(worker_id)
    return match is not None and (match["host"] != socket.gethostname()
                                  or int(match["pid"]) != os.getpid())


def proven_dead(worker_id: str) -> bool:
    """The process that made this default worker id is gone: it ran on this host and its pid
    is no longer alive. Anything else (another host, a live pid, a user's id) is not proof."""
    match = _WORKER_ID.match(worker_id)
    if match is None or match["host"] != socket.gethostname():
        return False
    pid = int(match["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
