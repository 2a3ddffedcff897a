"""`python -m kinesis_dstream multilang` running amazon-kclpy's own sample app, unmodified,
against kinesis-local and moto's DynamoDB server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import emulators
from processes import reap

TESTS_DIR = Path(__file__).resolve().parent
RECORDER = TESTS_DIR / "kclpy_sample_recorder.py"


def write_properties(tmp_path: Path, stream: str, app: str, kinesis: str, dynamodb: str,
                     **extra: str) -> Path:
    lines = {
        "executableName": str(RECORDER),
        "streamName": stream,
        "applicationName": app,
        "AWSCredentialsProvider": "DefaultAWSCredentialsProviderChain",
        "processingLanguage": "python/3",
        "regionName": "us-east-1",
        "initialPositionInStream": "TRIM_HORIZON",
        # without a scheme on purpose: the reader adds http:// for loopback hosts
        "kinesisEndpoint": kinesis.removeprefix("http://"),
        "dynamoDBEndpoint": dynamodb,
        "metricsLevel": "NONE",
        "retrievalMode": "POLLING",
        "failoverTimeMillis": "3000",
        "shardSyncIntervalMillis": "2000",
        "idleTimeBetweenReadsInMillis": "100",
        "parentShardPollIntervalMillis": "200",
        "shutdownGraceMillis": "15000",
        "timeoutInSeconds": "30",
        **extra,
    }
    path = tmp_path / f"{app}.properties"
    path.write_text("# written by test_multilang_daemon\n"
                    + "".join(f"{k} = {v}\n" for k, v in lines.items()))
    return path


class Daemon:
    def __init__(self, properties: Path, tmp_path: Path, name: str, **env: str):
        self.stderr_path = tmp_path / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kinesis_dstream", "multilang", "--properties-file",
             str(properties)],
            env=dict(os.environ, **env), stdout=subprocess.DEVNULL, stderr=self._stderr)

    def stop(self, timeout: float = 40.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._stderr.close()

    def kill(self) -> None:
        reap(self.proc)
        self._stderr.close()

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_records(path: Path, wanted: set[str], daemon: Daemon, timeout: float = 90.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        seen = read_log(path)
        if wanted <= {r["seq"] for r in seen}:
            return seen
        if daemon.proc.poll() is not None:
            pytest.fail(f"daemon exited with {daemon.proc.returncode}:\n{daemon.log()[-4000:]}")
        if time.monotonic() > deadline:
            missing = wanted - {r["seq"] for r in seen}
            pytest.fail(f"{len(missing)} of {len(wanted)} records never reached the sample app; "
                        f"daemon log:\n{daemon.log()[-4000:]}")
        time.sleep(0.3)


def expected_order(puts, shard_id: str) -> list[str]:
    return sorted((p.sequence_number for p in puts if p.shard_id == shard_id), key=int)


def replays_in_order(got: list[str], expected: list[str]) -> int:
    """Check ``got`` is ``expected`` in order, allowing steps back (replays); count them.

    Each record comes right after the one before it in ``expected``, or is a step back to an
    earlier one (a restart from the checkpoint); never a gap, never out of order, and every
    record is reached.
    """
    position = {seq: i for i, seq in enumerate(expected)}
    previous, furthest, steps_back = -1, -1, 0
    for seq in got:
        index = position[seq]
        if index <= previous:
            steps_back += 1
        else:
            assert index <= furthest + 1, f"gap before {seq}: {got}"
            assert index == previous + 1, f"{seq} out of order after {expected[previous]}"
        previous, furthest = index, max(furthest, index)
    assert furthest == len(expected) - 1, "not every record was delivered"
    return steps_back


def lease_items(dynamodb: str, table: str) -> dict[str, dict]:
    items = emulators.client("dynamodb", dynamodb).scan(TableName=table, ConsistentRead=True)["Items"]
    return {item["leaseKey"]["S"]: item for item in items}


def last_put_per_shard(puts) -> dict[str, str]:
    last: dict[str, str] = {}
    for put in puts:
        if put.shard_id not in last or int(put.sequence_number) > int(last[put.shard_id]):
            last[put.shard_id] = put.sequence_number
    return last


@pytest.mark.emulator
@pytest.mark.timeout(240)
def test_sample_kclpy_app_processes_every_record_checkpoints_and_resumes(
        aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name, tmp_path,
        daemons):
    stream = make_stream(4)
    first = put_records(stream, [f"first-{i}".encode() for i in range(400)])
    assert len({p.shard_id for p in first}) == 4
    properties = write_properties(tmp_path, stream, unique_app_name, kinesis_local, dynamodb)

    # Run 1: every record reaches the sample; SIGTERM -> shutdownRequested -> it checkpoints.
    log1 = tmp_path / "run1.jsonl"
    daemon = Daemon(properties, tmp_path, "run1", KCLPY_RECORD_LOG=str(log1))
    daemons.append(daemon)
    seen = wait_for_records(log1, {p.sequence_number for p in first}, daemon)
    assert {(r["seq"], r["data"]) for r in seen} == {(p.sequence_number, p.data.decode())
                                                     for p in first}
    assert daemon.stop() == 0, daemon.log()[-4000:]

    items = lease_items(dynamodb, unique_app_name)
    assert set(items) == {p.shard_id for p in first}
    for shard_id, sequence_number in last_put_per_shard(first).items():
        assert items[shard_id]["checkpoint"]["S"] == sequence_number
        assert items[shard_id]["checkpointSubSequenceNumber"]["N"] == "0"
        assert "leaseOwner" not in items[shard_id]  # released on graceful shutdown
    log_text = daemon.log()
    assert "Shutdown has been requested, checkpointing." in log_text  # the sample's own stderr

    # Run 2: resumes from those checkpoints; only new records are delivered.
    second = put_records(stream, [f"second-{i}".encode() for i in range(100)])
    log2 = tmp_path / "run2.jsonl"
    daemon = Daemon(properties, tmp_path, "run2", KCLPY_RECORD_LOG=str(log2))
    daemons.append(daemon)
    wait_for_records(log2, {p.sequence_number for p in second}, daemon)
    assert daemon.stop() == 0, daemon.log()[-4000:]
    # Stopped: whatever it delivered is in the log, so a replay of run 1 would show here.
    seen2 = read_log(log2)
    for shard_id in {p.shard_id for p in second}:
        assert [r["seq"] for r in seen2 if r["shard"] == shard_id] == \
            expected_order(second, shard_id)
    assert len(seen2) == len(second)
    items = lease_items(dynamodb, unique_app_name)
    for shard_id, sequence_number in last_put_per_shard(first + second).items():
        assert items[shard_id]["checkpoint"]["S"] == sequence_number


@pytest.mark.emulator
@pytest.mark.timeout(180)
@pytest.mark.parametrize("failure, evidence", [("CRASH", "exit code 7"),
                                               ("HANG", "no answer from the child for 2 s")])
def test_a_child_that_exits_or_hangs_mid_batch_is_restarted_and_nothing_is_lost(
        aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name, tmp_path,
        daemons, failure, evidence):
    stream = make_stream(2)
    puts = put_records(stream, [f"rec-{i}".encode() for i in range(200)])
    properties = write_properties(tmp_path, stream, unique_app_name, kinesis_local, dynamodb,
                                  maxRecords="25", timeoutInSeconds="2")
    log = tmp_path / "records.jsonl"
    marker = tmp_path / "failed-once"
    daemon = Daemon(properties, tmp_path, failure.lower(), KCLPY_RECORD_LOG=str(log),
                    **{f"KCLPY_{failure}_MARKER": str(marker)})
    daemons.append(daemon)
    seen = wait_for_records(log, {p.sequence_number for p in puts}, daemon)
    assert marker.exists()  # one child did fail mid-batch
    assert evidence in daemon.log() and "restarts from its last checkpoint" in daemon.log()
    # Per shard, the records reached the sample in order: ascending without a gap, except
    # that the restarted child starts again from its shard's last checkpoint (a step back).
    steps_back = 0
    for shard_id in {p.shard_id for p in puts}:
        expected = expected_order(puts, shard_id)
        got = [r["seq"] for r in seen if r["shard"] == shard_id]
        steps_back += replays_in_order(got, expected)
    assert steps_back <= 1  # only the one child that failed went back
    assert daemon.stop() == 0, daemon.log()[-4000:]


@pytest.mark.emulator
def test_bad_properties_file_exits_2_naming_the_key(tmp_path, aws_env):
    path = tmp_path / "bad.properties"
    path.write_text(f"executableName = {RECORDER}\nstreamName = s\napplicationName = a\n"
                    "maxRecords = many\n")
    proc = subprocess.run([sys.executable, "-m", "kinesis_dstream", "multilang",
                           "--properties-file", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "maxRecords" in proc.stderr and "'many'" in proc.stderr


@pytest.mark.emulator
@pytest.mark.timeout(180)
def test_shard_split_sample_checkpoints_shard_end_and_children_follow(
        aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name, tmp_path,
        daemons, make_fault_proxy):
    proxy = make_fault_proxy(share=0.0)  # counts ListShards: the shard syncs
    stream = make_stream(1)
    before = put_records(stream, [f"before-{i}".encode() for i in range(50)])
    properties = write_properties(tmp_path, stream, unique_app_name, proxy.endpoint, dynamodb,
                                  cleanupLeasesUponShardCompletion="false")
    log = tmp_path / "records.jsonl"
    daemon = Daemon(properties, tmp_path, "split", KCLPY_RECORD_LOG=str(log),
                    KCLPY_CHECKPOINT_FREQ_S="0")
    daemons.append(daemon)
    wait_for_records(log, {p.sequence_number for p in before}, daemon)

    kinesis = emulators.client("kinesis", kinesis_local)
    parent = before[0].shard_id
    kinesis.split_shard(StreamName=stream, ShardToSplit=parent,
                        NewStartingHashKey=str(2 ** 127))
    emulators.wait_stream_active(kinesis, stream)
    after = put_records(stream, [f"after-{i}".encode() for i in range(100)])
    assert parent not in {p.shard_id for p in after}
    seen = wait_for_records(log, {p.sequence_number for p in before + after}, daemon)

    # The sample's shard_ended called checkpoint() -> SHARD_END; every parent record came
    # before any child record. With cleanupLeasesUponShardCompletion false the parent's lease
    # stays, also after its children have checkpointed and shard syncs have run since.
    children = {p.shard_id for p in after}
    wait_until(lambda: all(started(lease_items(dynamodb, unique_app_name).get(c, {}))
                           for c in children), "the children never checkpointed", daemon)
    syncs = proxy.calls[("ListShards", "")]
    wait_until(lambda: proxy.calls[("ListShards", "")] >= syncs + 2, "no shard sync", daemon)
    items = lease_items(dynamodb, unique_app_name)
    assert items[parent]["checkpoint"]["S"] == "SHARD_END"
    order = [r["shard"] for r in seen]
    assert max(i for i, s in enumerate(order) if s == parent) < \
        min(i for i, s in enumerate(order) if s != parent)
    assert "Shard has ended checkpointing" in daemon.log()
    assert daemon.stop() == 0, daemon.log()[-4000:]


@pytest.mark.emulator
@pytest.mark.timeout(180)
def test_two_daemons_share_the_shards_and_lease_lost_reaches_the_sample(
        aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name, tmp_path,
        daemons):
    stream = make_stream(4)
    puts = put_records(stream, [f"r-{i}".encode() for i in range(200)])
    properties = write_properties(tmp_path, stream, unique_app_name, kinesis_local, dynamodb)
    log = tmp_path / "records.jsonl"
    first = Daemon(properties, tmp_path, "first", KCLPY_RECORD_LOG=str(log))
    daemons.append(first)
    wait_for_records(log, {p.sequence_number for p in puts}, first)
    second = Daemon(properties, tmp_path, "second", KCLPY_RECORD_LOG=str(log))
    daemons.append(second)

    deadline = time.monotonic() + 60
    while True:
        owners = [item.get("leaseOwner", {}).get("S")
                  for item in lease_items(dynamodb, unique_app_name).values()]
        if len(set(owners)) == 2 and None not in owners and \
                sorted(owners.count(o) for o in set(owners)) == [2, 2]:
            break
        assert time.monotonic() < deadline, f"shards never split 2/2: {owners}"
        time.sleep(0.5)
    # The stolen shards' children in the first daemon got leaseLost.
    deadline = time.monotonic() + 20
    while "Lease has been lost" not in first.log():
        assert time.monotonic() < deadline, first.log()[-4000:]
        time.sleep(0.3)

    more = put_records(stream, [f"more-{i}".encode() for i in range(100)])
    seen = wait_for_records(log, {p.sequence_number for p in more}, second)
    assert {p.sequence_number for p in puts + more} <= {r["seq"] for r in seen}
    assert first.stop() == 0 and second.stop() == 0


def assumed_roles_at_moto(moto: str) -> list[dict]:
    """The sessions moto's STS has handed out (its /moto-api/ state dump)."""
    with urllib.request.urlopen(f"{moto}/moto-api/data.json", timeout=10) as answer:
        state = json.load(answer)
    return [role for roles in state.get("sts", {}).values() for role in roles]


