"""Shared fixtures: emulators (one of each per session, started on first use), names, producers.

Emulator fixtures give endpoint URLs. Each emulator starts only when a test asks for it and is
stopped at session end, failures included; the children also exit by themselves if pytest is
killed. Helpers live in tests/emulators.py (``from emulators import ...``).

Quick reference:
    kinesis_local, kinesalite, dynamodb (moto server), dynalite  -> "http://127.0.0.1:PORT"
    aws_env          dummy credentials + region in os.environ (function scope)
    local_env        aws_env plus AWS_ENDPOINT_URL_KINESIS/DYNAMODB -> kinesis_local/dynamodb
    kinesis_client, dynamodb_client     boto3 clients on kinesis_local / dynamodb
    make_stream(n_shards, endpoint=None, prefix=None) -> name   (ACTIVE; deleted at teardown)
    put_records(stream, records, endpoint=None) -> [PutResult]
    put_aggregated(stream, records, per_aggregate=100, endpoint=None) -> [AggregatedPut]
    unique_app_name  -> a fresh application (= lease table) name; table deleted at teardown
    make_config(stream, **overrides) -> ConsumerConfig with short timings on these endpoints
    make_fault_proxy(share=0.5, upstream=None, limits=None) -> FaultProxy in front of kinesis_local
    make_fanout_front(lifetime_s=20, heartbeat_s=1, upstream=None, **settings)
                     -> FaultyFanOutFront (SubscribeToShard for boto3) in front of kinesis_local
"""
from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import emulators  # noqa: E402
from emulators import AggregatedPut, PutResult, RecordSpec  # noqa: E402
from fanout_faults import FaultyFanOutFront  # noqa: E402
from fault_proxy import FaultProxy, ShardLimits  # noqa: E402

from kinesis_dstream.config import ConsumerConfig  # noqa: E402
from kinesis_dstream.local import (  # noqa: E402
    DUMMY_ACCESS_KEY_ID,
    DUMMY_REGION,
    DUMMY_SECRET_ACCESS_KEY,
    Emulator,
    free_port,
)

# Every JVM the tests start (Spark's driver and executors, here and in the drivers tests start
# as subprocesses; the Java KCL oracles, which also set these flags themselves) compiles with C1
# only and collects with one thread: on a 2-core machine C2's compiler threads and the parallel
# collector's were half the suite's CPU (test_spark_executors.py and test_spark_stream.py, one
# worker: 129 -> 62 core-seconds, 93 -> 72 s). Tests show behaviour, not the JVM's peak speed;
# bench/ never sets it. The `java` launcher prints a NOTE line on stderr for it.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("JDK_JAVA_OPTIONS", TEST_JVM_OPTIONS)

_started: dict[str, Emulator] = {}


def _stop_all() -> None:
    for emulator in list(_started.values()):
        emulator.stop()
    _started.clear()


atexit.register(_stop_all)  # belt and braces; the fixtures below stop them first


def _emulator(kind: str) -> Iterator[str]:
    emulator = Emulator(kind)
    _started[kind] = emulator
    try:
        emulator.start(timeout=90)
        yield emulator.endpoint
    finally:
        emulator.stop()
        _started.pop(kind, None)


@pytest.fixture(scope="session")
def kinesis_local() -> Iterator[str]:
    """kinesis-local (kinesis-mock): the faithful Kinesis, for behaviour tests."""
    yield from _emulator("kinesis-local")


@pytest.fixture(scope="session")
def kinesalite() -> Iterator[str]:
    """kinesalite: fast, for volume; MillisBehindLatest is always 0 and no ChildShards."""
    yield from _emulator("kinesalite")


@pytest.fixture(scope="session")
def dynamodb() -> Iterator[str]:
    """moto server: the complete DynamoDB (transactions, ReturnValuesOnConditionCheckFailure)."""
    yield from _emulator("moto")


@pytest.fixture(scope="session")
def dynalite() -> Iterator[str]:
    """dynalite: a faster DynamoDB lacking TransactWriteItems and a few newer options."""
    yield from _emulator("dynalite")


