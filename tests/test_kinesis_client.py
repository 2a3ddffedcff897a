"""KinesisClient: retries with the Spark settings, errors translated and naming what failed.

A stubbed boto3 client (botocore's Stubber) plays Kinesis; the retry sleeps are recorded, not
slept. The unreachable-endpoint case uses a real client against a closed loopback port.
"""
from __future__ import annotations

import datetime as dt
import socket

import boto3
import pytest
from botocore.stub import Stubber

from kinesis_dstream.aws.kinesis import KinesisClient, Shard
from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import (
    EndpointUnreachableError,
    ExpiredIteratorError,
    RetriesExhaustedError,
    StreamNotFoundError,
    UnreachableAfterRetriesError,
)

STREAM = "orders-stream"
ENDPOINT = "http://127.0.0.1:4568"


def make_config(**overrides) -> ConsumerConfig:
    settings = dict(application_name="app", stream_name=STREAM, region_name="eu-west-1",
                    kinesis_endpoint=ENDPOINT, aws_access_key_id="AKIAIOSFODNN7EXAMPLE",
                    aws_secret_key="secret")
    settings.update(overrides)
    return ConsumerConfig(**settings)


@pytest.fixture()
def stubbed():
    """(KinesisClient, Stubber, recorded sleeps) with the default retry settings."""
    config = make_config()
    raw = boto3.client("kinesis", region_name="eu-west-1", endpoint_url=ENDPOINT,
                       aws_access_key_id="AKIAIOSFODNN7EXAMPLE", aws_secret_access_key="secret")
    sleeps: list[float] = []
    with Stubber(raw) as stubber:
        yield KinesisClient(config, client=raw, sleep=sleeps.append, rand=lambda: 1.0), stubber, sleeps
        stubber.assert_no_pending_responses()


SUMMARY = {"StreamDescriptionSummary": {
    "StreamName": STREAM, "StreamARN": f"arn:aws:kinesis:eu-west-1:000000000000:stream/{STREAM}",
    "StreamStatus": "ACTIVE", "RetentionPeriodHours": 24,
    "StreamCreationTimestamp": dt.datetime(2024, 1, 1), "EnhancedMonitoring": [],
    "OpenShardCount": 1}}


@pytest.mark.unit
def test_missing_stream_fails_at_once_naming_stream_region_and_endpoint(stubbed):
    client, stubber, sleeps = stubbed
    stubber.add_client_error("describe_stream_summary", "ResourceNotFoundException",
                             f"Stream {STREAM} under account 000000000000 not found.")
    with pytest.raises(StreamNotFoundError) as info:
        client.describe_stream_summary()
    message = str(info.value)
    assert STREAM in message and "eu-west-1" in message and ENDPOINT in message
    assert sleeps == []


@pytest.mark.unit
def test_throttling_is_retried_with_doubling_waits_then_succeeds(stubbed):
    client, stubber, sleeps = stubbed
    stubber.add_client_error("describe_stream_summary", "ProvisionedThroughputExceededException")
    stubber.add_client_error("describe_stream_summary", "LimitExceededException")
    stubber.add_response("describe_stream_summary", SUMMARY, {"StreamName": STREAM})
    assert client.describe_stream_summary()["StreamStatus"] == "ACTIVE"
    assert sleeps == [0.1, 0.2]


@pytest.mark.unit
def test_throttling_past_max_attempts_raises_retries_exhausted(stubbed):
    client, stubber, sleeps = stubbed
    for _ in range(3):
        stubber.add_client_error("get_records", "ProvisionedThroughputExceededException",
                                 http_status_code=400)
    with pytest.raises(RetriesExhaustedError) as info:
        client.get_records("iter-1", 100, shard_id="shardId-000000000001")
    assert "Gave up after 3 attempts" in str(info.value)
    assert "shardId-000000000001" in str(info.value)
    assert not isinstance(info.value, EndpointUnreachableError)
    assert sleeps == [0.1, 0.2]


@pytest.mark.unit
def test_spark_retry_settings_are_honoured():
    config = make_config().with_spark_conf({"spark.streaming.kinesis.retry.waitTime": "50ms",
                                            "spark.streaming.kinesis.retry.maxAttempts": "5"})
    raw = boto3.client("kinesis", region_name="eu-west-1", endpoint_url=ENDPOINT,
                       aws_access_key_id="AKIAIOSFODNN7EXAMPLE", aws_secret_access_key="secret")
    sleeps: list[float] = []
    client = KinesisClient(config, client=raw, sleep=sleeps.append, rand=lambda: 1.0)
    with Stubber(raw) as stubber:
        for _ in range(5):
            stubber.add_client_error("get_records", "InternalFailure", http_status_code=500)
        with pytest.raises(RetriesExhaustedError):
            client.get_records("iter", 10)
    assert sleeps == [0.05, 0.1, 0.2, 0.4]


@pytest.mark.unit
def test_expired_iterator_is_not_retried(stubbed):
    client, stubber, sleeps = stubbed
    stubber.add_client_error("get_records", "ExpiredIteratorException", "Iterator expired")
    with pytest.raises(ExpiredIteratorError):
        client.get_records("old-iterator", 10)
    assert sleeps == []


