"""Credentials: assumed roles refreshed on moto's STS, secrets never in output, private files."""
from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
import uuid

import boto3
import pytest

from processes import reap
from recording_processor import read_events, start_worker
from waiting import wait_for

from kinesis_dstream.aws.clients import assumed_role_credentials
from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY
from kinesis_dstream.worker import process
from kinesis_dstream.worker.processor import RecordProcessor
from kinesis_dstream.worker.scheduler import Scheduler

ROLE = "arn:aws:iam::123456789012:role/stream-reader"


def role_settings(sts_endpoint: str, **overrides) -> dict:
    return dict(sts_assume_role_arn=ROLE, sts_session_name="kd-test",
                sts_external_id="ext-" + uuid.uuid4().hex, sts_endpoint=sts_endpoint,
                sts_duration_s=900, **overrides)



def session_noting_assume_role() -> tuple[boto3.session.Session, list[dict]]:
    """A session with the dummy credentials, and the list its AssumeRole calls' parameters
    are appended to."""
    base = boto3.session.Session(aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                                 aws_secret_access_key=DUMMY_SECRET_ACCESS_KEY,
                                 region_name=DUMMY_REGION)
    sent: list[dict] = []
    base.events.register("provide-client-params.sts.AssumeRole",
                         lambda params, **_: sent.append(dict(params)))
    return base, sent

@pytest.mark.emulator
def test_assume_role_sends_the_external_id_and_duration(aws_env, dynamodb, make_config):
    config = make_config("s", **role_settings(dynamodb))
    base, sent = session_noting_assume_role()
    credentials = assumed_role_credentials(config, base)
    assert sent == [{"RoleArn": ROLE, "RoleSessionName": "kd-test",
                     "ExternalId": config.sts_external_id, "DurationSeconds": 900}]
    frozen = credentials.get_frozen_credentials()
    assert frozen.token and frozen.access_key != DUMMY_ACCESS_KEY_ID


@pytest.mark.emulator
def test_a_role_without_an_external_id_is_assumed_without_one(aws_env, dynamodb, make_config):
    """STS takes ExternalId as optional: none is sent, not even an empty one, on the wire."""
    settings = role_settings(dynamodb)
    del settings["sts_external_id"]
    config = make_config("s", **settings)
    base = boto3.session.Session(aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                                 aws_secret_access_key=DUMMY_SECRET_ACCESS_KEY,
                                 region_name=DUMMY_REGION)
    sent: list[dict] = []
    bodies: list[str] = []
    base.events.register("provide-client-params.sts.AssumeRole",
                         lambda params, **_: sent.append(dict(params)))
    base.events.register("before-send.sts.AssumeRole",
                         lambda request, **_: bodies.append(request.body.decode()
                                                            if isinstance(request.body, bytes)
                                                            else str(request.body)))
    credentials = assumed_role_credentials(config, base)
    assert sent == [{"RoleArn": ROLE, "RoleSessionName": "kd-test", "DurationSeconds": 900}]
    assert len(bodies) == 1 and "Action=AssumeRole" in bodies[0]
    assert "ExternalId" not in bodies[0]
    frozen = credentials.get_frozen_credentials()
    assert frozen.token and frozen.access_key != DUMMY_ACCESS_KEY_ID


@pytest.mark.emulator
def test_a_role_alone_is_assumed_under_a_session_name_of_ours(aws_env, dynamodb, make_config):
    """Databricks' roleArn without roleSessionName: moto's STS is asked for the role with
    the session kinesis-dstream-<epoch seconds>, no ExternalId, and its credentials sign."""
    config = make_config("s", sts_assume_role_arn=ROLE, sts_endpoint=dynamodb,
                         sts_duration_s=900)
    assert config.sts_session_name is None
    base, sent = session_noting_assume_role()
    before = int(time.time())
    credentials = assumed_role_credentials(config, base)
    assert len(sent) == 1 and set(sent[0]) == {"RoleArn", "RoleSessionName", "DurationSeconds"}
    name = sent[0]["RoleSessionName"]
    assert name.startswith("kinesis-dstream-")
    assert before <= int(name.rpartition("-")[2]) <= int(time.time())
    frozen = credentials.get_frozen_credentials()
    caller = boto3.client("sts", endpoint_url=dynamodb, region_name=DUMMY_REGION,
                          aws_access_key_id=frozen.access_key,
                          aws_secret_access_key=frozen.secret_key,
                          aws_session_token=frozen.token).get_caller_identity()
    assert caller["Arn"].endswith(f":assumed-role/stream-reader/{name}")


