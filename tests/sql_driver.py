"""A Structured Streaming application run as a subprocess by the tests, so that its whole
log (the driver JVM's, its Python workers', ours) lands in one file the test reads.

usage: sql_driver.py CHECKPOINT_DIR SOURCE_JSON SINK_JSON ROWS
Reads ``format("aws-kinesis")`` with the options SOURCE_JSON, writes its partitionKey and
data columns with the options SINK_JSON, until ROWS rows went through; then stops. The
kinesis_dstream loggers log at DEBUG. Says "APP <application id>" and, at the end, "DONE".
"""
import json
import logging
import os
import sys
import time

logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
logging.getLogger("kinesis_dstream").setLevel(logging.DEBUG)

from pyspark.sql import SparkSession  # noqa: E402

from kinesis_dstream.sql.datasource import register  # noqa: E402

checkpoint, source, sink, rows = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), \
    int(sys.argv[4])
spark = (SparkSession.builder.master(os.environ.get("SQL_DRIVER_MASTER") or "local[2]")
         .appName("sql-driver").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable).getOrCreate())
register(spark)
print("APP", spark.sparkContext.applicationId, flush=True)
query = (spark.readStream.format("aws-kinesis").options(**source).load()
         .selectExpr("partitionKey", "data").writeStream.format("aws-kinesis").options(**sink)
         .option("checkpointLocation", checkpoint).trigger(processingTime="1 second").start())
deadline = time.monotonic() + 180
while sum(p["numInputRows"] for p in query.recentProgress) < rows and query.exception() is None \
        and time.monotonic() < deadline:
    time.sleep(0.2)
query.stop()
if query.exception() is not None:
    raise SystemExit(f"query failed: {query.exception()}")
if sum(p["numInputRows"] for p in query.recentProgress) < rows:
    raise SystemExit(f"fewer than {rows} rows in 180 s")
spark.stop()
print("DONE", flush=True)
