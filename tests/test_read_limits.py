"""Kinesis' per-shard read limits: the fault proxy's limits mode (tests/fault_proxy.py) and
how the executors' reads behave at those limits.

The limiter is tested on a fake clock; the proxy and the reads on kinesis-local."""
from __future__ import annotations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from emulators import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY
from fault_proxy import MiB, ShardLimits

from kinesis_dstream.aws.range_table import BatchRangeTable
from kinesis_dstream.records import ExtendedSequenceNumber
from kinesis_dstream.retrieval import ShardRange, read_shard_range

SHARD = "shardId-000000000000"


def unretried_kinesis(endpoint: str):
    """A boto3 client that shows every refusal (botocore retries throttles by itself)."""
    return boto3.client("kinesis", endpoint_url=endpoint, region_name=DUMMY_REGION,
                        aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                        aws_secret_access_key=DUMMY_SECRET_ACCESS_KEY,
                        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.unit
def test_get_records_is_served_while_the_shards_byte_budget_is_positive():
    clock = FakeClock()
    limits = ShardLimits(clock=clock)
    assert limits.admit("GetRecords", SHARD)
    limits.charge(SHARD, 10 * MiB)  # a full page: about 4 s of debt (2 MiB/s, 2 MiB burst)
    refused_for = 0.0
    while not limits.admit("GetRecords", SHARD):
        clock.now += 0.5
        refused_for += 0.5
    assert refused_for == 4.5  # the budget is positive again after 8 MiB / 2 MiB/s
    assert limits.refused[("GetRecords", SHARD)] == 9
    # another shard has a budget of its own
    assert limits.admit("GetRecords", "shardId-000000000001")


@pytest.mark.unit
def test_five_calls_a_second_per_shard_and_operation():
    clock = FakeClock()
    limits = ShardLimits(clock=clock)
    assert all(limits.admit("GetShardIterator", SHARD) for _ in range(5))
    assert not limits.admit("GetShardIterator", SHARD)
    assert all(limits.admit("GetRecords", SHARD) for _ in range(5))  # small pages: no debt
    assert not limits.admit("GetRecords", SHARD)
    clock.now += 1.0
    assert limits.admit("GetShardIterator", SHARD) and limits.admit("GetRecords", SHARD)
    assert limits.refused == {("GetShardIterator", SHARD): 1, ("GetRecords", SHARD): 1}
    # calls the proxy cannot attribute to a shard are not limited
    assert limits.admit("GetRecords", "") and limits.unattributed == 1
    assert limits.admit("ListShards", "")


@pytest.mark.unit
def test_an_idle_shard_saves_no_more_than_its_burst():
    clock = FakeClock()
    limits = ShardLimits(clock=clock, bytes_per_s=1000, burst_bytes=1000)
    clock.now += 60
    assert limits.admit("GetRecords", SHARD)
    limits.charge(SHARD, 2500)
    clock.now += 1.0
    assert not limits.admit("GetRecords", SHARD)  # 1000 - 2500 + 1000 = -500
    clock.now += 0.6
    assert limits.admit("GetRecords", SHARD)


@pytest.mark.emulator
def test_the_proxy_refuses_as_kinesis_does_and_follows_iterators_to_their_shard(
        make_stream, put_records, make_fault_proxy):
    stream = make_stream(2)
    put_records(stream, [(f"k{i}", "x" * 1000) for i in range(200)])
    clock = FakeClock()  # the limiter's time stands still unless the test moves it
    limits = ShardLimits(bytes_per_s=10_000, clock=clock)  # 1,000 bytes: a tenth of a second
    proxy = make_fault_proxy(share=0.0, limits=limits)
    kinesis = unretried_kinesis(proxy.endpoint)
    iterators = [kinesis.get_shard_iterator(StreamName=stream, ShardId=SHARD,
                                            ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
                 for _ in range(5)]
    with pytest.raises(ClientError) as refused:
        kinesis.get_shard_iterator(StreamName=stream, ShardId=SHARD,
                                   ShardIteratorType="TRIM_HORIZON")
    error = refused.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error["Error"]["Code"] == "ProvisionedThroughputExceededException"
    page = kinesis.get_records(ShardIterator=iterators[0], Limit=10)
    assert len(page["Records"]) == 10
    with pytest.raises(ClientError) as refused:  # 10,000 bytes charged: about 1 s of debt
        kinesis.get_records(ShardIterator=page["NextShardIterator"], Limit=10)
    assert refused.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert limits.served_bytes[SHARD] == 10_000
    assert limits.refused == {("GetShardIterator", SHARD): 1, ("GetRecords", SHARD): 1}
    clock.now += 1.0
    assert len(kinesis.get_records(ShardIterator=page["NextShardIterator"], Limit=10)["Records"]) == 10
    assert proxy.shard_calls[("GetRecords", "", SHARD)] == 2


@pytest.mark.emulator
def test_reads_at_the_limits_wait_throttling_out_and_lose_nothing(
        make_config, make_stream, put_records, make_fault_proxy):
    """read_shard_range without Spark, through the limits proxy with a small byte budget
    (25 kB/s: a 50-record page of 1,000-byte records costs 2 s). A new range hands out what
    it read when throttled; the recorded range, read again (a lost block, storageLevel NONE),
    waits the throttles out and gives exactly its records; a new range refused before its
    first record gives up after one pause (two refusals at most) instead of holding its
    core; batch after batch, every record comes once, in order."""
    stream = make_stream(1)
    limits = ShardLimits(bytes_per_s=25_000, burst_bytes=25_000)
    proxy = make_fault_proxy(share=0.0, limits=limits)
    config = make_config(stream, kinesis_endpoint=proxy.endpoint, max_records=50)
    BatchRangeTable(config).create_table_if_not_exists()
    sent = [f"{i:04d}".ljust(1000, "x") for i in range(150)]
    shard = put_records(stream, [("k", v) for v in sent])[0].shard_id

    def planned(batch_ms: int) -> ShardRange:
        return ShardRange("stream-l", shard, batch_ms, ExtendedSequenceNumber("TRIM_HORIZON"),
                          None, 1000, max_records=1000, time_budget_s=5)

    first, report = read_shard_range(config, planned(1000))
    assert len(first) == 50 and report.throttled == 1  # the second page was refused
    assert (report.get_records_calls, report.get_records_served) == (2, 1)
    refused_before = dict(limits.refused)
    again, again_report = read_shard_range(config, planned(1000), fresh=False)
    assert again == first and again_report.recorded
    assert again_report.throttled >= 1  # the 2 s debt of the first page, waited out
    # getRecords.Success counts answered GetRecords only: a refused GetShardIterator is a
    # refusal, but no GetRecords call.
    refused_pages = (limits.refused.get(("GetRecords", shard), 0)
                     - refused_before.get(("GetRecords", shard), 0))
    assert again_report.get_records_served == again_report.get_records_calls - refused_pages >= 1
    got, empty_throttled, batch_ms = list(first), [], 1000
    while len(got) < len(sent):
        batch_ms += 1000
        assert batch_ms < 60_000, f"only {len(got)} records read"
        records, report = read_shard_range(config, planned(batch_ms))
        got.extend(records)
        if not records:
            assert not report.recorded
            empty_throttled.append(report.throttled)
    assert [r.binary_data.decode() for r in got] == sent
    assert empty_throttled and max(empty_throttled) <= 2, empty_throttled
    assert sum(limits.refused.values()) >= 3


@pytest.mark.emulator
def test_a_retry_refused_before_its_first_record_hands_out_the_recorded_range_converted(
        make_config, make_stream, put_records, make_fault_proxy):
    """A task retry whose every GetRecords is refused (a throttle; under fan-out the 5 s
    rule) finds its batch's range recorded by the first computation and hands that out, as
    the caller converts it (the SQL source's Arrow rows), never the raw records."""
    stream = make_stream(1)
    proxy = make_fault_proxy(share=0.0)
    config = make_config(stream, kinesis_endpoint=proxy.endpoint)
    BatchRangeTable(config).create_table_if_not_exists()
    shard = put_records(stream, [("k", f"r{i}") for i in range(5)])[0].shard_id
    start = ExtendedSequenceNumber("TRIM_HORIZON")
    planned = ShardRange("stream-c", shard, 1000, start, None, 1000, max_records=1000,
                         time_budget_s=5, start=start)

    def convert(records: list, _config: object) -> list[str]:
        return [r.binary_data.decode().upper() for r in records]

    first, report = read_shard_range(config, planned, convert=convert)
    assert first == [f"R{i}" for i in range(5)] and report.recorded
    proxy.share = 1.0  # every GetRecords of the retry's own read is refused
    proxy.max_injections = proxy.injected + 2
    again, again_report = read_shard_range(config, planned, convert=convert)
    assert again == first and again_report.recorded
    assert proxy.injected == proxy.max_injections  # its own read was refused


@pytest.mark.spark
@pytest.mark.parametrize("storage", ["default", "NONE"])
def test_a_dstream_drains_a_backlog_at_the_limits_exactly(
        sc, aws_env, dynamodb, make_stream, make_fault_proxy, put_records, unique_app_name,
        storage, caplog):
    """Real Spark on local-cluster: a 4-shard backlog of 1,000-byte records read through the
    limits proxy (128 KiB/s per shard, so a couple of MB meet the limits for seconds). With
    storageLevel NONE a second output operation makes every batch read its recorded ranges
    again, throttled as well. Every record comes once in each output, no batch fails, and
    the refusals the reads waited out are counted in metrics() and in CloudWatch."""
    from pyspark import StorageLevel

    from emulators import client
    from spark_helpers import collected, create, make_ssc, wait_until
    from test_metrics import listed

    from kinesis_dstream import MetricsLevel
    from kinesis_dstream.worker import metrics as m

    stream = make_stream(4)
    sent = [f"{i:05d}".ljust(1000, "x") for i in range(2000)]
    put_records(stream, [(f"pk{i}", v) for i, v in enumerate(sent)])
    limits = ShardLimits(bytes_per_s=128 * 1024)
    proxy = make_fault_proxy(share=0.0, limits=limits)
    extra = {} if storage == "default" else {"storageLevel": StorageLevel.NONE}
    ssc = make_ssc(sc)
    kstream = create(ssc, unique_app_name, stream,
                     dict(kinesis=proxy.endpoint, dynamodb=dynamodb),
                     metricsLevel=MetricsLevel.DETAILED, cloudWatchEndpoint=dynamodb,
                     configOverrides={"max_records": 250, "metrics_buffer_time_ms": 200},
                     **extra)
    rows = collected(kstream)
    # a second output operation on the same DStream (not on a derived one: PySpark would
    # pipeline that one's functions into a batch function of its own)
    again = collected(kstream) if storage == "NONE" else None
    caplog.set_level("ERROR", logger="kinesis_dstream")
    ssc.start()
    try:
        wait_until(lambda: len(rows) >= len(sent) and (again is None or len(again) >= len(sent)),
                   240, "every record")
        throttled = lambda: sum(s["throttled"] for s in kstream.metrics().values())  # noqa: E731
        wait_until(lambda: throttled() > 0, 60, "throttles counted in metrics()")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)  # flushes the metrics
    assert sorted(rows) == sent
    if again is not None:
        assert sorted(again) == sent
    assert sum(limits.refused.values()) > 0, "the limits never bit"
    failures = [r.getMessage() for r in caplog.records if "fail" in r.getMessage().lower()]
    assert failures == []
    cloudwatch = client("cloudwatch", dynamodb)
    assert {"Operation": "ProcessTask"} in listed(cloudwatch, unique_app_name)[
        m.READ_THROUGHPUT_EXCEEDED]


@pytest.mark.unit
def test_a_partition_computed_twice_reports_the_refusals_of_both_computations():
    """The reports accumulator keeps one report per (stream, shard, batch), the last
    computation's, but adds up what every computation was refused: a re-read of a recorded
    range at the limits (storageLevel NONE) is throttled too, and is counted."""
    from kinesis_dstream.aws.range_table import BatchRange
    from kinesis_dstream.retrieval import ReadReport
    from kinesis_dstream.spark.task import RangeReports

    key = ("stream-r", SHARD, 1000)
    batch_range = BatchRange("stream-r", SHARD, 1000, ExtendedSequenceNumber("TRIM_HORIZON"))
    merged = RangeReports().addInPlace({key: ReadReport(batch_range, throttled=2, faults=1)},
                                       {key: ReadReport(batch_range, throttled=3)})
    assert (merged[key].throttled, merged[key].faults) == (5, 1)
    fresh = RangeReports().addInPlace({}, {key: ReadReport(batch_range, throttled=3)})
    assert fresh[key].throttled == 3