class Counting(RecordProcessor):
    def process_records(self, process_records_input):
        process_records_input.checkpointer.checkpoint()


@pytest.mark.emulator
@pytest.mark.timeout(120)
def test_assumed_role_credentials_are_refreshed_during_a_run(
        aws_env, dynamodb, make_stream, make_config, put_records, caplog):
    """moto's STS (real HTTP) is asked again once less than the refresh margin is left.

    Sessions last 900 s (STS' minimum) and are refreshed when fewer than 898 s are left, so
    a run of a few seconds must assume the role again, and keep reading with the new keys.
    """
    stream = make_stream(1)
    config = make_config(stream, **role_settings(dynamodb, sts_refresh_margin_s=898))
    caplog.set_level(logging.INFO, logger="kinesis_dstream.aws.clients")
    scheduler = Scheduler(config, lambda shard_id: Counting())

    def assumed() -> int:
        return sum("assumed role" in r.getMessage() for r in caplog.records)

    def read() -> int:
        return sum(s.records for s in scheduler.metrics().values())

    assert assumed() == 1  # its Kinesis and DynamoDB clients, made already, share one session
    scheduler.start()
    try:
        at_start = assumed()
        put_records(stream, [f"first-{i}" for i in range(5)])
        wait_for(lambda: read() == 5, 30, "the first records")
        wait_for(lambda: assumed() > at_start + 1, 30, "a refresh of the role's credentials")
        put_records(stream, [f"second-{i}" for i in range(5)])
        wait_for(lambda: read() == 10, 30, "records read with refreshed credentials")
    finally:
        scheduler.shutdown()


@pytest.mark.emulator
def test_secrets_appear_in_no_log_line_output_or_worker_stderr(
        aws_env, kinesis_local, dynamodb, make_stream, make_config, put_records, tmp_path,
        caplog, capsys):
    secret = "kd-secret-" + uuid.uuid4().hex
    stream = make_stream(1)
    put_records(stream, [f"r{i}" for i in range(5)])
    config = make_config(stream, aws_secret_key=secret, metrics_level="SUMMARY",
                         cloudwatch_endpoint=dynamodb, **role_settings(dynamodb))
    # Ours at DEBUG, everything else at INFO: botocore's own DEBUG lines dump whole STS
    # responses, keys included (README: never enable botocore DEBUG in production).
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="kinesis_dstream")
    tokens: list[str] = []

    # In process: a run, its config's repr, and errors that carry the config's values.
    scheduler = Scheduler(config, lambda shard_id: Counting())
    scheduler.start()
    try:
        wait_for(lambda: sum(s.records for s in scheduler.metrics().values()) == 5, 30,
                   "records")
        credentials = scheduler.kinesis._client._request_signer._credentials
        tokens += [credentials.get_frozen_credentials().secret_key,
                   credentials.get_frozen_credentials().token]
        logging.getLogger("test").info("config: %r / %s", config, config)
    finally:
        scheduler.shutdown()
    bad = config.replace(stream_name="no-such-" + uuid.uuid4().hex[:8])
    with pytest.raises(Exception) as info:  # noqa: PT011 - only its text matters here
        Scheduler(bad, lambda shard_id: Counting()).start()
    error_text = f"{info.value!r} {info.value}"

    # As a process: its whole stderr, from start to a graceful stop.
    put_records(stream, [f"p{i}" for i in range(5)])   # the run above checkpointed the rest
    log_path = tmp_path / "events.jsonl"
    worker = start_worker(config.replace(worker_id="secret-worker"), log_path, tmp_path, "w")
    try:
        wait_for(lambda: len([e for e in read_events(str(log_path)) if e["event"] == "record"])
                   >= 5 or worker.poll() is not None, 60, "the worker process to read")
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    finally:
        reap(worker)
    stderr = (tmp_path / "w.stderr").read_text()
    assert "started on stream" in stderr          # it did log
    captured = capsys.readouterr()
    everything = "\n".join([r.getMessage() for r in caplog.records] +
                           [captured.out, captured.err, error_text, stderr])
    for value in [secret, *filter(None, tokens)]:
        assert value not in everything


