"""format("kinesis") jobs written for qubole's kinesis-sql: its sink names (kinesis.executor.*)
with its meaning and defaults, failOnDataLoss true by default when the options use its names,
and its per-shard JSON startingPosition."""
from __future__ import annotations

import json
import logging
from collections import Counter

import pytest

from kinesis_dstream.aws.kinesis import Shard
from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.local import DUMMY_ACCESS_KEY_ID, DUMMY_SECRET_ACCESS_KEY
from kinesis_dstream.retrieval import StartingPosition
from kinesis_dstream.sql.initial_positions import initial_positions
from kinesis_dstream.sql.options import parse_options, parse_source_options
from kinesis_dstream.sql.starting_position import ShardStarts, parse_starting_position
from kinesis_dstream.sql.vocabulary import default_fail_on_data_loss, vocabulary

pytestmark = pytest.mark.timeout(300)

QUBOLE = {"streamName": "orders", "endpointUrl": "http://127.0.0.1:1"}


def lowered(options: dict[str, str]) -> dict[str, str]:
    """What Spark hands a Python data source: every key lower-cased."""
    return {k.lower(): v for k, v in options.items()}


# -- the sink ----------------------------------------------------------------------------------
@pytest.mark.unit
def test_qubole_sink_names_mean_the_sink_options_with_qubole_defaults(caplog):
    with caplog.at_level(logging.WARNING, logger="kinesis_dstream.sql.options"):
        defaults = parse_options(lowered(QUBOLE))
        given = parse_options(lowered({
            **QUBOLE, "kinesis.executor.aggregationEnabled": "false",
            "kinesis.executor.maxConnections": "4",
            "kinesis.executor.recordMaxBufferedTime": "250",
            "kinesis.executor.flushWaitTimeMillis": "30"}))
        typo = parse_options(lowered({**QUBOLE, "kniesis.executor.flushwaittimemillis": "40",
                                      "awsUseInstanceProfile": "true"}))
    # qubole's documented defaults are ours: aggregated, 1 connection, 1000 ms, 100 ms.
    assert (defaults.sink.aggregation_enabled, defaults.sink.max_connections,
            defaults.sink.record_max_buffered_time_ms, defaults.sink.flush_wait_time_ms) == \
        (True, 1, 1000, 100)
    assert (given.sink.aggregation_enabled, given.sink.max_connections,
            given.sink.record_max_buffered_time_ms, given.sink.flush_wait_time_ms) == \
        (False, 4, 250, 30)
    assert typo.sink.flush_wait_time_ms == 40  # as qubole's README spells it
    assert not (defaults.unknown or given.unknown or typo.unknown)
    assert "unknown" not in caplog.text.lower(), caplog.text


@pytest.mark.unit
def test_qubole_sink_bad_values_are_refused_by_name():
    with pytest.raises(ConfigurationError, match="kinesis.executor.aggregationenabled"):
        parse_options(lowered({**QUBOLE, "kinesis.executor.aggregationEnabled": "maybe"}))
    with pytest.raises(ConfigurationError, match="maxconnections"):
        parse_options(lowered({**QUBOLE, "kinesis.executor.maxConnections": "0"}))


# -- failOnDataLoss ----------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize(("keys", "expected"), [
    (["streamName", "endpointUrl"], "qubole"),
    (["streamname", "kinesis.executor.maxFetchTimeInMs"], "qubole"),
    (["streamName", "awsSTSRoleARN"], "qubole"),
    # Our range table's options are anyone's: a job moved from qubole may add them.
    (["streamName", "endpointUrl", "kinesis.dynamodb.tableName",
      "kinesis.dynamodb.endpointUrl"], "qubole"),
    (["streamName", "region"], "databricks"),
    (["streamName", "initialPosition", "kinesis.dynamodb.endpointUrl"], "databricks"),
    (["kinesis.streamName", "kinesis.endpointUrl"], "awslabs"),
    (["streamName"], None),  # qubole's and Databricks' alike
    (["streamName", "endpointUrl", "region"], None),  # mixed
    (["kinesis.streamName", "endpointUrl"], None),
])
def test_the_vocabulary_is_the_one_connector_whose_own_names_are_used(keys, expected):
    assert vocabulary(keys) == expected
    assert default_fail_on_data_loss(keys) is (expected == "qubole")


