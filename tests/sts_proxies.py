"""Counting proxies before Kinesis and STS, and the checks built on them, shared by the
SQL source's cross-account tests (test_sql_cross_account.py) and the DStream's
(test_spark_assume_role.py). Nothing here imports pyspark's SQL Data Source API, so the
DStream test also runs on Spark 3.5.
"""
from __future__ import annotations

import json
import urllib.request
from collections import Counter
from typing import Callable

from fault_proxy import FaultProxy
from spark_helpers import ancestry

from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID

# Records are put in WAVES waves of PER_WAVE, each waited for, so several batches run.
WAVES, PER_WAVE = 4, 30


def role_of(app: str) -> str:
    """A role of another account, unique to the test: no process has assumed it yet."""
    return f"arn:aws:iam::210987654321:role/reader-{app[-40:]}"


def sessions_at_moto(moto: str, role: str) -> dict[str, dict]:
    """The sessions moto's STS handed out for ``role``, by their access key id."""
    with urllib.request.urlopen(f"{moto}/moto-api/data.json", timeout=30) as answer:
        state = json.load(answer)
    return {session["access_key_id"]: session for sessions in state.get("sts", {}).values()
            for session in sessions if session.get("role_arn") == role}


def on_executor(pid: int) -> bool:
    """Is ``pid`` one of an executor's processes (under a CoarseGrainedExecutorBackend)?"""
    return any("CoarseGrainedExecutorBackend" in line for line in ancestry(pid)[1:])


class Proxies:
    """A counting proxy before kinesis-local and one before moto's STS, both noting which
    process sent each call."""

    def __init__(self, make_fault_proxy: Callable[..., FaultProxy], moto: str) -> None:
        self.kinesis = make_fault_proxy(share=0.0)
        self.sts = make_fault_proxy(share=0.0, upstream=moto)
        self.kinesis.track_callers = self.sts.track_callers = True

    def assume_roles_by_process(self) -> Counter[int]:
        return Counter({pid: n for (op, pid), n in self.sts.callers.items()
                        if op == "AssumeRole"})

    def readers(self) -> set[int]:
        """The processes that read records (sent GetRecords)."""
        return {pid for (op, pid) in self.kinesis.callers if op == "GetRecords"}

    def kinesis_signers(self) -> set[str]:
        return {key for (op, key) in self.kinesis.signers}


def assert_assumed_once_per_process(proxies: Proxies, tasks: int,
                                    executors: dict[int, bool]) -> None:
    """Every process that used the role assumed it once: each reader among them (executors'
    Python workers, and the driver's that probe shards); none twice, and the executors'
    Python workers not once for each of the ``tasks`` that read (they are reused)."""
    by_process = proxies.assume_roles_by_process()
    assert 0 not in by_process, f"an AssumeRole from a process not found: {by_process}"
    assert by_process and max(by_process.values()) == 1, by_process
    readers = proxies.readers()
    assert readers and readers <= set(by_process), (readers, by_process)
    on_executors = [pid for pid in by_process if executors[pid]]
    # Executors read the records (the driver's processes may probe shards with GetRecords).
    assert readers & set(on_executors), (readers, executors)
    assert tasks >= WAVES and len(on_executors) < tasks, (on_executors, tasks)


def executors_of(proxies: Proxies) -> dict[int, bool]:
    """For every process that assumed the role or read: is it an executor's? (Asked while
    the query runs, before idle Python workers may go.)"""
    pids = set(proxies.assume_roles_by_process()) | proxies.readers()
    return {pid: on_executor(pid) for pid in pids}


def assert_signed_by_role_sessions(proxies: Proxies, moto: str, role: str,
                                   session_name: Callable[[str], bool]) -> None:
    """Every Kinesis call was signed with a key moto's STS handed out for ``role``, under a
    session name ``session_name`` accepts; none with the environment's static key."""
    signers = proxies.kinesis_signers()
    assert {op for (op, _) in proxies.kinesis.signers} >= {"ListShards", "GetRecords"}
    assert DUMMY_ACCESS_KEY_ID not in signers
    sessions = sessions_at_moto(moto, role)
    assert signers and signers <= set(sessions), (signers, sorted(sessions))
    names = {sessions[key]["session_name"] for key in signers}
    assert all(session_name(name) for name in names), names
    # Each process assumed the role once: as many sessions as AssumeRole calls.
    assert len(sessions) == sum(proxies.assume_roles_by_process().values()), sessions