_AWS_VARS_TO_CLEAR = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                      "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_KINESIS", "AWS_ENDPOINT_URL_DYNAMODB",
                      "AWS_ENDPOINT_URL_CLOUDWATCH")


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Dummy credentials and region in os.environ (children inherit them); nothing else AWS."""
    for name in _AWS_VARS_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)
    values = {
        "AWS_ACCESS_KEY_ID": DUMMY_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET_ACCESS_KEY,
        "AWS_DEFAULT_REGION": DUMMY_REGION,
        "AWS_REGION": DUMMY_REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
        # Nothing leaves this machine: a consumer left at metricsLevel DETAILED without a
        # CloudWatch endpoint publishes to a closed loopback port, not to AWS.
        "AWS_ENDPOINT_URL_CLOUDWATCH": "http://127.0.0.1:9",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


@pytest.fixture
def local_env(aws_env: dict[str, str], kinesis_local: str, dynamodb: str,
              monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """aws_env plus the standard endpoint variables, as `kinesis-dstream local` prints them.

    moto's server (the dynamodb fixture) also serves CloudWatch.
    """
    values = dict(aws_env, AWS_ENDPOINT_URL_KINESIS=kinesis_local,
                  AWS_ENDPOINT_URL_DYNAMODB=dynamodb, AWS_ENDPOINT_URL_CLOUDWATCH=dynamodb)
    for name in ("AWS_ENDPOINT_URL_KINESIS", "AWS_ENDPOINT_URL_DYNAMODB",
                 "AWS_ENDPOINT_URL_CLOUDWATCH"):
        monkeypatch.setenv(name, values[name])
    return values


@pytest.fixture
def kinesis_client(kinesis_local: str) -> Any:
    return emulators.client("kinesis", kinesis_local)


@pytest.fixture
def dynamodb_client(dynamodb: str) -> Any:
    return emulators.client("dynamodb", dynamodb)


def _test_prefix(request: pytest.FixtureRequest, default: str) -> str:
    name = getattr(request.node, "originalname", None) or request.node.name
    return (name.removeprefix("test_") or default)[:30]


@pytest.fixture
def make_stream(request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """make_stream(n_shards, endpoint=None, prefix=None) -> a new ACTIVE stream's name.

    endpoint None means kinesis-local (started on first use). Streams are deleted at teardown.
    """
    created: list[tuple[str, str]] = []

    def make(n_shards: int = 1, endpoint: str | None = None, prefix: str | None = None) -> str:
        endpoint = endpoint or request.getfixturevalue("kinesis_local")
        name = emulators.unique_name(prefix or _test_prefix(request, "stream"))
        created.append((endpoint, name))
        emulators.create_stream(endpoint, name, n_shards)
        return name

    yield make
    for endpoint, name in created:
        emulators.delete_stream(endpoint, name)


@pytest.fixture
def put_records(request: pytest.FixtureRequest) -> Callable[..., list[PutResult]]:
    """put_records(stream, records, endpoint=None); records are bytes/str or (key, data)."""

    def put(stream: str, records: list[RecordSpec], endpoint: str | None = None) -> list[PutResult]:
        endpoint = endpoint or request.getfixturevalue("kinesis_local")
        return emulators.put_records(endpoint, stream, records)

    return put


@pytest.fixture
def put_aggregated(request: pytest.FixtureRequest) -> Callable[..., list[AggregatedPut]]:
    """put_aggregated(stream, records, per_aggregate=100, endpoint=None): KPL aggregates."""

    def put(stream: str, records: list[RecordSpec], per_aggregate: int = 100,
            endpoint: str | None = None) -> list[AggregatedPut]:
        endpoint = endpoint or request.getfixturevalue("kinesis_local")
        return emulators.put_aggregated(endpoint, stream, records, per_aggregate)

    return put


@pytest.fixture
def unique_app_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh application name; its lease table is dropped from moto (if started) afterwards."""
    name = emulators.unique_name("app-" + _test_prefix(request, "app"))
    yield name
    moto = _started.get("moto")
    if moto is not None and moto.process is not None:
        ddb = emulators.client("dynamodb", moto.endpoint)
        for table in (name, f"{name}-WorkerMetricStats", f"{name}-CoordinatorState",
                      f"{name}-kinesis-dstream-ranges"):
            try:
                ddb.delete_table(TableName=table)
            except ddb.exceptions.ResourceNotFoundException:
                pass