def _shard(shard_id: str, parent: str | None = None, ending: str | None = None) -> dict:
    item = {"ShardId": shard_id,
            "HashKeyRange": {"StartingHashKey": "0",
                             "EndingHashKey": "340282366920938463463374607431768211455"},
            "SequenceNumberRange": {"StartingSequenceNumber": "100"}}
    if parent:
        item["ParentShardId"] = parent
    if ending:
        item["SequenceNumberRange"]["EndingSequenceNumber"] = ending
    return item


@pytest.mark.unit
def test_list_shards_follows_next_token(stubbed):
    client, stubber, _ = stubbed
    stubber.add_response("list_shards", {"Shards": [_shard("shardId-000000000000", ending="199")],
                                         "NextToken": "page-2"}, {"StreamName": STREAM})
    stubber.add_response("list_shards", {"Shards": [_shard("shardId-000000000001",
                                                           parent="shardId-000000000000")]},
                         {"NextToken": "page-2"})
    shards = client.list_shards()
    assert [s.shard_id for s in shards] == ["shardId-000000000000", "shardId-000000000001"]
    assert shards[0].is_closed and shards[0].ending_sequence_number == "199"
    assert not shards[1].is_closed
    assert shards[1].parent_shard_ids == ["shardId-000000000000"]
    assert shards[1].ending_hash_key == "340282366920938463463374607431768211455"
    assert isinstance(shards[0], Shard)


@pytest.mark.unit
def test_get_shard_iterator_parameters(stubbed):
    client, stubber, _ = stubbed
    stubber.add_response("get_shard_iterator", {"ShardIterator": "it-1"},
                         {"StreamName": STREAM, "ShardId": "s-1",
                          "ShardIteratorType": "AT_SEQUENCE_NUMBER",
                          "StartingSequenceNumber": "12345"})
    stubber.add_response("get_shard_iterator", {"ShardIterator": "it-2"},
                         {"StreamName": STREAM, "ShardId": "s-1", "ShardIteratorType": "AT_TIMESTAMP",
                          "Timestamp": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)})
    assert client.get_shard_iterator("s-1", "AT_SEQUENCE_NUMBER", sequence_number="12345") == "it-1"
    epoch = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp()
    assert client.get_shard_iterator("s-1", "AT_TIMESTAMP", timestamp=epoch) == "it-2"
    with pytest.raises(ValueError):
        client.get_shard_iterator("s-1", "AT_SEQUENCE_NUMBER")
    with pytest.raises(ValueError):
        client.get_shard_iterator("s-1", "SOMEWHERE")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.unit
@pytest.mark.timeout(20)
def test_unreachable_endpoint_fails_naming_the_url_in_bounded_time():
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    client = KinesisClient(make_config(kinesis_endpoint=endpoint, connect_timeout_s=1.0))
    with pytest.raises(EndpointUnreachableError) as info:
        client.describe_stream_summary()
    assert endpoint in str(info.value)
    # Also what a shard consumer catches to wait and try later.
    assert isinstance(info.value, RetriesExhaustedError)
    assert isinstance(info.value, UnreachableAfterRetriesError)


@pytest.mark.emulator
def test_get_records_answers_are_botocores_own(kinesis_local, make_stream, put_records, aws_env):
    """The direct GetRecords parse gives what botocore's shape walk gives: binary data,
    arrival timestamps, a closed shard's ChildShards, and no null members."""
    import botocore.parsers

    from emulators import client as boto_client
    from emulators import wait_stream_active

    from kinesis_dstream.aws import botocore_parts, clients
    from kinesis_dstream.local import DUMMY_REGION

    stream = make_stream(1)
    config = make_config(stream_name=stream, kinesis_endpoint=kinesis_local,
                         region_name=DUMMY_REGION)
    put_records(stream, [(f"k{i}", bytes([i, 0, 255]) + "é".encode()) for i in range(20)])
    raw = boto_client("kinesis", kinesis_local)
    parent = raw.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    raw.split_shard(StreamName=stream, ShardToSplit=parent, NewStartingHashKey=str(2**127))
    wait_stream_active(raw, stream)

    def pages(kinesis) -> list[dict]:
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=parent,
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        answers = []
        while iterator and len(answers) < 20:
            answer = kinesis.get_records(ShardIterator=iterator, Limit=7)
            iterator = answer.pop("NextShardIterator", None)
            answer.pop("ResponseMetadata")
            answers.append(answer)
        return answers

    ours = pages(clients.make_client(config, "kinesis"))
    factory = botocore_parts.KinesisParserFactory
    plain_factory = factory.create_parser
    try:
        factory.create_parser = botocore.parsers.ResponseParserFactory.create_parser
        botocores = pages(clients.make_client(config, "kinesis"))
    finally:
        factory.create_parser = plain_factory
    assert ours == botocores
    assert sum(len(a["Records"]) for a in ours) == 20
    assert ours[0]["Records"][0]["Data"] == bytes([0, 0, 255]) + "é".encode()
    assert any(a.get("ChildShards") for a in ours)


