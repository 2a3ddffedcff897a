"""Where the records are read and how a batch stays the same batch.

Real Spark on ``local-cluster[2,1,1024]`` (the session's SparkContext: two executor JVMs in
processes of their own), kinesis-local and moto's DynamoDB.
"""
from __future__ import annotations

import os
import threading
import warnings

import pytest
from pyspark import StorageLevel, TaskContext

from spark_helpers import ancestry, collected, create, make_ssc, wait_until

from kinesis_dstream.aws.kinesis import KinesisClient
from kinesis_dstream.aws.range_table import BatchRangeTable
from kinesis_dstream.records import ExtendedSequenceNumber
from kinesis_dstream.retrieval import ShardRange, read_shard_range

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

NO_CACHE = StorageLevel(False, False, False, False, 1)


@pytest.mark.matrix
@pytest.mark.spark
def test_records_are_read_on_executors_and_never_in_the_driver(sc, env, make_stream, put_records,
                                                               unique_app_name, monkeypatch):
    def no_reads_here(*args, **kwargs):
        raise AssertionError("GetRecords called in the driver process")

    monkeypatch.setattr(KinesisClient, "get_records", no_reads_here)  # the driver's class only
    stream = make_stream(4)
    put_records(stream, [(f"pk{i}", f"r{i}") for i in range(400)])
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, env)
    rows = collected(kstream)
    ssc.start()
    try:
        wait_until(lambda: len(rows) >= 400, 90, "every record")
        metrics = kstream.metrics()
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(rows) == sorted(f"r{i}" for i in range(400))
    readers = {pid for m in metrics.values() for pid in m["read_by_pids"]}
    assert readers and os.getpid() not in readers
    for pid in readers:
        assert any("CoarseGrainedExecutorBackend" in line for line in ancestry(pid)), \
            (pid, ancestry(pid))
    assert sum(m["records"] for m in metrics.values()) == 400


def two_output_operations(kstream, between):
    """Two output operations on ``kstream``; ``between(rows)`` runs in the first one, before
    the second computes the batch again. Returns the rows each saw, by batch time."""
    first: dict = {}
    second: dict = {}
    lock = threading.Lock()

    def one(time, rdd):
        got = rdd.collect()
        between(got)
        with lock:
            first[time] = got

    def two(time, rdd):
        got = rdd.collect()
        with lock:
            second[time] = got

    kstream.foreachRDD(one)
    kstream.foreachRDD(two)
    return first, second


@pytest.mark.matrix
@pytest.mark.spark
def test_two_output_operations_get_the_same_records_though_more_arrived(
        sc, env, make_stream, put_records, unique_app_name):
    """The second output operation recomputes the batch (nothing cached) after more records
    arrived: it reads the range the first computation recorded, not what is there now."""
    stream = make_stream(2)
    put_records(stream, [(f"pk{i}", f"a{i}") for i in range(100)])
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, env, storageLevel=NO_CACHE)
    late: list[str] = []

    def more(got):
        if got and not late:  # more records while the batch is between its two operations
            late.extend(f"b{i}" for i in range(100))
            put_records(stream, [(f"pk{i}", r) for i, r in enumerate(late)])

    first, second = two_output_operations(kstream, more)
    ssc.start()
    try:
        wait_until(lambda: sum(len(v) for v in list(second.values())) >= 200, 90, "both waves")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert late
    for time, rows in first.items():
        assert sorted(second.get(time, [])) == sorted(rows), time
    for seen in (first, second):  # every record once in each output operation
        assert sorted(r for rows in seen.values() for r in rows) == \
            sorted([f"a{i}" for i in range(100)] + late)


