#
# Spark's examples/src/main/python/streaming/kinesis_wordcount_asl.py, with one import changed:
#     from pyspark.streaming.kinesis import KinesisUtils, InitialPositionInStream
# became
#     from kinesis_dstream import KinesisUtils, InitialPositionInStream
# No Kinesis ASL jar, no --packages. Extras for the demo (all optional):
#   KINESIS_INITIAL_POSITION=TRIM_HORIZON   read from the start (Spark's sample: LATEST)
#   WORDCOUNT_SECONDS=N                     stop gracefully after N seconds
#   Ctrl-C / SIGTERM                        stop gracefully (process, checkpoint, release)
#
"""
  Consumes messages from an Amazon Kinesis stream and does word count.

  Usage: kinesis_wordcount_asl.py <app-name> <stream-name> <endpoint-url> <region-name>
    <app-name> is the name of the consumer app, used to track the read data in DynamoDB
    <stream-name> name of the Kinesis stream (i.e. mySparkStream)
    <endpoint-url> endpoint of the Kinesis service
      (e.g. https://kinesis.us-east-1.amazonaws.com)
    <region-name> region name of the Kinesis endpoint (e.g. us-east-1)

  Example:
      $ samples/run-example streaming.KinesisWordCountASL myAppName mySparkStream \\
          https://kinesis.us-east-1.amazonaws.com us-east-1

  Credentials come from boto3's default chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
  a profile, an instance role); endpoints from AWS_ENDPOINT_URL_DYNAMODB where set
  (`kinesis-dstream local` prints them). The lease table is named <app-name>.
"""
import logging
import os
import signal
import sys
import threading
import time
import warnings

from pyspark import SparkConf, SparkContext
from pyspark.streaming import StreamingContext

from kinesis_dstream import InitialPositionInStream, KinesisUtils

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

if __name__ == "__main__":
    if len(sys.argv) != 5:
        print(
            "Usage: kinesis_wordcount_asl.py <app-name> <stream-name> <endpoint-url> <region-name>",
            file=sys.stderr,
        )
        sys.exit(-1)

    # kinesis-dstream logs one line per batch (records, shards, lag) at INFO
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kinesis_dstream").setLevel(os.environ.get("KINESIS_DSTREAM_LOG_LEVEL", "INFO"))

    conf = SparkConf().setAppName("PythonStreamingKinesisWordCountAsl")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # run as `python job.py`, not by spark-submit
        conf.setMaster("local[*]")                # (a set master would override --master)
    sc = SparkContext(conf=conf)
    sc.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "WARN"))
    ssc = StreamingContext(sc, 1)
    appName, streamName, endpointUrl, regionName = sys.argv[1:]
    position = getattr(InitialPositionInStream,
                       os.environ.get("KINESIS_INITIAL_POSITION", "LATEST").upper())
    lines = KinesisUtils.createStream(
        ssc, appName, streamName, endpointUrl, regionName, position, 2
    )
    counts = (
        lines.flatMap(lambda line: line.split(" "))
        .map(lambda word: (word, 1))
        .reduceByKey(lambda a, b: a + b)
    )
    counts.pprint()

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    seconds = float(os.environ.get("WORDCOUNT_SECONDS", "0") or 0)
    deadline = time.monotonic() + seconds if seconds > 0 else None

    ssc.start()
    while not stop.is_set() and not ssc.awaitTerminationOrTimeout(1):
        if deadline is not None and time.monotonic() >= deadline:
            break
    print("Stopping gracefully: finishing received records, checkpointing, releasing leases",
          file=sys.stderr)
    ssc.stop(stopSparkContext=True, stopGraceFully=True)
