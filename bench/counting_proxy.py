"""A loopback proxy in its own process that counts DynamoDB calls by operation and table.

The benchmarks put it between every client (the driver's coordinator and the executors'
shard readers) and the moto server to count the DynamoDB writes a batch costs. It runs in a
separate process so that its own CPU time never counts as the driver's. The proxy itself is
tests/fault_proxy.py with nothing injected.

``python bench/counting_proxy.py <upstream> [--split-renewals]`` prints its endpoint, then
answers each ``report`` line on stdin with one JSON line of counts; end of input stops it.
With ``--split-renewals`` a lease renewal (an UpdateItem that sets only ``leaseCounter``, as
``LeaseTable.renew_lease`` sends it) counts as ``UpdateItem(renewal)`` instead of ``UpdateItem``, so that
renewals are told apart from checkpoints and takes on the same table. Run with no argument
(as ``make bench`` does for every bench/*.py) it does nothing.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RENEWAL = "UpdateItem(renewal)"
WRITE_OPERATIONS = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem",
                              "TransactWriteItems", "CreateTable", "UpdateTimeToLive", RENEWAL})
# LeaseTable.renew_lease's update expression, as it appears in the request's JSON body.
_RENEWAL_UPDATE = b'"UpdateExpression": "SET leaseCounter = :counter"'


class CountingProxy:
    """The proxy process, seen from the benchmark: ``endpoint``, ``counts()``, ``stop()``."""

    def __init__(self, upstream: str, split_renewals: bool = False) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), upstream]
        if split_renewals:
            command.append("--split-renewals")
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"counting proxy did not start: {line!r}")
        self.endpoint = line

    def counts(self) -> Counter[tuple[str, str]]:
        """Calls so far by (operation, table)."""
        self.proc.stdin.write("report\n")
        self.proc.stdin.flush()
        return Counter({(op, table): n for op, table, n in json.loads(self.proc.stdout.readline())})

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "CountingProxy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def calls_between(before: Counter, after: Counter) -> dict[str, Any]:
    """Calls made between two ``counts()``: writes and reads, by table and operation."""
    delta = after - before
    tables: dict[str, dict[str, int]] = {}
    for (op, table), n in sorted(delta.items()):
        tables.setdefault(table or "-", {})[op] = n
    writes = sum(n for (op, _), n in delta.items() if op in WRITE_OPERATIONS)
    return {"writes": writes, "reads": sum(delta.values()) - writes, "by_table": tables}


def writes_to(before: Counter, after: Counter, table: str) -> int:
    return sum(n for (op, t), n in (after - before).items() if t == table and op in WRITE_OPERATIONS)


def _serve(upstream: str, split_renewals: bool = False) -> int:
    sys.path.insert(0, str(BENCH_DIR.parent / "tests"))
    import fault_proxy  # noqa: PLC0415 - tests/ is on the path only here
    from fault_proxy import FaultProxy  # noqa: PLC0415

    if split_renewals:
        operation = fault_proxy._operation

        def renewal_apart(target: str, body: bytes) -> tuple[str, str]:
            op, table = operation(target, body)
            if op == "UpdateItem" and _RENEWAL_UPDATE in body.replace(b'":"', b'": "'):
                return RENEWAL, table
            return op, table

        fault_proxy._operation = renewal_apart

    with FaultProxy(upstream, share=0.0, max_lifetime_s=6 * 3600) as proxy:
        print(proxy.endpoint, flush=True)
        for line in sys.stdin:
            if line.strip() == "report":
                with proxy._lock:
                    rows = [[op, table, n] for (op, table), n in proxy.calls.items()]
                print(json.dumps(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1], "--split-renewals" in sys.argv[2:]) if len(sys.argv) > 1 else 0)
