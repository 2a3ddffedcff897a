"""A Spark application run as a subprocess by the tests (so it can be killed -9, and so two
of them are two drivers).

usage: spark_driver.py CHECKPOINT_DIR|- APP STREAM KINESIS_URL DYNAMODB_URL
Appends "shard seq sub data" per record to $RECOVERY_OUT; stops gracefully once the file
$RECOVERY_STOP exists. With a checkpoint directory it recovers through
StreamingContext.getOrCreate. While the file $RECOVERY_HOLD exists, an output operation that
has records holds before writing them (and says so in $RECOVERY_HOLD.held): a test can keep a
batch from completing for as long as it likes, and kill the driver then.
With $RECOVERY_FANOUT set it reads by enhanced fan-out (spark.streaming.kinesis.consumerType).
$RECOVERY_MASTER: Spark's master (default local[2]); $RECOVERY_STATIC_KEY: "key id:secret key"
given to createStream; $RECOVERY_LOG_LEVEL: the kinesis_dstream loggers' level (default INFO).
It says "CREATED" when setup() makes a new context and "APP <application id>" once started.
"""
import logging
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)
# As a user's job would log ours: INFO lines of kinesis_dstream into the driver's log.
logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
logging.getLogger("kinesis_dstream").setLevel(os.environ.get("RECOVERY_LOG_LEVEL") or "INFO")

from pyspark import SparkConf, SparkContext  # noqa: E402
from pyspark.streaming import StreamingContext  # noqa: E402

from kinesis_dstream import InitialPositionInStream, KinesisUtils, MetricsLevel  # noqa: E402

checkpoint_dir, app, stream, kinesis_url, dynamodb_url = sys.argv[1:6]


def write_rows(rdd):
    rows = rdd.collect()
    hold = os.environ.get("RECOVERY_HOLD")
    if rows and hold and os.path.exists(hold):
        with open(hold + ".held", "w") as f:
            f.write(f"{len(rows)}\n")
        while os.path.exists(hold):
            time.sleep(0.05)
    if rows:
        with open(os.environ["RECOVERY_OUT"], "a") as f:
            f.write("".join(f"{s} {q} {u} {d}\n" for s, q, u, d in rows))
            f.flush()
            os.fsync(f.fileno())


def setup():
    print("CREATED", flush=True)
    conf = (SparkConf().setMaster(os.environ.get("RECOVERY_MASTER") or "local[2]")
            .setAppName("recovery")
            .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.executorEnv.PYSPARK_PYTHON", sys.executable))
    if os.environ.get("RECOVERY_FANOUT"):
        conf.set("spark.streaming.kinesis.consumerType", "SubscribeToShard")
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("WARN")
    ssc = StreamingContext(sc, 1)
    if checkpoint_dir != "-":
        ssc.checkpoint(checkpoint_dir)
    key_id, _, secret_key = (os.environ.get("RECOVERY_STATIC_KEY") or "").partition(":")
    kstream = KinesisUtils.createStream(
        ssc, app, stream, kinesis_url, "us-east-1", InitialPositionInStream.TRIM_HORIZON,
        float(os.environ.get("RECOVERY_CHECKPOINT_INTERVAL", "1")),
        dynamoDBEndpoint=dynamodb_url, metricsLevel=MetricsLevel.NONE,
        awsAccessKeyId=key_id or None, awsSecretKey=secret_key or None,
        messageHandler=lambda r: (r.shard_id, r.sequence_number, r.sub_sequence_number,
                                  r.data.decode()),
        # $RECOVERY_FAILOVER_MS: a Java KCL worker sharing the table uses the same failover.
        configOverrides=dict(failover_time_ms=int(os.environ.get("RECOVERY_FAILOVER_MS", "3000")),
                             shard_sync_interval_ms=2000,
                             shutdown_grace_ms=8000, idle_time_between_reads_ms=100))
    kstream.foreachRDD(write_rows)
    return ssc


if checkpoint_dir == "-":
    ssc = setup()
else:
    ssc = StreamingContext.getOrCreate(checkpoint_dir, setup)
ssc.sparkContext.setLogLevel("WARN")
ssc.start()
print("STARTED", flush=True)
print("APP", ssc.sparkContext.applicationId, flush=True)
while not os.path.exists(os.environ["RECOVERY_STOP"]):
    time.sleep(0.2)
ssc.stop(stopSparkContext=True, stopGraceFully=True)
print("STOPPED", flush=True)
