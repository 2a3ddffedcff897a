"""Pauses longer than Kinesis' 5 minutes (issue 37 part 4): every record once, no error.

Three pauses, each on polling and on fan-out:
- a SQL query with a 6-minute processing-time trigger;
- a DStream whose batch (its output operation) takes 6 minutes;
- a SQL query stopped for 6 minutes, then restarted from its checkpointLocation.

Kinesis expires a shard iterator 5 minutes after handing it out and ends a subscription after
5 minutes; the emulators do neither, so polling reads through a ``FaultProxy`` with
``iterator_ttl_s=300`` (an older iterator is answered ExpiredIteratorException) and fan-out
through a front whose subscriptions last 300 s. Each case also asserts that its pause crossed
that line: on polling, every iterator of its shards was over 300 s old when a SQL pause ended;
on fan-out, each shard was subscribed to again after the pause began (the subscription held
then had ended); a DStream reads on while its batch takes 6 minutes (the batches behind it
are read ahead), so there the pause crosses Spark's queue of the batches behind it.

The four SQL cases run at once, four queries of one SparkSession (the ``sql_paused``
fixture), and the two DStream cases in one StreamingContext whose two input DStreams are
unioned into the output operation that takes 6 minutes (``dstream_paused``); the tests assert
one case each. They wait most of the time, so ``make test`` runs the tests marked ``pauses``
in a pytest process of their own beside its other passes, on two workers (``--dist
loadgroup``: the SQL and the DStream group each in a Spark application of its own).
"""
from __future__ import annotations

import datetime as dt
import functools
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import emulators
from fanout_faults import FaultyFanOutFront
from fault_proxy import FaultProxy
from spark_helpers import causes, create
from test_sql_source import Batches, options
from waiting import wait_for

from kinesis_dstream import InitialPositionInStream

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.pauses,
              # one fixture drives all six: the first test waits for every pause
              pytest.mark.timeout(1800)]

PAUSE_S = 360.0  # 6 minutes
# A trigger query starts between LEAD_S / 2 and LEAD_S before a 6-minute boundary, and its
# batch 0 must end before that boundary (else Spark runs the next batch at once, before the
# test has put what the boundary's batch is to read). Under CI's load a fan-out query's
# batch 0 (the consumer registered, Python workers started cold) took over 60 s.
LEAD_S = 240.0
EXPIRY_S = 300.0  # Kinesis: an iterator's life, a subscription's
RECORDS = 20  # per stage (before, during, after) and case
BATCH_S = 5  # the DStream's batch interval: few batches queue behind the 6-minute one
SQL_CASES = ("trigger-polling", "trigger-fanout", "stopped-polling", "stopped-fanout")
DSTREAM_CASES = ("batch-polling", "batch-fanout")


@dataclass
class Case:
    """One pause: its stream and endpoint, what was put and read (by shard and sequence
    number), when the pause began and ended, and what crossed the 5 minutes."""

    name: str
    stream: str
    reader: Any  # its FaultProxy (polling) or FaultyFanOutFront (fan-out)
    put: list[tuple[str, str]] = field(default_factory=list)
    read: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    paused_at: float = 0.0  # epoch s
    resumed_at: float = 0.0
    iterator_ages_s: dict[str, float] = field(default_factory=dict)  # at the pause's end
    subscribed_after: dict[str, int] = field(default_factory=dict)  # since the pause began
    queued: int | None = None  # a DStream's batches run after its 6-minute one

    @property
    def endpoint(self) -> str:
        return str(self.reader.endpoint)

    def put_stage(self, stage: str) -> None:
        records = [(f"pk{i}", f"{self.name}-{stage}-{i}") for i in range(RECORDS)]
        self.put += [(r.shard_id, r.sequence_number)
                     for r in emulators.put_records(self.endpoint, self.stream, records)]

    def has_read_all(self) -> bool:
        return set(self.read) >= set(self.put)


def iterator_ages(proxy: FaultProxy, shards: list[str]) -> dict[str, float]:
    """Per shard, the age on the proxy's clock of the newest iterator it handed out."""
    with proxy._lock:
        now = proxy.now()
        newest = {s: max((born for born, shard in proxy._iterators.values() if shard == s),
                         default=float("-inf")) for s in shards}
    return {s: now - born for s, born in newest.items()}


def subscribed_since(front: FaultyFanOutFront, since: float) -> dict[str, int]:
    """Per shard, the successful SubscribeToShard calls after ``since`` (epoch s)."""
    with front._fault_lock:
        return dict(Counter(shard for at, shard, _ in front.succeeded if at >= since))


