"""Expired iterators and records trimmed by retention, through the fault proxy.

No emulator expires an iterator or trims a shard, so kinesis-local sits behind
tests/fault_proxy.py: ``iterator_ttl_s`` answers ExpiredIteratorException for an iterator
older than that on the proxy's clock, which a test moves past the TTL (``expire_held``) instead
of sleeping, ``trim_horizon`` makes the records before a sequence number gone, in either
shape Kinesis is reported to answer a start before it with (``trim_shape``: "silent", an
iterator at the oldest record; "refuse", InvalidArgumentException). The fetcher, the worker
(Scheduler) and the DStream and SQL readers all read through one ``KinesisDataFetcher``.
"""
from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from emulators import put_records as put_at
from spark_helpers import create, make_ssc, wait_until

from kinesis_dstream.aws.kinesis import KinesisClient
from kinesis_dstream.aws.lease_table import Lease, LeaseTable
from kinesis_dstream.errors import DataLossError
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.retrieval import KinesisDataFetcher
from kinesis_dstream.retrieval import data_loss as fetcher_module
from kinesis_dstream.worker.processor import RecordProcessor
from kinesis_dstream.worker.scheduler import Scheduler

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

SHAPES = ("silent", "refuse")
# Kinesis' iterator lifetime; on the proxy's clock only advance_clock gets there in a test.
TTL_S = 300.0


def trimmed_warnings(messages: list[str], shard: str) -> list[str]:
    return [m for m in messages if "trimmed by the stream's retention" in m and shard in m]


@pytest.fixture(autouse=True)
def _fresh_reports():
    """Losses are logged once per process: each test starts with none logged."""
    fetcher_module._reported.clear()
    yield


@pytest.fixture
def ten(make_stream, put_records) -> tuple[str, list]:
    """A one-shard stream of ten plain records r0..r9."""
    stream = make_stream(1)
    return stream, put_records(stream, [(f"k{i}", f"r{i}") for i in range(10)])


def drain(fetcher: KinesisDataFetcher, max_calls: int = 50) -> list[str]:
    got: list[str] = []
    for _ in range(max_calls):
        result = fetcher.get_records()
        got += [r.binary_data.decode() for r in result.records]
        if not result.records and result.at_tip(fetcher._config.max_records):
            return got
    raise AssertionError("the shard never reached its tip")


# -- the fetcher -------------------------------------------------------------------------------
@pytest.mark.emulator
@pytest.mark.parametrize("shape", SHAPES)
def test_a_trimmed_checkpoint_goes_on_from_the_oldest_record_and_is_logged_once(
        ten, make_config, make_fault_proxy, caplog, shape):
    stream, put = ten
    proxy = make_fault_proxy(share=0.0)
    proxy.trim_horizon, proxy.trim_shape = {put[0].shard_id: put[5].sequence_number}, shape
    config = make_config(stream, kinesis_endpoint=proxy.endpoint)
    caplog.set_level(logging.WARNING, logger="kinesis_dstream")
    for _ in range(2):  # a task retry reads the same start again: still one line
        fetcher = KinesisDataFetcher(KinesisClient(config), config, put[0].shard_id,
                                     reports_data_loss=True)
        fetcher.initialize(ESN(put[1].sequence_number))
        assert drain(fetcher) == [f"r{i}" for i in range(5, 10)]
    (line,) = trimmed_warnings(caplog.messages, put[0].shard_id)
    assert f"after {ESN(put[1].sequence_number)} before {put[5].sequence_number}" in line
    assert stream in line
    assert proxy.refused == (2 if shape == "refuse" else 0)