@pytest.mark.unit
def test_fail_on_data_loss_defaults_to_true_with_qubole_names_only():
    assert parse_source_options(lowered(QUBOLE)).fail_on_data_loss
    assert parse_source_options(lowered(QUBOLE)).config.fail_on_data_loss  # the executors'
    assert not parse_source_options(lowered({**QUBOLE, "failOnDataLoss": "false"})) \
        .config.fail_on_data_loss
    assert not parse_source_options({"streamName": "s", "region": "eu-west-1"}) \
        .fail_on_data_loss  # Databricks' names: ours
    assert not parse_source_options({"kinesis.streamName": "s",
                                     "kinesis.endpointUrl": "http://127.0.0.1:1"}) \
        .fail_on_data_loss  # awslabs'
    assert parse_source_options({"kinesis.streamName": "s", "kinesis.failOnDataLoss": "true",
                                 "kinesis.endpointUrl": "http://127.0.0.1:1"}).fail_on_data_loss


# -- per-shard startingPosition ----------------------------------------------------------------
QUBOLE_OFFSET = {
    "shardId-000000000001": {"iteratorType": "AFTER_SEQUENCE_NUMBER",
                             "iteratorPosition": "49605240428222307037115827613554798409561082419"},
    "metadata": {"streamName": "orders", "batchId": "7"},
    "shardId-000000000000": {"iteratorType": "AT_SEQUENCE_NUMBER",
                             "iteratorPosition": "49605240428200006291917297020490128157480794"},
    "shardId-000000000002": {"iteratorType": "at_timestamp", "iteratorPosition": "1700000000500"},
    "shardId-000000000003": {"iteratorType": "TRIM_HORIZON", "iteratorPosition": ""},
    "shardId-000000000004": {"iteratorType": "SHARD_END"},
}


@pytest.mark.unit
def test_qubole_per_shard_json_reads_each_shard_and_skips_metadata():
    starts = parse_starting_position(json.dumps(QUBOLE_OFFSET), "startingPosition")
    assert isinstance(starts, ShardStarts) and starts.default == StartingPosition("LATEST")
    assert starts.shards == {
        "shardId-000000000001": StartingPosition.after(
            "49605240428222307037115827613554798409561082419"),
        "shardId-000000000000": StartingPosition(
            "AT_SEQUENCE_NUMBER", sequence_number="49605240428200006291917297020490128157480794"),
        "shardId-000000000002": StartingPosition("AT_TIMESTAMP", timestamp=1700000000.5),
        "shardId-000000000003": StartingPosition("TRIM_HORIZON"),
        "shardId-000000000004": StartingPosition("SHARD_END")}


@pytest.mark.unit
@pytest.mark.parametrize(("text", "says"), [
    ('{"shardId-0": {"iteratorType": "AT_SEQUENCE_NUMBER"', "cannot read .* as JSON"),
    ('{"shardId-0": "LATEST"}', "shard 'shardId-0'.*expected"),
    ('{"shardId-0": {"iteratorType": "NEWEST"}}', "iteratorType 'NEWEST' is not one of"),
    ('{"shardId-0": {"iteratorType": "AT_SEQUENCE_NUMBER", "iteratorPosition": "x1"}}',
     "not a sequence number"),
    ('{"shardId-0": {"iteratorType": "AT_TIMESTAMP", "iteratorPosition": "2020-01-01"}}',
     "not epoch milliseconds"),
    ('{"shardId-0": {"iteratorType": "LATEST", "position": "1"}}', "expected"),
    ('{"metadata": {"batchId": "1"}}', "no shard in"),
])
def test_a_bad_per_shard_start_is_refused_naming_the_option(text, says):
    named = r"^kinesis.startingPosition \(as startingposition\): "
    with pytest.raises(ConfigurationError, match=named + f".*{says}"):
        parse_source_options({**lowered(QUBOLE), "startingposition": text})


@pytest.mark.unit
def test_per_shard_starts_become_offset_positions_others_start_latest(caplog):
    starts = parse_source_options({**lowered(QUBOLE),
                                   "startingposition": json.dumps(QUBOLE_OFFSET)})
    assert starts.starting_position == StartingPosition("LATEST")
    listing = [Shard(f"shardId-00000000000{i}", None, None, "0", "1", "1", None)
               for i in range(6)]
    listing.append(Shard("shardId-000000000006", "shardId-000000000004", None, "0", "1", "9",
                         None))
    with caplog.at_level(logging.WARNING):
        positions = initial_positions(listing, starts.starting_position, 1000.0,
                                      shard_starts={**starts.shard_starts,
                                                    "shardId-000000000099": StartingPosition(
                                                        "TRIM_HORIZON")})
    at, after = ("49605240428200006291917297020490128157480794",
                 "49605240428222307037115827613554798409561082419")
    assert positions == {
        "shardId-000000000000": {"after": at, "sub": -1},  # at it: none of its records dropped
        "shardId-000000000001": {"after": after, "sub": 2**31 - 1},  # after all of it
        "shardId-000000000002": {"at": "AT_TIMESTAMP", "ts": 1700000000.5},
        "shardId-000000000003": {"at": "TRIM_HORIZON"},
        "shardId-000000000004": {"ended": True},
        "shardId-000000000005": {"at": "AT_TIMESTAMP", "ts": 1000.0},  # not named: LATEST
        # A child of a named shard: all of it, once its parent is done.
        "shardId-000000000006": {"at": "TRIM_HORIZON", "wait": ["shardId-000000000004"]},
    }
    assert "shardId-000000000099" in caplog.text