@pytest.mark.matrix
@pytest.mark.spark
def test_a_batch_whose_read_found_nothing_stays_empty_when_computed_again(
        sc, env, make_stream, put_records, unique_app_name):
    """With storageLevel NONE the first output operation's read decides the range and records
    it even when empty. The batch's second output operation computes it again after records
    arrived: it must still be empty, and those records come once to each operation, in a
    later batch."""
    stream = make_stream(1)
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, env, storageLevel=NO_CACHE)
    late: list[str] = []
    ready = threading.Event()

    def more(got):
        if not got and ready.is_set() and not late:  # an empty batch, between its operations
            late.extend(f"late{i}" for i in range(30))
            put_records(stream, [("k", r) for r in late])

    first, second = two_output_operations(kstream, more)
    ssc.start()
    try:
        wait_until(lambda: kstream.metrics() and all(
            m["state"] == "processing" for m in kstream.metrics().values()), 60, "the lease")
        wait_until(lambda: len(second) >= 2, 60, "two batches")
        ready.set()
        wait_until(lambda: sum(len(v) for v in list(second.values())) >= 30, 90, "the records")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert late
    emptied = [t for t, rows in first.items() if not rows and t in second]
    assert emptied
    for time, rows in first.items():
        if time in second:
            assert sorted(second[time]) == sorted(rows), time
    for seen in (first, second):  # every record once in each output operation
        assert sorted(r for rows in seen.values() for r in rows) == sorted(late)


@pytest.mark.matrix
@pytest.mark.spark
def test_a_task_failing_mid_read_reads_the_same_records_on_retry(
        sc, env, make_stream, put_records, unique_app_name, tmp_path):
    """The output task dies after some records of its partition, more records arrive, and
    Spark retries it: the retry reads the recorded range, the same records."""
    stream = make_stream(1)
    put_records(stream, [("k", f"a{i}") for i in range(50)])
    flag = tmp_path / "more-put"  # executors and driver share the file system here
    kinesis = env["kinesis"]

    def fail_first_attempt(record):
        # Once: with NO_CACHE the handler runs in the read-ahead job and the output job alike.
        if TaskContext.get().attemptNumber() == 0 and record.data == b"a25" and not flag.exists():
            import boto3  # on the executor: tests/ is not on its path

            boto3.client("kinesis", endpoint_url=kinesis, region_name="us-east-1").put_records(
                StreamName=stream, Records=[{"PartitionKey": "k", "Data": f"b{i}".encode()}
                                            for i in range(50)])
            flag.touch()
            raise RuntimeError("the task dies mid-read")
        return record.data.decode()

    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, env, storageLevel=NO_CACHE,
                     messageHandler=fail_first_attempt)
    batches: list[list[str]] = []
    lock = threading.Lock()

    def keep(rdd):
        got = rdd.collect()
        if got:
            with lock:
                batches.append(got)

    kstream.foreachRDD(keep)
    ssc.start()
    try:
        wait_until(lambda: sum(len(b) for b in list(batches)) >= 100, 90, "both waves")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert flag.exists(), "the injected failure never happened"
    assert batches[0] == [f"a{i}" for i in range(50)]  # the retry: exactly the first range
    assert [r for b in batches[1:] for r in b] == [f"b{i}" for i in range(50)]


@pytest.mark.emulator
def test_a_recorded_range_is_read_again_exactly(make_config, make_stream, put_records):
    """read_shard_range without Spark: the second computation of a (batch, shard) reads the
    recorded range whatever arrived since; the next batch continues after it."""
    stream = make_stream(1)
    config = make_config(stream)
    BatchRangeTable(config).create_table_if_not_exists()
    shard = put_records(stream, [("k", f"a{i}") for i in range(30)])[0].shard_id
    planned = ShardRange("stream-a", shard, 1000, ExtendedSequenceNumber("TRIM_HORIZON"), None,
                         1000, max_records=20, time_budget_s=5)
    records, report = read_shard_range(config, planned)
    assert [r.binary_data for r in records] == [f"a{i}".encode() for i in range(20)]  # the cap
    assert report.more_left  # the planner reads the next batch at once
    put_records(stream, [("k", f"b{i}") for i in range(10)])
    again, _ = read_shard_range(config, planned)
    assert again == records
    after, next_report = read_shard_range(config, ShardRange(
        "stream-a", shard, 2000, ExtendedSequenceNumber("TRIM_HORIZON"), None, 1000,
        max_records=1000, time_budget_s=5))  # start looked up: after batch 1000's range
    assert [r.binary_data for r in after] == \
        [f"a{i}".encode() for i in range(20, 30)] + [f"b{i}".encode() for i in range(10)]
    assert next_report.batch_range.start == report.batch_range.end
    assert not next_report.more_left  # at the tip
    # another lease period (since 3000) never continues an older period's range
    fresh, _ = read_shard_range(config, ShardRange(
        "stream-a", shard, 4000, ExtendedSequenceNumber("TRIM_HORIZON"), None, 3000,
        max_records=5, time_budget_s=5))
    assert [r.binary_data for r in fresh] == [f"a{i}".encode() for i in range(5)]