@pytest.mark.unit
def test_private_files_are_0600_and_written_by_rename(tmp_path):
    target = tmp_path / "worker.json"
    process.write_private(target, '{"a": 1}')
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    target.chmod(0o644)                       # a file already there is replaced, not reused
    process.write_private(target, '{"a": 2}')
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert json.loads(target.read_text()) == {"a": 2}
    assert os.listdir(tmp_path) == ["worker.json"]   # no temporary left behind


@pytest.mark.emulator
def test_files_left_by_a_killed_process_are_removed_at_the_next_start(tmp_path):
    """A child names a private file with its pid, is killed with -9; the next start cleans up."""
    script = ("import sys, time\n"
              "from kinesis_dstream.worker.process import private_path, write_private\n"
              "path = private_path(sys.argv[1])\n"
              "write_private(path, 'secret')\n"
              "print(path, flush=True)\n"
              "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        left = child.stdout.readline().strip()
        assert os.path.basename(left).startswith(process.PRIVATE_PREFIX + str(child.pid))
        live_mine = process.private_path(tmp_path)
        process.write_private(live_mine, "mine")
        other = tmp_path / "unrelated.json"
        other.write_text("{}")
        assert process.remove_stale_private_files(tmp_path) == []   # its owner still runs
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        reap(child)
        child.stdout.close()
    assert process.remove_stale_private_files(tmp_path) == [left]
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(live_mine), "unrelated.json"])


@pytest.mark.unit
def test_a_role_is_assumed_once_per_process_for_every_client_that_uses_it(monkeypatch):
    """The Kinesis, DynamoDB and CloudWatch clients of one role, of any stream, share one
    AssumeRole; another role, session name or STS endpoint is assumed on its own. The shared
    credentials sign every client. Bounded: past MAX_SHARED_ROLES the oldest goes."""
    from collections import OrderedDict

    import botocore.credentials

    from kinesis_dstream.aws import clients
    from kinesis_dstream.config import ConsumerConfig

    monkeypatch.setattr(clients, "_roles", OrderedDict())
    assumed: list[tuple[str | None, str | None, str | None]] = []

    def fake_assume(config, base):
        assumed.append((config.sts_assume_role_arn, config.sts_session_name,
                        config.sts_endpoint))
        return botocore.credentials.RefreshableCredentials(
            access_key=f"ASIA{len(assumed):016d}", secret_key="s", token="t",
            expiry_time=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1),
            refresh_using=lambda: {}, method="assume-role")

    monkeypatch.setattr(clients, "assumed_role_credentials", fake_assume)
    config = ConsumerConfig(application_name="app", stream_name="a", region_name="us-east-1",
                            kinesis_endpoint="http://127.0.0.1:9",
                            dynamodb_endpoint="http://127.0.0.1:9",
                            aws_access_key_id="AKIDBASE", aws_secret_key="base-secret",
                            sts_assume_role_arn=ROLE, sts_endpoint="http://127.0.0.1:9")
    made = [clients.make_client(config, "kinesis"), clients.make_client(config, "dynamodb"),
            clients.make_client(config, "cloudwatch"),
            clients.make_client(config.replace(stream_name="b"), "kinesis")]
    assert assumed == [(ROLE, None, "http://127.0.0.1:9")]
    assert {c._request_signer._credentials.get_frozen_credentials().access_key
            for c in made} == {"ASIA0000000000000001"}
    clients.make_client(config.replace(sts_session_name="other"), "kinesis")
    clients.make_client(config.replace(sts_assume_role_arn=ROLE + "-2"), "kinesis")
    clients.make_client(config.replace(sts_endpoint="http://127.0.0.1:10"), "kinesis")
    clients.make_client(config.replace(aws_access_key_id="AKIDOTHER"), "kinesis")
    assert len(assumed) == 5
    clients.make_client(config, "kinesis")  # still the first
    assert len(assumed) == 5
    for n in range(clients.MAX_SHARED_ROLES + 1):
        clients.make_client(config.replace(sts_session_name=f"s-{n}"), "kinesis")
    assert len(clients._roles) == clients.MAX_SHARED_ROLES