@pytest.mark.emulator
@pytest.mark.parametrize("shape", SHAPES)
def test_a_trimmed_checkpoint_fails_with_fail_on_data_loss(ten, make_config, make_fault_proxy,
                                                           shape):
    stream, put = ten
    proxy = make_fault_proxy(share=0.0)
    proxy.trim_horizon, proxy.trim_shape = {put[0].shard_id: put[5].sequence_number}, shape
    config = make_config(stream, kinesis_endpoint=proxy.endpoint, fail_on_data_loss=True)
    fetcher = KinesisDataFetcher(KinesisClient(config), config, put[0].shard_id,
                                 reports_data_loss=True)
    fetcher.initialize(ESN(put[1].sequence_number))
    for _ in range(2):  # and again: the fetcher does not move past what it refused to skip
        with pytest.raises(DataLossError) as info:
            fetcher.get_records()
        assert put[0].shard_id in str(info.value)
        assert put[1].sequence_number in str(info.value)
        assert put[5].sequence_number in str(info.value)


@pytest.mark.emulator
def test_a_start_at_the_trim_horizon_or_after_it_loses_nothing(ten, make_config,
                                                                make_fault_proxy, caplog):
    stream, put = ten
    proxy = make_fault_proxy(share=0.0)
    proxy.trim_horizon = {put[0].shard_id: put[5].sequence_number}
    config = make_config(stream, kinesis_endpoint=proxy.endpoint, fail_on_data_loss=True)
    caplog.set_level(logging.WARNING, logger="kinesis_dstream")
    for start, expected in ((5, range(6, 10)), (7, range(8, 10))):
        fetcher = KinesisDataFetcher(KinesisClient(config), config, put[0].shard_id,
                                     reports_data_loss=True)
        fetcher.initialize(ESN(put[start].sequence_number))
        assert drain(fetcher) == [f"r{i}" for i in expected]
    fetcher.initialize(ESN.TRIM_HORIZON)  # the oldest record there is: nothing to report
    assert drain(fetcher) == [f"r{i}" for i in range(5, 10)]
    assert not trimmed_warnings(caplog.messages, put[0].shard_id)


@pytest.mark.emulator
def test_expired_iterators_are_re_created_after_the_last_record(ten, make_config,
                                                                 make_fault_proxy):
    stream, put = ten
    proxy = make_fault_proxy(share=0.0)
    config = make_config(stream, kinesis_endpoint=proxy.endpoint, max_records=3)
    fetcher = KinesisDataFetcher(KinesisClient(config), config, put[0].shard_id)
    fetcher.initialize(ESN(put[0].sequence_number))
    got = [r.binary_data.decode() for r in fetcher.get_records().records]
    proxy.expire_next = 2  # the iterator, and the fresh one made for it, expire
    got += drain(fetcher)
    proxy.iterator_ttl_s = TTL_S
    put_at(proxy.endpoint, stream, [("k10", "r10")])
    proxy.advance_clock(TTL_S + 1)  # the handed-back iterator, kept too long
    got += drain(fetcher)
    assert got == [f"r{i}" for i in range(1, 11)]
    assert proxy.expired == 3
    assert fetcher.shard_iterator_calls == 4  # the first, and one per expiry


def expire_held(proxy: Any, timeout: float = 60.0) -> None:
    """Age every iterator held now past the proxy's TTL, and wait until a GetRecords was
    answered ExpiredIteratorException. A read in flight as the clock moved may be handed a
    fresh iterator: then the clock moves again, once per GetRecords, never after an expiry
    (the iterator re-created for it must not expire too)."""
    before = proxy.expired
    deadline = time.monotonic() + timeout
    while proxy.expired == before:
        assert time.monotonic() < deadline, f"no iterator expired within {timeout} s"
        proxy.advance_clock(proxy.iterator_ttl_s + 1)
        reads_go_on(proxy, 1, timeout)


# -- the worker (Scheduler) --------------------------------------------------------------------
class _Recorder(RecordProcessor):
    def __init__(self, delivered: list[str], lock: threading.Lock) -> None:
        self.delivered, self.lock = delivered, lock

    def process_records(self, process_records_input: Any) -> None:
        with self.lock:
            self.delivered.extend(r.binary_data.decode() for r in process_records_input.records)
        process_records_input.checkpointer.checkpoint()


