"""The Spark conf keys the DStream API reads (the StreamingContext's SparkConf), declared once.

kinesis-asl's retry keys, Spark Streaming's rate keys and ours under
``spark.streaming.kinesis.``: "config" options go to ``ConsumerConfig`` (its
``with_spark_conf``), "rate" ones to spark/rate.py's ``RateSettings``. No pyspark here: the
declaration is data, and docs/configuration.md is generated from it.
"""
from __future__ import annotations

from .config import (
    CONSUMER_TYPES,
    KCL_TABLE_KEYS,
    SPARK_BACKPRESSURE_ENABLED,
    SPARK_BACKPRESSURE_INITIAL_RATE,
    SPARK_CONSUMER_ARN,
    SPARK_CONSUMER_NAME,
    SPARK_CONSUMER_TYPE,
    SPARK_FAIL_ON_DATA_LOSS,
    SPARK_PID_DERIVED,
    SPARK_PID_INTEGRAL,
    SPARK_PID_MIN_RATE,
    SPARK_PID_PROPORTIONAL,
    SPARK_RECEIVER_MAX_RATE,
    SPARK_RETRY_MAX_ATTEMPTS,
    SPARK_RETRY_WAIT_TIME,
    SPARK_SHARDS_PER_TASK,
    stall_options,
    table_options,
)
from .settings import BOOLEAN, Duration, FrontEnd, Number, Option, Text, ValueType, Whole, parse_choice

CONSUMER_TYPE = ValueType(
    "GetRecords or SubscribeToShard (any case)",
    lambda label, value: CONSUMER_TYPES[parse_choice(label, value, tuple(CONSUMER_TYPES))])

SPARK_CONF = FrontEnd(
    name="Spark conf (DStream API)",
    doc="Keys of the StreamingContext's SparkConf read by KinesisUtils.createStream: "
        "kinesis-asl's retry keys and Spark Streaming's rate keys, with their names and "
        "defaults, and ours under spark.streaming.kinesis.",
    case_sensitive=True, noun="Spark conf key", owned_prefixes=("spark.streaming.kinesis.",),
    # Its warnings (an unknown key of ours) come from ConsumerConfig.with_spark_conf, which
    # reads the keys: config's logger.
    logger="kinesis_dstream.config",
    options=(
        Option(SPARK_RETRY_WAIT_TIME, Duration(None), "Positive wait before the first retry "
               "of a failed AWS call; doubles on each retry (kinesis-asl's key).", "100ms",
               field="retry_wait_time_ms"),
        Option(SPARK_RETRY_MAX_ATTEMPTS, Whole(), "Attempts (at least 1) of one AWS call "
               "before the error is raised (kinesis-asl's key).", "3",
               field="retry_max_attempts"),
        Option(SPARK_SHARDS_PER_TASK, Whole(1), "How many shards one Spark task reads, "
               "concurrently (the Databricks connector's shardsPerTask); a shard that read "
               "nothing in its last batch counts as a quarter.", "32",
               field="shards_per_task"),
        Option(SPARK_FAIL_ON_DATA_LOSS, BOOLEAN, "A batch whose start was trimmed by the "
               "stream's retention fails (true) or goes on from the oldest record Kinesis "
               "holds (false, as the KCL).", "false", field="fail_on_data_loss"),
        Option(SPARK_CONSUMER_TYPE, CONSUMER_TYPE, "How the executors read: GetRecords "
               "(polling) or SubscribeToShard (enhanced fan-out: the driver registers a "
               "consumer once; see docs/enhanced-fan-out.md).", "GetRecords",
               field="retrieval_mode"),
        Option(SPARK_CONSUMER_NAME, Text("consumer name"), "The fan-out consumer to "
               "register (or find) on the stream.", "the application name",
               field="consumer_name"),
        Option(SPARK_CONSUMER_ARN, Text("consumer ARN"), "A fan-out consumer registered "
               "already: no registration.", "", field="consumer_arn"),
        *table_options({field: f"spark.streaming.kinesis.{key}"
                        for field, key in KCL_TABLE_KEYS.items()},
                       what="the lease table and the batch-range table"),
        *stall_options({"stalled_shard_lag_ms": "spark.streaming.kinesis.stalledShardLag",
                        "stalled_shard_time_ms": "spark.streaming.kinesis.stalledShardTime"}),
        Option(SPARK_RECEIVER_MAX_RATE, Number(), "Records per second the whole stream may "
               "take a batch; 0 or less: unlimited (Spark's key).", "unlimited",
               target="rate", field="max_rate"),
        Option(SPARK_BACKPRESSURE_ENABLED, BOOLEAN, "Let the batch limit follow Spark's PID "
               "rate estimator (Spark's key).", "false", target="rate", field="backpressure"),
        Option(SPARK_BACKPRESSURE_INITIAL_RATE, Number(), "The first batch's rate while "
               "backpressure is on (Spark's key).", "unlimited", target="rate",
               field="initial_rate"),
        Option(SPARK_PID_PROPORTIONAL, Number(), "PID rate estimator: proportional gain "
               "(Spark's key).", "1.0", target="rate", field="proportional"),
        Option(SPARK_PID_INTEGRAL, Number(), "PID rate estimator: integral gain (Spark's "
               "key).", "0.2", target="rate", field="integral"),
        Option(SPARK_PID_DERIVED, Number(), "PID rate estimator: derivative gain (Spark's "
               "key).", "0.0", target="rate", field="derived"),
        Option(SPARK_PID_MIN_RATE, Number(), "PID rate estimator: lowest rate, records per "
               "second (Spark's key).", "100", target="rate", field="min_rate"),
    ))