@pytest.mark.unit
def test_per_shard_start_with_several_streams_or_a_lease_table_is_refused():
    text = json.dumps(QUBOLE_OFFSET)
    with pytest.raises(ConfigurationError, match="one stream; this query reads 2"):
        parse_source_options({"streamname": "a,b", "endpointurl": "http://127.0.0.1:1",
                              "startingposition": text})
    with pytest.raises(ConfigurationError, match="give one"):
        parse_source_options({**lowered(QUBOLE), "startingposition": text,
                              "applicationname": "app"})


# -- end to end --------------------------------------------------------------------------------
@pytest.mark.spark
@pytest.mark.parametrize("aggregation", ["false", None])
def test_qubole_named_sink_writes_one_kinesis_record_per_row_without_aggregation(
        spark, kinesis_local, make_stream, aggregation):
    """On local-cluster[2,1,1024]: qubole's README sink options, format("kinesis").
    aggregationEnabled=false -> one plain Kinesis record per row; by default (qubole's: true)
    rows are KPL-aggregated."""
    from test_producer import read_back

    stream = make_stream(2)
    rows = [(f"key-{i % 37}", f"row-{i}") for i in range(300)]
    df = spark.createDataFrame(rows, "partitionKey string, data string").repartition(2)
    options = {"streamName": stream, "endpointUrl": kinesis_local,
               "awsAccessKeyId": DUMMY_ACCESS_KEY_ID, "awsSecretKey": DUMMY_SECRET_ACCESS_KEY,
               "kinesis.executor.maxConnections": "2",
               "kinesis.executor.recordMaxBufferedTime": "500"}
    if aggregation is not None:
        options["kinesis.executor.aggregationEnabled"] = aggregation
    df.write.format("kinesis").options(**options).mode("append").save()
    raw, users = read_back(kinesis_local, stream)  # GetRecords over every shard
    assert Counter((u.partition_key, u.binary_data) for u in users) == \
        Counter((k, d.encode()) for k, d in rows)
    if aggregation == "false":
        assert len(raw) == len(rows)
        assert not any(u.aggregated for u in users)
    else:
        assert len(raw) < len(rows) and all(u.aggregated for u in users)


@pytest.mark.spark
def test_a_query_starts_each_shard_where_qubole_per_shard_json_says(
        spark, kinesis_local, dynamodb, aws_env, make_stream, put_records, unique_app_name,
        tmp_path):
    """On local-cluster[2,1,1024]: one shard AT_SEQUENCE_NUMBER (that record included), the
    other AFTER_SEQUENCE_NUMBER (that record left out); every later record read once."""
    from spark_helpers import wait_until
    from test_sql_source import Batches, start_query, stop

    stream = make_stream(2)
    put = put_records(stream, [(f"k{i}", f"r{i}") for i in range(40)])
    by_shard: dict[str, list] = {}
    for i, result in enumerate(put):
        by_shard.setdefault(result.shard_id, []).append((i, result.sequence_number))
    (at_shard, at_records), (after_shard, after_records) = sorted(by_shard.items())
    assert len(at_records) > 3 and len(after_records) > 3  # both shards hold records
    at_index, at_seq = at_records[2]
    after_index, after_seq = after_records[2]
    starts = {at_shard: {"iteratorType": "AT_SEQUENCE_NUMBER", "iteratorPosition": at_seq},
              after_shard: {"iteratorType": "AFTER_SEQUENCE_NUMBER",
                            "iteratorPosition": after_seq},
              "metadata": {"streamName": stream, "batchId": "7"}}
    expected = Counter(f"r{i}".encode() for i, _ in at_records[2:] + after_records[3:])
    opts = {"streamName": stream, "endpointUrl": kinesis_local, "regionName": "us-east-1",
            "startingPosition": json.dumps(starts), "kinesis.dynamodb.endpointUrl": dynamodb,
            "kinesis.dynamodb.tableName": unique_app_name}
    sink = Batches()
    query = start_query(spark, opts, str(tmp_path / "checkpoint"), sink)
    try:
        wait_until(lambda: sum(sink.data().values()) >= sum(expected.values()), 120,
                   "the records after the given positions")
        wait_until(lambda: not query.status["isTriggerActive"], 60, "the trigger to end")
    finally:
        stop(query)
    assert sink.data() == expected
