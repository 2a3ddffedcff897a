"""The awslabs options' effects at a Kinesis emulator, counted at a loopback proxy:
kinesis.getRecords.fetchIntervalMs spacing a reading's GetRecords calls, and the sink's
proxy options sending its calls through a proxy (tier 2: emulator, no Spark)."""
from __future__ import annotations

import pytest

from kinesis_dstream.aws.kinesis import KinesisClient
from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_REGION, DUMMY_SECRET_ACCESS_KEY
from kinesis_dstream.records import TRIM_HORIZON
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.retrieval import FetchPace, read_loop
from kinesis_dstream.sql.options import parse_options, parse_source_options
from kinesis_dstream.sql.reader import KinesisStreamReader

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def awslabs(stream: str, endpoint: str, **extra: str) -> dict[str, str]:
    return {"kinesis.streamName": stream, "kinesis.endpointUrl": endpoint,
            "kinesis.region": DUMMY_REGION, "kinesis.awsAccessKeyId": DUMMY_ACCESS_KEY_ID,
            "kinesis.awsSecretKey": DUMMY_SECRET_ACCESS_KEY, **extra}


def test_fetch_interval_ms_spaces_the_getrecords_calls_kinesis_sees(
        aws_env, make_stream, put_records, make_fault_proxy):
    """A backlog read one record a call for 1.5 s: GetRecords calls counted at the proxy
    follow kinesis.getRecords.fetchIntervalMs (at most 1 + 1.5 / period of them)."""
    stream = make_stream(1)
    put_records(stream, [f"r{i}" for i in range(200)])
    proxy = make_fault_proxy(share=0.0)

    def get_records_calls(fetch_interval_ms: str) -> int:
        before = sum(n for (op, _), n in proxy.calls.items() if op == "GetRecords")
        parsed = parse_source_options(awslabs(
            stream, proxy.endpoint, **{"kinesis.getRecords.fetchIntervalMs": fetch_interval_ms,
                                       "kinesis.getRecords.numberOfRecordsPerFetch": "1"}))
        pacing = KinesisStreamReader(parsed)._pacing(1)
        reading = read_loop.read(KinesisClient(parsed.config), parsed.config,
                                 "shardId-000000000000", ESN(TRIM_HORIZON), None,
                                 max_records=1000, time_budget_s=1.5,
                                 pace=FetchPace(pacing["max_bytes_per_s"],
                                                pacing["min_fetch_period_s"]))
        assert reading.more_left and len(reading.records) == reading.calls
        return sum(n for (op, _), n in proxy.calls.items() if op == "GetRecords") - before

    slow, fast = get_records_calls("500"), get_records_calls("50")
    assert slow <= 4 and fast >= 3 * slow, (fast, slow)


def test_the_sinks_calls_go_through_the_proxy_the_options_name(
        aws_env, kinesis_local, make_stream, make_fault_proxy):
    from kinesis_dstream.sql.sink import make_producer

    stream = make_stream(1)
    proxy = make_fault_proxy(share=0.0)
    port = proxy.endpoint.rsplit(":", 1)[1]
    options = parse_options(awslabs(stream, kinesis_local, **{
        "kinesis.sink.proxyAddress": "127.0.0.1", "kinesis.sink.proxyPort": port,
        "kinesis.sink.aggregationEnabled": "false"}))
    producer = make_producer(options)
    try:
        for i in range(20):
            producer.put(f"d{i}", f"k{i}")
        producer.flush()
    finally:
        producer.close()
    puts = sum(n for (op, _), n in proxy.calls.items() if op == "PutRecords")
    assert puts >= 1 and producer.stats.kinesis_records == 20
    # Without the options the same write goes straight to the emulator.
    direct = make_producer(parse_options(awslabs(stream, kinesis_local)))
    try:
        direct.put("d", "k")
        direct.flush()
    finally:
        direct.close()
    assert sum(n for (op, _), n in proxy.calls.items() if op == "PutRecords") == puts