@pytest.mark.emulator
def test_a_range_whose_start_the_driver_knew_is_read_again_exactly(make_config, make_stream,
                                                                   put_records):
    """The usual batch: the driver passes where it starts, the task reads before recording.
    Computed again after more records arrived, it still gives the recorded range."""
    stream = make_stream(1)
    config = make_config(stream)
    BatchRangeTable(config).create_table_if_not_exists()
    shard = put_records(stream, [("k", f"a{i}") for i in range(10)])[0].shard_id
    _, report = read_shard_range(config, ShardRange(
        "stream-b", shard, 1000, ExtendedSequenceNumber("TRIM_HORIZON"), None, 1000,
        max_records=1000, time_budget_s=5))
    put_records(stream, [("k", f"b{i}") for i in range(10)])
    planned = ShardRange("stream-b", shard, 2000, ExtendedSequenceNumber("TRIM_HORIZON"), None,
                         1000, max_records=1000, time_budget_s=5,
                         start=report.batch_range.next_start)
    records, _ = read_shard_range(config, planned)
    assert [r.binary_data for r in records] == [f"b{i}".encode() for i in range(10)]
    put_records(stream, [("k", f"c{i}") for i in range(10)])
    again, again_report = read_shard_range(config, planned)
    assert again == records
    assert again_report.batch_range.records == 10


@pytest.mark.emulator
def test_a_batch_that_starts_inside_a_backlog_reads_on_past_its_first_page(
        make_config, make_stream, put_records):
    """The page after a batch's start holds the record it starts at, which is dropped: one
    user record short of a full page is still a full page, not the stream's tip."""
    stream = make_stream(1)
    config = make_config(stream, max_records=10)  # GetRecords pages of 10
    BatchRangeTable(config).create_table_if_not_exists()
    shard = put_records(stream, [("k", f"a{i}") for i in range(30)])[0].shard_id
    _, report = read_shard_range(config, ShardRange(
        "stream-c", shard, 1000, ExtendedSequenceNumber("TRIM_HORIZON"), None, 1000,
        max_records=5, time_budget_s=5))
    records, _ = read_shard_range(config, ShardRange(
        "stream-c", shard, 2000, ExtendedSequenceNumber("TRIM_HORIZON"), None, 1000,
        max_records=1000, time_budget_s=5, start=report.batch_range.next_start))
    assert [r.binary_data for r in records] == [f"a{i}".encode() for i in range(5, 30)]
    # a read out of time before the tip leaves more: one page, then the budget is spent
    _, spent = read_shard_range(config, ShardRange(
        "stream-c", shard, 3000, ExtendedSequenceNumber("TRIM_HORIZON"), None, 3000,
        max_records=1000, time_budget_s=0))
    assert (spent.batch_range.records, spent.more_left) == (10, True)