@pytest.mark.emulator
def test_a_trimmed_start_read_by_two_computations_is_logged_by_the_one_whose_range_stands(
        ten, make_config, make_fault_proxy, caplog):
    """A task and its retry (in another Python worker: nothing logged there yet) both read a
    trimmed start; the retry finds the first one's range recorded and reads that one. Only
    the computation whose range stands logs the loss, so it is logged once however many
    processes computed the partition; with failOnDataLoss the read fails before recording."""
    from kinesis_dstream.aws.range_table import BatchRangeTable
    from kinesis_dstream.retrieval import ShardRange, read_shard_range

    stream, put = ten
    shard = put[0].shard_id
    proxy = make_fault_proxy(share=0.0)
    proxy.trim_horizon = {shard: put[5].sequence_number}
    config = make_config(stream, kinesis_endpoint=proxy.endpoint)
    BatchRangeTable(config).create_table_if_not_exists()
    planned = ShardRange("stream-t", shard, 1000, ESN(put[1].sequence_number), None, 0,
                         max_records=1000, time_budget_s=2, start=ESN(put[1].sequence_number))
    caplog.set_level(logging.WARNING, logger="kinesis_dstream")
    first, report = read_shard_range(config, planned)
    assert [r.binary_data.decode() for r in first] == [f"r{i}" for i in range(5, 10)]
    assert report.recorded and len(trimmed_warnings(caplog.messages, shard)) == 1
    fetcher_module._reported.clear()  # the retry runs in a process that logged nothing
    again, _ = read_shard_range(config, planned)
    assert again == first
    assert len(trimmed_warnings(caplog.messages, shard)) == 1
    failing = make_config(stream, kinesis_endpoint=proxy.endpoint, fail_on_data_loss=True)
    with pytest.raises(DataLossError):
        read_shard_range(failing, ShardRange("stream-t", shard, 2000,
                                             ESN(put[1].sequence_number), None, 0,
                                             max_records=1000, time_budget_s=2,
                                             start=ESN(put[1].sequence_number)))
    assert BatchRangeTable(config).get("stream-t", shard, 2000) is None


@pytest.mark.emulator
@pytest.mark.parametrize("trim_at", [3, 7], ids=["partly", "wholly"])
def test_a_recorded_range_trimmed_before_it_is_read_again_is_reported_not_read_forever(
        ten, make_config, make_fault_proxy, caplog, trim_at):
    """A batch computed again (a restarted query's uncommitted batch, a recovered driver's)
    after retention trimmed part or all of its recorded range: the read ends, hands out what
    the shard still holds and logs the loss once, or raises DataLossError with
    failOnDataLoss. (It used to read on forever for the record at the range's end.)"""
    from kinesis_dstream.aws.range_table import BatchRangeTable
    from kinesis_dstream.retrieval import ShardRange, read_shard_range

    stream, put = ten
    shard = put[0].shard_id
    proxy = make_fault_proxy(share=0.0)
    config = make_config(stream, kinesis_endpoint=proxy.endpoint)
    BatchRangeTable(config).create_table_if_not_exists()
    start = ESN(put[1].sequence_number)
    planned = ShardRange("stream-t", shard, 1000, start, None, 0, max_records=3,
                         time_budget_s=2, start=start)
    first, report = read_shard_range(config, planned)
    assert [r.binary_data.decode() for r in first] == ["r2", "r3", "r4"] and report.recorded
    proxy.trim_horizon = {shard: put[trim_at].sequence_number}
    caplog.set_level(logging.WARNING, logger="kinesis_dstream")
    again, report = read_shard_range(config, planned)
    assert [r.binary_data.decode() for r in again] == [f"r{i}" for i in range(trim_at, 5)]
    assert report.batch_range.end == ESN(put[4].sequence_number)  # the range stands
    (warning,) = trimmed_warnings(caplog.messages, shard)
    assert f"after {start} before {put[trim_at].sequence_number}" in warning, warning
    failing = make_config(stream, kinesis_endpoint=proxy.endpoint, fail_on_data_loss=True)
    with pytest.raises(DataLossError, match=put[trim_at].sequence_number):
        read_shard_range(failing, planned)