def wait_until(condition, what: str, daemon: Daemon, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if daemon.proc.poll() is not None:
            pytest.fail(f"daemon exited with {daemon.proc.returncode}:\n{daemon.log()[-4000:]}")
        assert time.monotonic() < deadline, f"{what}; daemon log:\n{daemon.log()[-4000:]}"
        time.sleep(0.3)


def started(item: dict) -> bool:
    return item.get("checkpoint", {}).get("S") not in (None, "TRIM_HORIZON", "LATEST",
                                                       "AT_TIMESTAMP")


@pytest.mark.emulator
@pytest.mark.timeout(240)
def test_sample_runs_as_an_assumed_role_and_a_finished_shards_lease_goes_once_children_start(
        aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name, tmp_path,
        daemons, make_fault_proxy):
    """amazon-kclpy's sample, from a file whose AWSCredentialsProvider is the KCL's STS form:
    every Kinesis call reaches kinesis-local signed with the session moto's STS handed out
    for that role and session name, never with the environment's keys. After a split, the
    parent's lease is deleted once both children have checkpointed (the KCL's default
    cleanupLeasesUponShardCompletion), and no lease is created for it again."""
    role = f"arn:aws:iam::123456789012:role/{unique_app_name[:40]}"
    session = f"kd-{unique_app_name[-20:]}"
    proxy = make_fault_proxy(share=0.0)  # counts who signed each call
    stream = make_stream(1)
    before = put_records(stream, [f"before-{i}".encode() for i in range(30)])
    properties = write_properties(
        tmp_path, stream, unique_app_name, proxy.endpoint, dynamodb,
        AWSCredentialsProvider=f"KclStsAssumeRoleCredentialsProvider|{role}|{session}")
    log = tmp_path / "records.jsonl"
    daemon = Daemon(properties, tmp_path, "role", KCLPY_RECORD_LOG=str(log),
                    KCLPY_CHECKPOINT_FREQ_S="0", AWS_ENDPOINT_URL_STS=dynamodb)
    daemons.append(daemon)
    wait_for_records(log, {p.sequence_number for p in before}, daemon)

    kinesis = emulators.client("kinesis", kinesis_local)
    parent = before[0].shard_id
    kinesis.split_shard(StreamName=stream, ShardToSplit=parent, NewStartingHashKey=str(2 ** 127))
    emulators.wait_stream_active(kinesis, stream)
    after = put_records(stream, [f"after-{i}".encode() for i in range(60)])
    children = {p.shard_id for p in after}
    assert len(children) == 2 and parent not in children
    wait_for_records(log, {p.sequence_number for p in before + after}, daemon)

    # The parent's lease goes once both children have checkpointed; theirs stay.
    wait_until(lambda: parent not in lease_items(dynamodb, unique_app_name),
               "the finished parent's lease was never deleted", daemon)
    syncs = proxy.calls[("ListShards", "")]
    items = lease_items(dynamodb, unique_app_name)
    assert set(items) == children and all(started(items[c]) for c in children)
    assert f"deleted lease {parent}" in daemon.log()

    # Signed as the role: the session moto's STS handed out for it, never the env's keys.
    kinesis_signers = {key for (_, key) in proxy.signers}  # the proxy fronts Kinesis only
    assert {op for (op, _) in proxy.signers} >= {"GetRecords", "ListShards"}, proxy.signers
    assert aws_env["AWS_ACCESS_KEY_ID"] not in kinesis_signers
    assert kinesis_signers and all(key.startswith("ASIA") for key in kinesis_signers)
    sessions = {role_["access_key_id"]: role_ for role_ in assumed_roles_at_moto(dynamodb)
                if role_.get("role_arn") == role}
    assert kinesis_signers <= set(sessions), (kinesis_signers, sorted(sessions))
    assert {sessions[key]["session_name"] for key in kinesis_signers} == {session}
    # One AssumeRole for the daemon's process, its Kinesis, DynamoDB and CloudWatch clients
    # alike (the file gives no other provider for them), not one a client.
    assert len(sessions) == 1, f"{len(sessions)} AssumeRole calls from one daemon process"
    assert session in daemon.log() and "ASIA" not in daemon.log()

    # Shard syncs after the deletion (each lists the shards, the closed parent included) do
    # not lease the parent again.
    wait_until(lambda: proxy.calls[("ListShards", "")] >= syncs + 2,
               "no shard sync after the deletion", daemon)
    more = put_records(stream, [f"more-{i}".encode() for i in range(20)])
    wait_for_records(log, {p.sequence_number for p in more}, daemon)
    assert parent not in lease_items(dynamodb, unique_app_name)
    assert not [r for r in read_log(log) if r["shard"] == parent and r["data"].startswith("more")]
    assert daemon.stop() == 0, daemon.log()[-4000:]


@pytest.mark.emulator
@pytest.mark.timeout(120)
def test_stream_arn_alone_names_the_stream_by_arn_in_every_kinesis_call(
        aws_env, kinesis_local, dynamodb, make_stream, put_records, unique_app_name, tmp_path,
        daemons, make_fault_proxy):
    proxy = make_fault_proxy(share=0.0)
    stream = make_stream(1)
    arn = emulators.client("kinesis", kinesis_local).describe_stream_summary(
        StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    puts = put_records(stream, [f"arn-{i}".encode() for i in range(20)])
    properties = write_properties(tmp_path, stream, unique_app_name, proxy.endpoint, dynamodb,
                                  streamArn=arn)
    text = properties.read_text()
    properties.write_text("\n".join(line for line in text.splitlines()
                                    if not line.startswith(("streamName", "regionName"))) + "\n")
    log = tmp_path / "records.jsonl"
    daemon = Daemon(properties, tmp_path, "arn", KCLPY_RECORD_LOG=str(log))
    daemons.append(daemon)
    wait_for_records(log, {p.sequence_number for p in puts}, daemon)
    assert daemon.stop() == 0, daemon.log()[-4000:]
    named = {op for (op, _) in proxy.calls if op in
             ("DescribeStreamSummary", "ListShards", "GetShardIterator", "GetRecords")}
    assert named == {"DescribeStreamSummary", "ListShards", "GetShardIterator", "GetRecords"}
    for operation in named:  # every call of each, by ARN
        assert proxy.by_arn[operation] == proxy.calls[(operation, "")], (operation, proxy.by_arn)


def processed_by(cloudwatch, namespace: str) -> float:
    """RecordsProcessed (operation ProcessTask) the daemon has published so far."""
    points = cloudwatch.get_metric_statistics(
        Namespace=namespace, MetricName="RecordsProcessed",
        Dimensions=[{"Name": "Operation", "Value": "ProcessTask"}],
        StartTime=time.time() - 600, EndTime=time.time() + 600, Period=60,
        Statistics=["Sum"])["Datapoints"]
    return sum(p["Sum"] for p in points)


@pytest.mark.emulator
@pytest.mark.timeout(120)
def test_shipped_sample_properties_run_the_bare_sample_on_the_harness_environment(
        local_env, make_stream, put_records, unique_app_name, tmp_path, daemons, dynamodb):
    """kcl_properties/sample_kclpy_app.properties as shipped (names made unique), endpoints
    from AWS_ENDPOINT_URL_* as `kinesis-dstream local` exports them, running the sample
    itself (`python -m samples.sample_kclpy_app`), which logs each record to stderr."""
    stream = make_stream(2)
    puts = put_records(stream, [f"bare-{i}".encode() for i in range(40)])
    shipped = (TESTS_DIR.parent / "kcl_properties" / "sample_kclpy_app.properties").read_text()
    text = shipped.replace("streamName = kclpysample", f"streamName = {stream}") \
                  .replace("applicationName = PythonKCLSample", f"applicationName = {unique_app_name}") \
                  .replace("metricsLevel = NONE", "metricsLevel = SUMMARY\nmetricsBufferTimeMillis = 200")
    assert text.count(stream) == 1 and text.count(unique_app_name) == 1
    assert "metricsLevel = SUMMARY" in text
    properties = tmp_path / "sample.properties"
    properties.write_text(text)
    daemon = Daemon(properties, tmp_path, "bare")
    daemons.append(daemon)
    # The sample's stderr has no newlines, so its record lines stay in the child's buffer
    # until it exits. The daemon's CloudWatch metrics (moto, from AWS_ENDPOINT_URL_CLOUDWATCH)
    # say when the children have processed every record: then stop and look.
    cloudwatch = emulators.client("cloudwatch", local_env["AWS_ENDPOINT_URL_CLOUDWATCH"])
    deadline = time.monotonic() + 60
    while processed_by(cloudwatch, unique_app_name) < len(puts):
        assert daemon.proc.poll() is None and time.monotonic() < deadline, daemon.log()[-3000:]
        time.sleep(0.3)
    assert daemon.stop() == 0, daemon.log()[-3000:]
    log_text = daemon.log()
    assert all(f"Sequence Number: {p.sequence_number}," in log_text for p in puts), log_text[-3000:]
    # SUMMARY: the application's lag under the KCL's name, with no shard dimension.
    from test_metrics import listed

    lag = listed(cloudwatch, unique_app_name)["MillisBehindLatest"]
    assert {"Operation": "ApplicationTracker"} in lag and all("ShardId" not in d for d in lag)
    items = lease_items(dynamodb, unique_app_name)
    for shard_id, sequence_number in last_put_per_shard(puts).items():
        assert items[shard_id]["checkpoint"]["S"] == sequence_number


@pytest.mark.unit
def test_the_order_check_rejects_reordering_gaps_and_missing_records():
    expected = ["1", "2", "3", "4"]
    assert replays_in_order(["1", "2", "3", "4"], expected) == 0
    assert replays_in_order(["1", "2", "3", "2", "3", "4"], expected) == 1   # a replay
    for got in (["2", "1", "3", "4"], ["1", "3", "2", "4"], ["1", "2", "4"], ["1", "2", "3"]):
        with pytest.raises(AssertionError):
            replays_in_order(got, expected)