def sql_rows(sink: Batches) -> list[tuple[str, str]]:
    return [(row[0], row[1]) for row in sink.rows()]


def read_in(sink: Batches, records: list[tuple[str, str]]) -> int | None:
    """The last batch that brought any of ``records``, once every one was read."""
    with sink.lock:
        batch_of = {(row[0], row[1]): batch for batch, rows in sink.by_batch.items()
                    for row in rows}
    return max(batch_of[r] for r in records) if set(records) <= set(batch_of) else None


def what_was_read(case: Case, query: Any, sink: Batches) -> str:
    """For a wait that timed out: each batch's trigger time, rows and duration, the records
    put and not read by shard, and on fan-out the subscribes and pushes by shard (epoch s)."""
    batches = [(p["batchId"], p["timestamp"][11:19], p["numInputRows"],
                p["durationMs"].get("triggerExecution")) for p in query.recentProgress]
    with sink.lock:
        read = {(row[0], row[1]) for rows in sink.by_batch.values() for row in rows}
    unread = Counter(shard for shard, seq in case.put if (shard, seq) not in read)
    lines = [f"batches (id, trigger UTC, rows, ms): {batches}", f"unread by shard: {dict(unread)}"]
    if isinstance(case.reader, FaultyFanOutFront):
        front = case.reader
        lines.append(f"subscribes: {[(round(at), s) for at, s in front.subscribed][-12:]}")
        lines.append(f"last push by shard: {dict((s, round(at)) for at, s in front.pushed)}")
    return "\n".join(lines)


def trigger_time(query: Any, batch: int) -> float:
    """When ``batch`` was triggered (epoch s), from the query's progress."""
    progress = lambda: [p for p in query.recentProgress if p["batchId"] == batch]  # noqa: E731
    wait_for(progress, 30, f"batch {batch}'s progress")
    return dt.datetime.fromisoformat(progress()[0]["timestamp"].replace("Z", "+00:00")).timestamp()


def start_query(spark: Any, opts: dict[str, str], checkpoint: str, sink: Batches,
                trigger: str) -> Any:
    df = spark.readStream.format("aws-kinesis").options(**opts).load()
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
            .trigger(processingTime=trigger).start())


def stop_query(case: Case, query: Any) -> None:
    query.stop()
    if query.exception() is not None:
        case.errors.append(str(query.exception()))


