"""``kinesis.metadataCommitterType`` HDFS end to end: a query keeps its batch ranges under
its checkpointLocation and makes no DynamoDB call, through a kill -9 of its driver.

Real Spark on ``local-cluster[2,1,1024]`` (executors in processes of their own), driven as a
subprocess (``test_sql_source._driver_main``) so that it can be killed; kinesis-local for
Kinesis. DynamoDB, both by option and by AWS_ENDPOINT_URL_DYNAMODB, is an endpoint that
answers every request with AccessDeniedException and notes it: a query that touched
DynamoDB would fail or stall, and the notes name the call.
"""
from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest

from emulators import list_shard_ids
from test_sql_source import batch_files, delivered_by, kill_9_and_restart, options

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

DENIED = (b'{"__type": "com.amazon.coral.service#AccessDeniedException", "message": '
          b'"no DynamoDB permission (test)"}')


class RefusingEndpoint:
    """An HTTP endpoint that refuses every request (400 AccessDeniedException, as DynamoDB
    answers a caller without permission) and notes each one's X-Amz-Target."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with owner._lock:
                    owner.calls.append(self.headers.get("X-Amz-Target") or self.path)
                self.send_response(400)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(DENIED)))
                self.end_headers()
                self.wfile.write(DENIED)

            do_GET = do_PUT = do_DELETE = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def refusing_dynamodb() -> Iterator[RefusingEndpoint]:
    endpoint = RefusingEndpoint()
    try:
        yield endpoint
    finally:
        endpoint.stop()


@pytest.fixture
def env(aws_env: dict[str, str], kinesis_local: str, unique_app_name: str) -> dict[str, str]:
    return {"kinesis": kinesis_local, "app": unique_app_name}


def test_hdfs_ranges_need_no_dynamodb_through_a_driver_kill_9(env, make_stream, tmp_path,
                                                             refusing_dynamodb):
    """HDFS with the checkpointLocation as kinesis.metadataPath: the ranges are files
    there, DynamoDB gets no call at all (it refuses every one), the driver is killed -9
    mid-stream and a new one restarts from the checkpoint: every record comes once, and a
    batch run again brings the same records."""
    denied = boto3.client("dynamodb", endpoint_url=refusing_dynamodb.url, region_name="us-east-1")
    with pytest.raises(denied.exceptions.ClientError, match="AccessDenied"):
        denied.list_tables()  # the endpoint refuses, and notes what it refused
    assert refusing_dynamodb.calls == ["DynamoDB_20120810.ListTables"]
    refusing_dynamodb.calls.clear()

    stream = make_stream(2)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    checkpoint = str(tmp_path / "checkpoint")
    opts = options(stream, env["kinesis"], refusing_dynamodb.url, env["app"],
                   **{"kinesis.metadataCommitterType": "HDFS",
                      "kinesis.metadataPath": checkpoint})
    log_path = tmp_path / "driver.log"
    master = "local-cluster[2,1,1024]"
    environment = {"AWS_ENDPOINT_URL_DYNAMODB": refusing_dynamodb.url}
    ranges = Path(checkpoint) / "kinesis-ranges"

    def ranges_are_files() -> None:
        assert list(ranges.rglob("*.json")), "the ranges are files under the checkpoint"

    sent, running = kill_9_and_restart(out_dir, checkpoint, opts, log_path, env["kinesis"],
                                       stream, 240, master, ranges_are_files, **environment)
    assert running, log_path.read_text()[-3000:]
    assert refusing_dynamodb.calls == [], refusing_dynamodb.calls
    for batch_id, files in batch_files(out_dir).items():  # a batch run again: same records
        assert all(f == files[0] for f in files), batch_id
    assert delivered_by(out_dir) == Counter(s.decode() for s in sent)
    shards = {p.name for p in ranges.glob("*/*")}
    assert shards <= set(list_shard_ids(env["kinesis"], stream)) and shards
