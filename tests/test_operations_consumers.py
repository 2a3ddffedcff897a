"""``kinesis-dstream consumers`` against kinesis-local: a consumer that outlived its query is
listed (named after the SQL query when it is), and can be deregistered by name."""
from __future__ import annotations

import json

import pytest

import emulators
from test_operations_leases import run_cli

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def listed(capsys, stream: str, endpoint: str, *extra: str) -> tuple[int, dict[str, dict]]:
    code, out, err, _ = run_cli(capsys, "consumers", "list", "--stream", stream,
                                "--kinesis-endpoint", endpoint, "--json", *extra)
    assert code in (0, 1), err
    return code, {c["name"]: c for c in json.loads(out)["consumers"]}


def test_a_stream_s_consumers_are_listed_and_one_is_deregistered_by_name(
        aws_env, kinesis_local, make_stream, capsys):
    stream = make_stream(1)
    emulators.register_consumer(kinesis_local, stream, "kinesis-dstream-sql-0123abcd")
    emulators.register_consumer(kinesis_local, stream, "my-app")
    code, found = listed(capsys, stream, kinesis_local)
    assert code == 0 and set(found) == {"kinesis-dstream-sql-0123abcd", "my-app"}
    assert found["kinesis-dstream-sql-0123abcd"]["sql_query"] == "0123abcd"
    assert found["my-app"]["sql_query"] is None
    assert all(c["status"] == "ACTIVE" and c["created"] and c["age_minutes"] >= 0
               for c in found.values()), found
    code, old = listed(capsys, stream, kinesis_local, "--older-than-minutes", "0")
    assert code == 1 and set(old) == set(found)  # a finding: exit 1
    code, out, err, _ = run_cli(capsys, "consumers", "deregister", "--stream", stream,
                                "--kinesis-endpoint", kinesis_local, "--name", "my-app")
    assert code == 0 and "deregistered consumer my-app" in out, err
    _, after = listed(capsys, stream, kinesis_local)
    assert after.get("my-app", {}).get("status") in (None, "DELETING")
    code, _, err, _ = run_cli(capsys, "consumers", "deregister", "--stream", stream,
                              "--kinesis-endpoint", kinesis_local, "--name", "nobody")
    assert code == 2 and "no consumer 'nobody'" in err
    code, _, err, _ = run_cli(capsys, "consumers", "list", "--stream", "no-such-stream",
                              "--kinesis-endpoint", kinesis_local)
    assert code == 2 and "no-such-stream" in err