@pytest.fixture
def make_config(kinesis_local: str, dynamodb: str,
                unique_app_name: str) -> Callable[..., ConsumerConfig]:
    """make_config(stream, **overrides) -> ConsumerConfig on kinesis-local + moto.

    Short timings so lease and shard tests finish in seconds; TRIM_HORIZON so records put
    before the worker starts are read. Overrides are ConsumerConfig field names.
    """

    def make(stream: str, **overrides: Any) -> ConsumerConfig:
        settings: dict[str, Any] = dict(
            application_name=unique_app_name,
            stream_name=stream,
            region_name=DUMMY_REGION,
            kinesis_endpoint=kinesis_local,
            dynamodb_endpoint=dynamodb,
            aws_access_key_id=DUMMY_ACCESS_KEY_ID,
            aws_secret_key=DUMMY_SECRET_ACCESS_KEY,
            initial_position="TRIM_HORIZON",
            failover_time_ms=3000,
            idle_time_between_reads_ms=100,
            shard_sync_interval_ms=2000,
            parent_shard_poll_interval_ms=200,
            checkpoint_interval_ms=1000,
            shutdown_grace_ms=5000,
            metrics_level="NONE",
        )
        settings.update(overrides)
        return ConsumerConfig(**settings)

    return make


@pytest.fixture
def make_fault_proxy(request: pytest.FixtureRequest) -> Iterator[Callable[..., FaultProxy]]:
    """make_fault_proxy(share=0.5, upstream=None, seed=None, limits=None) -> a started FaultProxy.

    It answers ``share`` of GetRecords calls with ProvisionedThroughputExceededException and
    forwards the rest to ``upstream`` (kinesis-local by default); stopped at teardown. With
    ``limits`` (a ShardLimits) it also enforces Kinesis' per-shard read limits.
    """
    proxies: list[FaultProxy] = []

    def make(share: float = 0.5, upstream: str | None = None, seed: int | None = None,
             limits: ShardLimits | None = None) -> FaultProxy:
        upstream = upstream or request.getfixturevalue("kinesis_local")
        proxy = FaultProxy(upstream, share=share, seed=seed, limits=limits).start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()


@pytest.fixture
def make_fanout_front(request: pytest.FixtureRequest) -> Iterator[Callable[..., FaultyFanOutFront]]:
    """make_fanout_front(lifetime_s=20, heartbeat_s=1, upstream=None, **settings) -> a started
    FaultyFanOutFront: kinesis-local (by default) with SubscribeToShard served to boto3.

    Its ``endpoint`` takes every Kinesis call. Short lifetimes and heartbeats keep tests
    quick; ``settings`` are FanOutFront's (poll_interval_s, read_bytes_per_s, ...). The
    existing fixtures' emulators stay without a front. Stopped at teardown.
    """
    fronts: list[FaultyFanOutFront] = []

    def make(lifetime_s: float = 20.0, heartbeat_s: float = 1.0, upstream: str | None = None,
             **settings: Any) -> FaultyFanOutFront:
        upstream = upstream or request.getfixturevalue("kinesis_local")
        front = FaultyFanOutFront(upstream, lifetime_s=lifetime_s, heartbeat_s=heartbeat_s,
                                  **settings).start()
        fronts.append(front)
        return front

    yield make
    for front in fronts:
        front.stop()


@pytest.fixture
def env(aws_env: dict[str, str], kinesis_local: str, dynamodb: str) -> dict[str, str]:
    """The emulators' endpoints as the Spark helpers take them, AWS variables set."""
    return dict(kinesis=kinesis_local, dynamodb=dynamodb)


@pytest.fixture
def daemons() -> Iterator[list[Any]]:
    """The daemons a test started (anything with ``kill()``): killed at teardown."""
    started: list[Any] = []
    yield started
    for daemon in started:
        daemon.kill()


@pytest.fixture(scope="session")
def sc() -> Iterator[Any]:
    """The session's one SparkContext; a process can hold only one, so every Spark test
    module shares it and stops its StreamingContexts with stopSparkContext=False.

    The UI is on (a free loopback port): tests read Spark's REST API.
    Master ``local-cluster[2,1,1024]``: two executor JVMs in processes of their own, so every
    Spark test reads Kinesis where a cluster would, on executors. Executors inherit the
    driver's environment when they start: the emulators' dummy credentials and region are
    set before, as ``spark.executorEnv.*`` or an instance profile would on a cluster.
    """

    from pyspark import SparkConf, SparkContext

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", DUMMY_ACCESS_KEY_ID)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", DUMMY_SECRET_ACCESS_KEY)
    os.environ.setdefault("AWS_DEFAULT_REGION", DUMMY_REGION)
    conf = (SparkConf().setMaster(SPARK_MASTER).setAppName("kinesis-dstream-tests")
            .set("spark.ui.enabled", "true").set("spark.ui.port", str(free_port()))
            .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.ui.showConsoleProgress", "false")
            .set("spark.executorEnv.PYSPARK_PYTHON", sys.executable))
    context = SparkContext(conf=conf)
    context.setLogLevel("WARN")
    yield context
    context.stop()