@pytest.mark.spark
def test_batch_ranges_are_deleted_once_checkpointed_and_all_at_a_graceful_stop(
        sc, env, make_stream, put_records, unique_app_name):
    """The range table holds what a recomputation may still need: while the stream runs, at
    most the newest checkpointed range per shard stays; a graceful stop leaves none."""
    from emulators import client

    stream = make_stream(4)
    ssc = make_ssc(sc)
    rows = collected(create(ssc, unique_app_name, stream, env))
    ddb = client("dynamodb", env["dynamodb"])
    table = f"{unique_app_name}-kinesis-dstream-ranges"

    def stored() -> dict[str, int]:
        per_shard: dict[str, int] = {}
        for item in ddb.scan(TableName=table, ConsistentRead=True)["Items"]:
            shard = item["rangeKey"]["S"].rsplit("/", 1)[1]
            per_shard[shard] = per_shard.get(shard, 0) + 1
        return per_shard

    ssc.start()
    try:
        for wave in range(6):  # a wave a second: each shard has records in several batches
            put_records(stream, [(f"pk{i}", f"w{wave}-{i}") for i in range(40)])
            wait_until(lambda wanted=40 * (wave + 1): len(rows) >= wanted, 60, f"wave {wave}")
        wait_until(lambda: 0 < len(stored()) and max(stored().values()) <= 2, 30,
                   "the checkpointed ranges to be deleted")
        assert len(stored()) == 4  # the newest range of each shard stays while it is read
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert stored() == {}
    assert sorted(rows) == sorted(f"w{w}-{i}" for w in range(6) for i in range(40))


@pytest.mark.emulator
def test_a_range_that_ends_inside_a_kpl_aggregate_is_read_again_exactly(
        make_config, make_stream, put_aggregated, put_records):
    """A record cap that falls inside an aggregate ends the range at a sub-sequence number:
    computed again it gives the same user records, and the next batch starts right after
    them (with a fresh iterator: the page did not end there). A read that ended at a page
    boundary hands its iterator on, and the next read goes on from it."""
    stream = make_stream(1)
    config = make_config(stream)
    BatchRangeTable(config).create_table_if_not_exists()
    (aggregate,) = put_aggregated(stream, [(f"k{i}", f"u{i}") for i in range(10)], per_aggregate=10)
    shard = aggregate.shard_id
    trim = ExtendedSequenceNumber("TRIM_HORIZON")
    planned = ShardRange("stream-d", shard, 1000, trim, None, 1000, max_records=4,
                         time_budget_s=5, start=trim)
    records, report = read_shard_range(config, planned)
    assert [r.binary_data for r in records] == [f"u{i}".encode() for i in range(4)]
    assert report.batch_range.end.sub_sequence_number == 3 and report.next_iterator is None
    put_records(stream, [("k", "after")])
    again, _ = read_shard_range(config, planned, fresh=False)  # a lost block, say
    assert again == records
    rest, rest_report = read_shard_range(config, ShardRange(
        "stream-d", shard, 2000, trim, None, 1000, max_records=1000, time_budget_s=5,
        start=report.batch_range.next_start))
    assert [r.binary_data for r in rest] == [f"u{i}".encode() for i in range(4, 10)] + [b"after"]
    assert rest_report.next_iterator is not None and rest_report.get_shard_iterator_calls == 1
    put_records(stream, [("k", "later")])
    later, later_report = read_shard_range(config, ShardRange(
        "stream-d", shard, 3000, trim, None, 1000, max_records=1000, time_budget_s=5,
        start=rest_report.batch_range.next_start, iterator=rest_report.next_iterator))
    assert [r.binary_data for r in later] == [b"later"]
    assert later_report.get_shard_iterator_calls == 0


@pytest.mark.matrix
@pytest.mark.spark
def test_two_streams_derived_from_one_read_each_batch_once(sc, env, make_stream, put_records,
                                                           unique_app_name):
    """PySpark pipelines a derived DStream's functions into our batch function, so two
    output operations on two derived streams (a word count and a record count) call it
    twice per batch. The second call gets the batch already read: one read-ahead, one
    range per shard and batch, and the shard's records counted once."""
    stream = make_stream(2)
    put_records(stream, [(f"pk{i}", f"w{i % 3} x") for i in range(200)])
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream, env)
    words = collected(kstream.flatMap(lambda line: line.split(" ")))
    lines = collected(kstream.map(lambda line: line.upper()))
    ssc.start()
    try:
        wait_until(lambda: len(lines) >= 200 and len(words) >= 400, 90, "every record")
        metrics = kstream.metrics()
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert len(lines) == 200 and len(words) == 400
    assert sum(m["records"] for m in metrics.values()) == 200