def seed_checkpoint(config: Any, shard_id: str, sequence_number: str) -> None:
    """A lease whose checkpoint a consumer left long ago (before the stream's retention)."""
    table = LeaseTable(config)
    table.create_table_if_not_exists()
    assert table.create_lease_if_not_exists(Lease(shard_id, checkpoint=ESN(sequence_number)))


@pytest.mark.emulator
@pytest.mark.timeout(180)
def test_worker_expired_iterators_and_a_trimmed_checkpoint_lose_and_double_nothing(
        aws_env, ten, make_config, make_fault_proxy, caplog):
    stream, put = ten
    shard = put[0].shard_id
    proxy = make_fault_proxy(share=0.0)
    proxy.trim_horizon, proxy.trim_shape = {shard: put[4].sequence_number}, "refuse"
    proxy.iterator_ttl_s = TTL_S
    config = make_config(stream, kinesis_endpoint=proxy.endpoint, idle_time_between_reads_ms=500)
    seed_checkpoint(config, shard, put[1].sequence_number)
    delivered: list[str] = []
    lock = threading.Lock()
    caplog.set_level(logging.WARNING, logger="kinesis_dstream")
    scheduler = Scheduler(config, lambda shard_id: _Recorder(delivered, lock))
    scheduler.start()
    try:
        wait_until(lambda: len(delivered) >= 6, 60, "the records after the trim horizon")
        for round_ in range(3):  # a record, then the worker's iterator expires
            put_at(proxy.endpoint, stream, [(f"k{round_}", f"n{round_}")])
            expire_held(proxy)
            wait_until(lambda wanted=7 + round_: len(delivered) >= wanted, 60, f"record n{round_}")
        reads_go_on(proxy, 4)  # what would come twice comes by now
    finally:
        scheduler.shutdown(timeout_s=10)
    assert delivered == [f"r{i}" for i in range(4, 10)] + ["n0", "n1", "n2"]
    assert proxy.expired >= 3 and proxy.refused == 1
    (line,) = trimmed_warnings(caplog.messages, shard)
    assert f"after {ESN(put[1].sequence_number)} before {put[4].sequence_number}" in line


# -- DStream on Spark --------------------------------------------------------------------------
@pytest.fixture
def proxied(aws_env, dynamodb, make_fault_proxy):
    proxy = make_fault_proxy(share=0.0)
    return proxy, dict(kinesis=proxy.endpoint, dynamodb=dynamodb)


def executor_lines(sc: Any, needle: str) -> list[str]:
    """Lines with ``needle`` in this application's executor logs (local-cluster writes each
    executor's stderr under $SPARK_HOME/work/<application id>/<executor id>/)."""
    import pyspark

    home = Path(pyspark.__file__).parent
    lines = []
    for path in (home / "work" / sc.applicationId).glob("*/stderr"):
        lines += [line for line in path.read_text(errors="replace").splitlines() if needle in line]
    return lines


def collected_or_failed(kstream: Any) -> tuple[list, list[str], list]:
    """Every row of every batch, the errors of batches whose job failed, and each batch's
    time (Spark calls the output operation for every batch, empty or not)."""
    rows: list = []
    failed: list[str] = []
    batches: list = []

    def keep(batch_time: Any, rdd: Any) -> None:
        try:
            rows.extend(rdd.collect())
        except Exception as exc:  # noqa: BLE001 - the test asserts on it
            failed.append(str(exc))
        batches.append(batch_time)

    kstream.foreachRDD(keep)
    return rows, failed, batches