class Pauses:
    """The six cases' streams, proxies and fronts, and the thread that drives each."""

    def __init__(self, spark: Any, kinesis: str, dynamodb: str, tmp: Path) -> None:
        self.spark, self.kinesis, self.dynamodb, self.tmp = spark, kinesis, dynamodb, tmp
        self.proxies: list[FaultProxy] = []
        self.fronts: list[FaultyFanOutFront] = []
        self.cases: dict[str, Case] = {}
        self.shards: dict[str, list[str]] = {}
        self.starting = threading.Lock()  # held by a query until its first batch (start())
        # The trigger queries start first, in their window before a boundary; the stopped
        # ones wait for them (their 6 minutes end about as the triggers' do: no time lost).
        self.triggers_to_start = 0
        self.triggers_started = threading.Condition()

    def start(self, opts: dict[str, str], checkpoint: str, sink: Batches, trigger: str) -> Any:
        """A query started while none of the others is starting: held until its first
        progress (or its end, or 120 s). Four queries starting in one second, beside
        `make test`'s passes on 2 busy cores, took Spark's Python workers past the 10 s that
        Spark gives one to connect back (fixed in PythonWorkerFactory): every query failed
        as it initialized, with "Python worker failed to connect back"."""
        with self.starting:
            query = start_query(self.spark, opts, checkpoint, sink, trigger)
            deadline = time.monotonic() + 120
            while query.isActive and not query.recentProgress and time.monotonic() < deadline:
                time.sleep(0.2)
        return query

    def case(self, name: str) -> Case:
        stream = emulators.unique_name(f"pause-{name}")
        emulators.create_stream(self.kinesis, stream, 2)
        if name.endswith("polling"):
            proxy = FaultProxy(self.kinesis, share=0.0, max_lifetime_s=1800.0).start()
            proxy.iterator_ttl_s = EXPIRY_S
            self.proxies.append(proxy)
            reader: Any = proxy
        else:
            reader = FaultyFanOutFront(self.kinesis, lifetime_s=EXPIRY_S, heartbeat_s=1.0).start()
            self.fronts.append(reader)
        case = self.cases[name] = Case(name, stream, reader)
        self.shards[name] = emulators.list_shard_ids(self.kinesis, stream)
        return case

    def crossed(self, case: Case) -> None:
        """What the pause crossed, noted as it ends: the ages of the shards' iterators."""
        case.resumed_at = time.time()
        if isinstance(case.reader, FaultProxy):
            case.iterator_ages_s = iterator_ages(case.reader, self.shards[case.name])

    def after(self, case: Case) -> None:
        """What the pause crossed, noted when the case is read: the subscriptions made
        since the pause began (the one held then, older, had ended within its 300 s)."""
        if isinstance(case.reader, FaultyFanOutFront):
            case.subscribed_after = subscribed_since(case.reader, case.paused_at)

    def sql_options(self, case: Case, app: str) -> dict[str, str]:
        """A shard's reading may take 30 s (5 s by default): after a 6-minute gap it starts
        over (a new iterator, or a new subscription: a held one is closed after 60 s unused),
        which under CI's load can take over 5 s, and a reading that hands out nothing
        leaves its records to the next boundary, 6 minutes on. The pauses are the subject
        here, not the budget."""
        extra = {} if case.name.endswith("polling") else {
            "kinesis.consumerType": "SubscribeToShard", "kinesis.consumerName": f"{app}-c"}
        return options(case.stream, case.endpoint, self.dynamodb, app,
                       **{"kinesis.maxFetchTimePerShardMs": "30000", **extra})

    # -- the drivers -------------------------------------------------------------------------
    def trigger(self, case: Case) -> None:
        """Spark triggers a processing-time query at multiples of its interval since the
        epoch, and runs a batch only for new data. The query starts LEAD_S before such a
        boundary (batch 0 reads ``before``); more ``before`` records make the batch at the
        boundary; ``during``, put after it, waits out the 6 minutes to the next boundary.
        ``after`` is read once the query is restarted from its checkpoint on a 1 s trigger
        (a second 6-minute wait would only repeat the first)."""
        app = emulators.unique_name(f"app-{case.name}")
        sink, checkpoint = Batches(), str(self.tmp / case.name)
        opts = self.sql_options(case, app)
        try:
            wait_for(lambda: LEAD_S / 2 <= PAUSE_S - time.time() % PAUSE_S <= LEAD_S,
                     PAUSE_S + 10, f"{case.name}: {LEAD_S:.0f} s before a 6-minute boundary",
                     interval=1.0)
            case.put_stage("before")
            now = time.time()
            boundary = now + PAUSE_S - now % PAUSE_S
            query = self.start(opts, checkpoint, sink, "6 minutes")
        finally:
            with self.triggers_started:
                self.triggers_to_start -= 1
                self.triggers_started.notify_all()
        try:
            read_by = lambda: read_in(sink, case.put) if query.isActive else -1  # noqa: E731
            wait_for(lambda: read_by() is not None, LEAD_S, f"{case.name}: batch 0")
            assert time.time() < boundary, (
                f"{case.name}: batch 0 ended {time.time() - boundary:.0f} s after the 6-minute "
                "boundary it started before, so the boundary's batch has run already: the "
                "machine took longer than LEAD_S / 2 to start the query")
            case.put_stage("before")
            wait_for(lambda: read_by() is not None, LEAD_S + 120,
                     f"{case.name}: the batch at the boundary",
                     lambda: what_was_read(case, query, sink))
            case.paused_at = trigger_time(query, read_by())
            case.put_stage("during")
            wait_for(lambda: time.time() >= case.paused_at + PAUSE_S - 5, PAUSE_S + 10,
                     f"{case.name}: the 6-minute trigger's next boundary", interval=1.0)
            self.crossed(case)
            wait_for(lambda: read_by() is not None, 120,
                     f"{case.name}: the batch 6 minutes after the boundary")
            case.resumed_at = trigger_time(query, read_by())
        finally:
            stop_query(case, query)
        case.put_stage("after")
        self.read_all(case, opts, checkpoint, sink, "every record after the restart")
        case.read = sql_rows(sink)
        self.after(case)

    def read_all(self, case: Case, opts: dict[str, str], checkpoint: str, sink: Batches,
                 what: str, then: Callable[[], None] | None = None) -> None:
        """The query (re)started on a 1 s trigger until it has read every record put, and
        again after ``then`` (which puts more), then stopped."""
        query = self.start(opts, checkpoint, sink, "1 second")

        def every_record() -> None:
            wait_for(lambda: set(sql_rows(sink)) >= set(case.put) or not query.isActive, 180,
                     f"{case.name}: {what}")

        try:
            every_record()
            if then is not None:
                then()
                every_record()
        finally:
            stop_query(case, query)

    def stopped(self, case: Case) -> None:
        """``before`` read, the query stopped for 6 minutes while ``during`` is put, then
        restarted from its checkpointLocation: ``during`` and ``after`` read."""
        app = emulators.unique_name(f"app-{case.name}")
        sink, checkpoint = Batches(), str(self.tmp / case.name)
        opts = self.sql_options(case, app)
        with self.triggers_started:
            self.triggers_started.wait_for(lambda: self.triggers_to_start <= 0,
                                           PAUSE_S + LEAD_S + 240)
        case.put_stage("before")
        self.read_all(case, opts, checkpoint, sink, "the records put before the pause")
        case.paused_at = time.time()
        case.put_stage("during")
        wait_for(lambda: time.time() - case.paused_at >= PAUSE_S, PAUSE_S + 10,
                   f"{case.name}: 6 minutes stopped", interval=1.0)
        self.crossed(case)
        self.read_all(case, opts, checkpoint, sink, "the records put during and after the pause",
                      then=lambda: case.put_stage("after"))
        case.read = sql_rows(sink)
        self.after(case)

    def batch(self, sc: Any, cases: list[Case]) -> None:
        """One StreamingContext, the cases' two input DStreams unioned into one output
        operation; the first batch after every ``before`` record was read takes 6 minutes."""
        from pyspark.streaming import StreamingContext

        ssc = StreamingContext(sc, BATCH_S)
        streams = []
        for case in cases:
            env = {"kinesis": case.endpoint, "dynamodb": self.dynamodb}
            overrides = {} if case.name.endswith("polling") else {"retrieval_mode": "FANOUT"}
            streams.append(create(ssc, emulators.unique_name(f"app-{case.name}"), case.stream,
                                  env, initialPositionInStream=InitialPositionInStream.TRIM_HORIZON,
                                  messageHandler=lambda r: (r.data.decode().rsplit("-", 2)[0],
                                                            r.shard_id, r.sequence_number),
                                  configOverrides=overrides))
        rows: list[tuple[str, str, str]] = []
        pause = threading.Event()  # set: the next batch takes PAUSE_S
        paused = threading.Event()  # set as that batch begins its wait
        resumed = threading.Event()

        batches = [0]  # run after the 6-minute one
        began = [0.0]  # when the 6-minute batch began its wait: every case's pause starts then

        def output(rdd: Any) -> None:
            rows.extend(rdd.collect())
            if resumed.is_set():
                batches[0] += 1
            if pause.is_set() and not paused.is_set():
                began[0] = time.time()
                paused.set()
                # the output operation's own work: PAUSE_S of it, not a wait on the test
                resumed.wait(PAUSE_S)
                for case in cases:  # as the batch ends: the next reads come after
                    self.crossed(case)
                resumed.set()

        streams[0].union(streams[1]).foreachRDD(output)
        by_name = {c.name: c for c in cases}

        def read_by(name: str) -> list[tuple[str, str]]:
            return [(shard, seq) for case, shard, seq in list(rows) if case == name]

        for case in cases:
            case.put_stage("before")
        ssc.start()
        try:
            wait_for(lambda: all(set(read_by(c.name)) >= set(c.put) for c in cases), 180,
                       "batch: the records put before the pause")
            pause.set()
            wait_for(paused.is_set, 60, "batch: the 6-minute batch")
            for case in cases:  # stamped as the wait began, not after the puts before it
                case.paused_at = began[0]
                case.put_stage("during")
            wait_for(resumed.is_set, PAUSE_S + 60, "batch: the 6-minute batch's end",
                       interval=1.0)
            for case in cases:
                case.put_stage("after")
            wait_for(lambda: all(set(read_by(c.name)) >= set(c.put) for c in cases), 600,
                     "batch: every record, after the batches queued behind the pause",
                     lambda: f"{batches[0]} batches run since; read {Counter(r[0] for r in rows)}")
        except BaseException as exc:
            for case in cases:  # the waits cover both: the error is a case's if it is short
                if not set(read_by(case.name)) >= set(case.put):
                    case.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            resumed.set()
            ssc.stop(stopSparkContext=False, stopGraceFully=False)
        for name, case in by_name.items():
            case.queued = batches[0]
            case.read = read_by(name)
            self.after(case)

    def stop(self) -> None:
        for proxy in self.proxies:
            proxy.stop()
        for front in self.fronts:
            front.stop()
        for case in self.cases.values():
            emulators.delete_stream(self.kinesis, case.stream)