SPARK_MASTER = "local-cluster[2,1,1024]"


@pytest.fixture(scope="module")
def spark(sc: Any) -> Iterator[Any]:
    """A SparkSession on the session's SparkContext, with our data sources registered (by
    name, as a user's ``register`` call does) and two shuffle partitions (tests are small)."""
    from pyspark.sql import SparkSession

    from kinesis_dstream.sql.datasource import register

    session = SparkSession(sc)
    session.conf.set("spark.sql.shuffle.partitions", "2")
    register(session)  # pyspark 4.0 refuses a name its lookup found
    yield session


# ---- test tiers (setup.cfg registers the markers; `make test-fast` runs the unit tier) ----
TIERS = ("unit", "emulator", "spark")
# Fixtures that start (or lazily reach) an emulator, and the session's SparkContext. A
# Spark test may use emulators too; a unit test uses neither, an emulator test no Spark.
EMULATOR_FIXTURES = frozenset({
    "kinesis_local", "kinesalite", "dynamodb", "dynalite", "local_env", "kinesis_client",
    "dynamodb_client", "make_stream", "put_records", "put_aggregated", "make_config",
    "make_fault_proxy", "make_fanout_front"})
SPARK_FIXTURES = frozenset({"sc", "spark"})


def tier_errors(items: list[pytest.Item]) -> list[str]:
    """Why each mislabelled test's tier is wrong: none or several of TIERS, or a fixture its
    tier rules out (a label that says less than the test needs)."""
    errors = []
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t) is not None]
        fixtures = set(getattr(item, "fixturenames", ()))
        if len(tiers) != 1:
            errors.append(f"{item.nodeid}: needs exactly one tier marker of {', '.join(TIERS)}"
                          f" (has {', '.join(tiers) or 'none'})")
        elif tiers[0] == "unit" and fixtures & (EMULATOR_FIXTURES | SPARK_FIXTURES):
            errors.append(f"{item.nodeid}: marked unit but uses "
                          f"{', '.join(sorted(fixtures & (EMULATOR_FIXTURES | SPARK_FIXTURES)))}")
        elif tiers[0] == "emulator" and fixtures & SPARK_FIXTURES:
            errors.append(f"{item.nodeid}: marked emulator but uses "
                          f"{', '.join(sorted(fixtures & SPARK_FIXTURES))}")
    return errors


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request: pytest.FixtureRequest,
                                 monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A unit test starts no process: no emulator, no server, no Spark JVM (each goes
    through subprocess.Popen). The attempt is refused, and the test fails naming it."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    attempts: list[str] = []
    popen_init = subprocess.Popen.__init__

    def refuse(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        attempts.append(str(args)[:200])
        raise RuntimeError(f"a test marked unit started a process: {args!r:.200}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
    monkeypatch.setattr(subprocess.Popen, "__init__", popen_init)
    if attempts:
        pytest.fail(f"{request.node.nodeid}: marked unit but starts a process: {attempts[0]}",
                    pytrace=False)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: an unmarked test never slips through
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    errors = tier_errors(items)
    if errors:
        raise pytest.UsageError("tests with a wrong tier:\n  " + "\n  ".join(errors))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Fixture teardown has normally stopped them; this covers an interrupted session.
    _stop_all()


# .ci/run names a file here: each failed test's id and the line of its error, collected
# across every pytest pass of a step, which .ci/run prints last (the CI's report shows the
# log's start and its end, and a failure's own traceback may fall between them).
FAILURE_LOG = os.environ.get("KD_FAILURE_LOG")
FAILURE_TEXT_CHARS = 1500


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not FAILURE_LOG or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # xdist's controller sees every worker's reports: it writes them once
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    where = f" ({crash.path.rsplit('/', 1)[-1]}:{crash.lineno})" if crash is not None else ""
    with open(FAILURE_LOG, "a", encoding="utf-8") as out:
        out.write(f"FAILED {report.nodeid} [{report.when}]{where}: "
                  f"{text[:FAILURE_TEXT_CHARS]}\n")