@pytest.mark.unit
def test_clients_of_every_configuration_share_one_copy_of_botocore_s_models(aws_env):
    """An executor's Python worker keeps clients per configuration (per stream it reads):
    each must not parse and hold its own copy of the service and endpoint models."""
    from kinesis_dstream.aws.clients import make_client

    def config(app: str) -> ConsumerConfig:
        return ConsumerConfig(application_name=app, stream_name="s", region_name="us-east-1",
                              dynamodb_endpoint="http://127.0.0.1:9")

    first, second = make_client(config("a"), "dynamodb"), make_client(config("b"), "dynamodb")
    assert first is not second
    assert first.meta.service_model._service_description is \
        second.meta.service_model._service_description


STREAM_ARN = f"arn:aws:kinesis:us-west-2:111122223333:stream/{STREAM}"


@pytest.mark.unit
def test_a_stream_given_by_arn_is_named_by_arn_in_every_call_signed_in_its_region():
    """Cross-account reads through a resource policy: every call names the stream by
    StreamARN (never StreamName), and Kinesis signs in the ARN's region while DynamoDB and
    STS keep region_name."""
    from kinesis_dstream.aws.clients import make_client
    from kinesis_dstream.aws.producer import KinesisProducer

    config = make_config(stream_arn=STREAM_ARN)
    raw = make_client(config, "kinesis")
    assert raw.meta.region_name == "us-west-2" == config.kinesis_region
    assert make_client(config, "dynamodb").meta.region_name == "eu-west-1"
    client = KinesisClient(config, client=raw, sleep=lambda s: None)
    by_arn = {"StreamARN": STREAM_ARN}
    shard = {"ShardId": "shardId-000000000000",
             "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1"},
             "SequenceNumberRange": {"StartingSequenceNumber": "1"}}
    with Stubber(raw) as stubber:
        stubber.add_response("describe_stream_summary", SUMMARY, by_arn)
        stubber.add_response("list_shards", {"Shards": [shard], "NextToken": "t"}, by_arn)
        stubber.add_response("list_shards", {"Shards": []}, {"NextToken": "t"})
        stubber.add_response("get_shard_iterator", {"ShardIterator": "it"},
                             {**by_arn, "ShardId": "shardId-000000000000",
                              "ShardIteratorType": "TRIM_HORIZON"})
        stubber.add_response("get_records", {"Records": [], "NextShardIterator": "it2"},
                             {**by_arn, "ShardIterator": "it", "Limit": 5})
        stubber.add_response("put_records", {"Records": [
            {"SequenceNumber": "1", "ShardId": "shardId-000000000000"}]},
            {**by_arn, "Records": [{"Data": b"x", "PartitionKey": "k"}]})
        client.describe_stream_summary()
        assert [s.shard_id for s in client.list_shards()] == ["shardId-000000000000"]
        assert client.get_shard_iterator("shardId-000000000000", "TRIM_HORIZON") == "it"
        client.get_records("it", 5)
        producer = KinesisProducer(config, client=raw, aggregation=False)
        producer.put(b"x", "k")
        producer.flush()
        stubber.assert_no_pending_responses()


@pytest.mark.unit
def test_a_stream_arn_must_be_one_and_name_the_stream():
    with pytest.raises(Exception, match="not a Kinesis stream ARN"):
        make_config(stream_arn="orders-stream")
    with pytest.raises(Exception, match="is not the stream of stream_arn"):
        make_config(stream_arn=STREAM_ARN.replace(STREAM, "other"))
    assert make_config(stream_arn=STREAM_ARN, kinesis_region_name="ap-east-1").kinesis_region \
        == "ap-east-1"
    assert make_config().kinesis_region == "eu-west-1"


@pytest.mark.emulator
def test_a_stream_read_and_written_by_arn_at_kinesis_local(kinesis_local, make_stream, aws_env):
    """The ARN kinesis-local reports for a stream reads it: list, iterate, read and write by
    StreamARN alone."""
    from kinesis_dstream.aws.producer import KinesisProducer
    from kinesis_dstream.local import DUMMY_REGION

    stream = make_stream(1)
    by_name = KinesisClient(make_config(stream_name=stream, kinesis_endpoint=kinesis_local,
                                        region_name=DUMMY_REGION))
    arn = by_name.describe_stream_summary()["StreamARN"]
    config = make_config(stream_name=stream, stream_arn=arn, kinesis_endpoint=kinesis_local,
                         region_name=DUMMY_REGION)
    producer = KinesisProducer(config, aggregation=False)
    for i in range(5):
        producer.put(f"r{i}", f"k{i}")
    producer.flush()
    client = KinesisClient(config)
    assert client.describe_stream_summary()["StreamARN"] == arn
    [shard] = client.list_shards()
    iterator = client.get_shard_iterator(shard.shard_id, "TRIM_HORIZON")
    records = client.get_records(iterator, 100)["Records"]
    assert [r["Data"] for r in records] == [f"r{i}".encode() for i in range(5)]