def reads_go_on(proxy: Any, calls: int, timeout: float = 60.0) -> None:
    """Wait until ``calls`` more GetRecords have passed ``proxy``: a record that a re-created
    iterator would bring twice comes within them."""
    seen = proxy.get_records_forwarded  # every GetRecords not throttled, expired ones too
    wait_until(lambda: proxy.get_records_forwarded >= seen + calls, timeout,
               f"{calls} more GetRecords")


def batches_go_on(batches: list, count: int = 3, timeout: float = 60.0) -> None:
    """Wait until ``count`` more batches have run their output operation: a record that one
    of them would bring twice is in the rows by then."""
    seen = len(batches)
    wait_until(lambda: len(batches) >= seen + count, timeout, f"{count} more batches")


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_dstream_expired_iterators_lose_and_double_nothing(sc, proxied, make_stream,
                                                           put_records, unique_app_name):
    proxy, env = proxied
    stream = make_stream(2)
    proxy.iterator_ttl_s = TTL_S
    expected = [r.data.decode() for r in put_records(stream, [(f"k{i}", f"a{i}")
                                                             for i in range(40)])]
    ssc = make_ssc(sc)
    rows, failed, batches = collected_or_failed(create(ssc, unique_app_name, stream, env))
    ssc.start()
    try:
        wait_until(lambda: len(rows) >= 40, 90, "the first records")
        for round_ in range(4):  # records, then the iterators the readers hold expire
            expected += [r.data.decode() for r in put_records(
                stream, [(f"k{i}", f"b{round_}-{i}") for i in range(10)])]
            expire_held(proxy)
            wanted = len(expected)
            wait_until(lambda wanted=wanted: len(rows) >= wanted, 90, f"round {round_}'s records")
        batches_go_on(batches)  # batches that would bring a record twice
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert Counter(rows) == Counter(expected)
    assert proxy.expired >= 4
    assert not failed, failed[0][:2000]  # a failed batch's records would come later: no


@pytest.mark.spark
@pytest.mark.timeout(240)
@pytest.mark.parametrize("shape", SHAPES)
def test_dstream_trimmed_checkpoint_goes_on_by_default_and_logs_once(
        sc, proxied, make_config, make_stream, put_records, unique_app_name, shape):
    proxy, env = proxied
    stream = make_stream(1)
    put = put_records(stream, [(f"k{i}", f"r{i}") for i in range(10)])
    shard = put[0].shard_id
    proxy.trim_horizon, proxy.trim_shape = {shard: put[6].sequence_number}, shape
    seed_checkpoint(make_config(stream, kinesis_endpoint=proxy.endpoint), shard,
                    put[2].sequence_number)
    ssc = make_ssc(sc)
    rows, failed, batches = collected_or_failed(create(ssc, unique_app_name, stream, env))
    ssc.start()
    try:
        wait_until(lambda: len(rows) >= 4, 90, "the records after the trim horizon")
        batches_go_on(batches)  # batches that would bring a record twice, or an older one
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert rows == [f"r{i}" for i in range(6, 10)]
    assert not failed, failed[0][:2000]
    span = f"after {ESN(put[2].sequence_number)} before {put[6].sequence_number}"
    lines = executor_lines(sc, f"stream {stream!r} shard {shard}")
    assert len(lines) == 1 and span in lines[0] and "WARNING" in lines[0], lines


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_dstream_trimmed_checkpoint_fails_the_batch_with_fail_on_data_loss(
        sc, proxied, make_config, make_stream, put_records, unique_app_name):
    proxy, env = proxied
    stream = make_stream(1)
    put = put_records(stream, [(f"k{i}", f"r{i}") for i in range(10)])
    shard = put[0].shard_id
    proxy.trim_horizon = {shard: put[6].sequence_number}
    seed_checkpoint(make_config(stream, kinesis_endpoint=proxy.endpoint), shard,
                    put[2].sequence_number)
    sc._conf._jconf.set("spark.streaming.kinesis.failOnDataLoss", "true")
    try:
        ssc = make_ssc(sc)
        kstream = create(ssc, unique_app_name, stream, env)
    finally:
        sc._conf._jconf.remove("spark.streaming.kinesis.failOnDataLoss")
    rows, errors, _ = collected_or_failed(kstream)
    ssc.start()
    try:
        wait_until(lambda: errors, 120, "a failed batch")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    assert not rows
    assert "DataLossError" in errors[0] and shard in errors[0]
    assert put[2].sequence_number in errors[0] and put[6].sequence_number in errors[0]