def guarded(case_names: list[str], pauses: Pauses, run: Callable[[], None]) -> threading.Thread:
    """``run`` in a thread; what it raises is each of its cases' error."""

    def body() -> None:
        try:
            run()
        except BaseException as exc:  # noqa: BLE001 - reported by the cases' tests
            for name in case_names:
                pauses.cases[name].errors.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=body, daemon=True, name=f"pause-{case_names[0]}")
    thread.start()
    return thread


def run_at_once(pauses: Pauses, runs: dict[tuple[str, ...], Callable[[], None]]) -> None:
    """Each run (of the cases named by its key) in a thread of its own, to its end."""
    threads = [guarded(list(names), pauses, run) for names, run in runs.items()]
    for thread in threads:
        thread.join(2 * PAUSE_S + 600)
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"pauses still running after {2 * PAUSE_S + 600:.0f} s: {alive}"


@pytest.fixture(scope="module")
def pauses(spark: Any, kinesis_local: str, dynamodb: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pauses]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", "http://127.0.0.1:9")  # nothing leaves
        pauses = Pauses(spark, kinesis_local, dynamodb, tmp_path_factory.mktemp("pauses"))
        try:
            yield pauses
        finally:
            pauses.stop()


@pytest.fixture(scope="module")
def sql_paused(pauses: Pauses) -> dict[str, Case]:
    """The four SQL pauses, four queries of one SparkSession at once (started one at a time,
    the triggers first: Pauses.start), run to their end."""
    cases = {name: pauses.case(name) for name in SQL_CASES}
    pauses.triggers_to_start = sum(name.startswith("trigger") for name in cases)
    run_at_once(pauses, {
        (name,): functools.partial(pauses.trigger if name.startswith("trigger") else pauses.stopped,
                                   case) for name, case in cases.items()})
    return cases


