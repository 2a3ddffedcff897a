"""The operator's command line without emulators: positions, checkpoint show, usage errors,
an unreachable endpoint (a closed loopback port)."""
from __future__ import annotations

import datetime as _dt
import http.server
import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from repo_scripts import load_script

from kinesis_dstream import cli
from kinesis_dstream.operations.connection import BadInput
from kinesis_dstream.operations.positions import parse_position, split_lease_key
from kinesis_dstream.records import ExtendedSequenceNumber

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

KEPT = Path(__file__).parent / "data" / "sql-checkpoint-planned-not-committed"
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback


@pytest.mark.parametrize("text, kind, position", [
    ("TRIM_HORIZON", "TRIM_HORIZON", None),
    ("latest", "LATEST", None),
    ("49590338271490256608559692538361571095921575989136588898", "SEQUENCE",
     ExtendedSequenceNumber("49590338271490256608559692538361571095921575989136588898", 0)),
    ("4959/7", "SEQUENCE", ExtendedSequenceNumber("4959", 7)),
])
def test_positions_parse(text, kind, position):
    target = parse_position(text)
    assert (target.kind, target.position) == (kind, position)


def test_a_timestamp_without_a_zone_is_utc_and_z_is_accepted():
    utc = _dt.datetime(2026, 11, 25, 18, 0, tzinfo=_dt.timezone.utc)
    assert parse_position("AT_TIMESTAMP:2026-11-25T18:00:00").timestamp == utc
    assert parse_position("AT_TIMESTAMP:2026-11-25T18:00:00Z").timestamp == utc
    assert parse_position("AT_TIMESTAMP:2026-11-25T19:00:00+01:00").timestamp == utc


@pytest.mark.parametrize("text, says", [
    ("SHARD_END", "not a position"), ("12a", "not a position"), ("12/-1", "not a position"),
    ("", "not a position"), ("AT_TIMESTAMP:yesterday", "not an ISO 8601 time"),
])
def test_malformed_positions_name_what_is_wrong(text, says):
    with pytest.raises(BadInput, match=says):
        parse_position(text)


def test_lease_keys_of_both_kcl_modes():
    assert split_lease_key("shardId-000000000001") == (None, "shardId-000000000001")
    assert split_lease_key("123456789012:orders:1700000000:shardId-000000000001") == (
        "orders", "shardId-000000000001")


def test_checkpoint_show_names_the_batch_planned_but_not_committed(capsys):
    assert cli.main(["checkpoint", "show", str(KEPT), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["last_committed_batch"] is None
    assert report["planned_not_committed"] == [0]
    (batch,) = report["batches"]
    (source,) = batch["sources"]
    assert source["kinesis_dstream"] and source["reading"] == 1
    assert {s: e["position"] for s, e in source["shards"].items()} == {
        "shardId-000000000000": "at TRIM_HORIZON", "shardId-000000000001": "at TRIM_HORIZON"}
    assert cli.main(["checkpoint", "show", str(KEPT)]) == 0
    text = capsys.readouterr().out
    assert "planned, not committed: 0" in text and "shardId-000000000001  at TRIM_HORIZON" in text


def test_checkpoint_show_after_a_commit(tmp_path, capsys):
    """The same checkpoint with batch 0 committed and batch 1 planned from where it ended."""
    root = tmp_path / "cp"
    shutil.copytree(KEPT, root)
    (root / "commits").mkdir()
    (root / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    lines = (root / "offsets" / "0").read_text().splitlines()
    offset = json.loads(lines[2])
    offset.update(batch=2, shards={"shardId-000000000000": {"after": "4960", "sub": 3},
                                   "shardId-000000000001": {"ended": True}})
    (root / "offsets" / "1").write_text("\n".join([lines[0], lines[1], json.dumps(offset)]))
    assert cli.main(["checkpoint", "show", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["last_committed_batch"], report["planned_not_committed"]) == (0, [1])
    planned = report["batches"][1]["sources"][0]["shards"]
    assert planned["shardId-000000000000"]["position"] == "after 4960/3"
    assert planned["shardId-000000000001"]["position"] == "ended"


def test_checkpoint_show_of_a_directory_that_is_not_one(tmp_path, capsys):
    assert cli.main(["checkpoint", "show", str(tmp_path)]) == 2
    assert "not a Structured Streaming checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["leases"], ["leases", "status"], ["leases", "reset", "--app", "a", "--to", "LATEST"],
    ["leases", "reset", "--app", "a", "--all", "--shard", "s", "--to", "LATEST"],
    ["leases", "release", "--app", "a"], ["checkpoint"],
])
def test_usage_errors_exit_2(argv):
    assert cli.main(argv) == 2


def test_a_malformed_position_makes_no_call(aws_env, capsys):
    """The endpoint does not exist: the position is refused before any call."""
    assert cli.main(["leases", "reset", "--app", "a", "--all", "--to", "yesterday",
                     "--dynamodb-endpoint", CLOSED]) == 2
    assert "'yesterday' is not a position" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["leases", "status", "--app", "a"],
    ["leases", "reset", "--app", "a", "--all", "--to", "LATEST"],
    ["leases", "release", "--app", "a", "--worker", "w"],
])
def test_an_unreachable_endpoint_exits_3_within_10_s(aws_env, capsys, argv):
    started = time.monotonic()
    assert cli.main(argv + ["--dynamodb-endpoint", CLOSED, "--kinesis-endpoint", CLOSED]) == 3
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert "endpoint unreachable" in err and "127.0.0.1:9" in err


class _Denying(http.server.BaseHTTPRequestHandler):
    """Every AWS JSON call refused as IAM refuses it; the operations asked are recorded."""

    asked: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.asked.append(self.headers.get("X-Amz-Target", "?").rpartition(".")[2])
        body = json.dumps({"__type": "com.amazon.coral.service#AccessDeniedException",
                           "message": "User: arn:aws:iam::123456789012:user/ops is not "
                                      "authorized to perform this action"}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def denying():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Denying)
    _Denying.asked = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Denying.asked
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("argv", [
    ["leases", "status", "--app", "a", "--stream", "s"],
    ["leases", "reset", "--app", "a", "--stream", "s", "--all", "--to", "LATEST"],
    ["leases", "release", "--app", "a", "--worker", "w"],
    ["leases", "create-table", "--app", "a"],
])
def test_no_permission_is_a_clear_error_exit_3_within_10_s_and_nothing_written(
        aws_env, capsys, denying, argv):
    endpoint, asked = denying
    flags = ["--dynamodb-endpoint", endpoint]
    if argv[1] != "create-table":
        flags += ["--kinesis-endpoint", endpoint]
    started = time.monotonic()
    assert cli.main(argv + flags) == 3
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert "AccessDeniedException" in err and "not authorized" in err, err
    assert asked and not {"CreateTable", "UpdateItem", "PutItem", "DeleteItem",
                          "UpdateTimeToLive"} & set(asked), asked


def test_the_help_section_of_the_operations_page_is_what_the_parsers_print():
    module = load_script("operations_help")
    assert module.PAGE.read_text(encoding="utf-8") == module.page(), \
        "docs/operations-cli.md --help section is stale: run python scripts/operations_help.py"