# -- the SQL source ----------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fail", [False, True, "qubole"])
def test_sql_trimmed_position_follows_fail_on_data_loss(spark, sc, proxied, make_stream,
                                                         put_records, unique_app_name,
                                                         tmp_path, fail):
    """fail "qubole": no failOnDataLoss, options in qubole's names: its default, true."""
    from test_sql_source import Batches, options, start_query, stop

    proxy, env = proxied
    stream = make_stream(1)
    put = put_records(stream, [(f"k{i}", f"r{i}") for i in range(3)])
    shard = put[0].shard_id
    if fail == "qubole":
        opts = {"streamName": stream, "endpointUrl": proxy.endpoint, "regionName": "us-east-1",
                "startingPosition": "TRIM_HORIZON", "kinesis.client.retryIntervalMs": "100",
                "kinesis.dynamodb.endpointUrl": env["dynamodb"],
                "kinesis.dynamodb.tableName": unique_app_name}
    else:
        opts = options(stream, proxy.endpoint, env["dynamodb"], unique_app_name,
                       **{"kinesis.failOnDataLoss": str(fail).lower()})
    checkpoint, sink = str(tmp_path / "checkpoint"), Batches()
    query = start_query(spark, opts, checkpoint, sink)
    try:
        wait_until(lambda: len(sink.rows()) >= 3, 120, "the first records")
        # Stopped after the batch committed: one stopped before would read its (trimmed)
        # range again on restart, the recorded-range case tested with the fetcher above.
        wait_until(lambda: all((Path(checkpoint) / "commits" / str(b)).exists()
                               for b in list(sink.by_batch)), 60, "the batch committed")
    finally:
        stop(query)
    put += put_records(stream, [(f"k{i}", f"r{i}") for i in range(3, 10)])
    # Stopped for longer than the stream's retention: r3..r5 are gone, and so are the
    # iterators the query kept.
    proxy.trim_horizon, proxy.iterator_ttl_s = {shard: put[6].sequence_number}, TTL_S
    proxy.advance_clock(TTL_S + 1)
    first_run = len(sink.rows())
    query = start_query(spark, opts, checkpoint, sink)
    span = f"after {ESN(put[2].sequence_number)} before {put[6].sequence_number}"
    try:
        if fail:
            wait_until(lambda: not query.isActive, 120, "the query to fail")
        else:
            wait_until(lambda: len(sink.rows()) >= first_run + 4, 120, "the records left")
            reads_go_on(proxy, 4)  # the source's reads and probes go on past the records
            wait_until(lambda: not query.status["isTriggerActive"], 60, "the trigger to end")
    finally:
        query.stop()
    data = [r[4].decode() for r in sorted(sink.rows(), key=lambda r: int(r[1]))]
    if fail:
        error = str(query.exception())
        assert "DataLossError" in error and shard in error and span in error, error
        assert "failOnDataLoss is true" in error, error
        assert data == ["r0", "r1", "r2"]
        return
    assert query.exception() is None, query.exception()
    assert data == [f"r{i}" for i in (0, 1, 2, 6, 7, 8, 9)]
    lines = executor_lines(sc, f"stream {stream!r} shard {shard}")
    assert len(lines) == 1 and span in lines[0] and "WARNING" in lines[0], lines