@pytest.fixture(scope="module")
def dstream_paused(pauses: Pauses, sc: Any) -> dict[str, Case]:
    """The two DStream pauses, one StreamingContext, run to their end."""
    cases = {name: pauses.case(name) for name in DSTREAM_CASES}
    run_at_once(pauses, {tuple(cases): lambda: pauses.batch(sc, list(cases.values()))})
    return cases


def assert_once_and_crossed(case: Case) -> None:
    assert not case.errors, "\n---\n".join(causes(error) for error in case.errors)
    assert len(case.put) >= 3 * RECORDS  # before, during and after
    read = Counter(case.read)
    assert read == Counter(case.put), (
        f"{case.name}: lost {sorted(set(case.put) - set(read))[:5]}, "
        f"twice {[r for r, n in read.items() if n > 1][:5]}, "
        f"never put {sorted(set(read) - set(case.put))[:5]}")
    # (a trigger's times are when its batches began: the second may begin a little sooner)
    assert case.resumed_at - case.paused_at >= PAUSE_S - 1, (case.paused_at, case.resumed_at)
    if case.queued is not None:
        # a DStream reads on while its batch takes 6 minutes (the batches behind it are
        # planned and read ahead): its pause crosses Spark's queue of those batches
        assert case.queued >= PAUSE_S / BATCH_S - 2, case.queued
    elif case.name.endswith("polling"):
        # every iterator handed out for its shards (the one the reader held included) had
        # expired by the pause's end
        assert case.iterator_ages_s and all(
            age > EXPIRY_S for age in case.iterator_ages_s.values()), case.iterator_ages_s
    if case.name.endswith("fanout"):
        # the subscription held as the pause began had ended (a subscription lasts 300 s),
        # and each shard was subscribed to again
        assert set(case.subscribed_after) == {s for s, _ in case.put}, case.subscribed_after


# The SQL and the DStream pauses in two Spark applications (`make test` runs this file on two
# workers): a StreamingContext beside four queries in one SparkContext failed those queries'
# tasks with java.io.OptionalDataException (docs/operations.md, "Long pauses").
@pytest.mark.xdist_group("sql-pauses")
@pytest.mark.parametrize("name", SQL_CASES)
def test_a_six_minute_sql_pause_reads_every_record_once(sql_paused: dict[str, Case],
                                                        name: str) -> None:
    assert_once_and_crossed(sql_paused[name])


@pytest.mark.xdist_group("dstream-pauses")
@pytest.mark.parametrize("name", DSTREAM_CASES)
def test_a_dstream_batch_of_six_minutes_reads_every_record_once(
        dstream_paused: dict[str, Case], name: str) -> None:
    assert_once_and_crossed(dstream_paused[name])
