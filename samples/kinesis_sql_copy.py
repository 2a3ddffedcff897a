"""
  Copies one Kinesis stream into another with Structured Streaming: format("aws-kinesis") as
  source and as sink (pyspark >= 4.0), then stops (Trigger.AvailableNow: what the source
  stream held when the query started).

  Usage: kinesis_sql_copy.py <app-name> <source-stream> <target-stream> <endpoint-url> \\
             <region-name> <checkpoint-dir>
    <app-name> names the DynamoDB table of the source's batch ranges
    <checkpoint-dir> the query's checkpointLocation: a re-run goes on from where it stopped

  Credentials come from boto3's default chain; DynamoDB's endpoint from
  AWS_ENDPOINT_URL_DYNAMODB where set (`kinesis-dstream local` prints it). The master comes
  from spark-submit (local[2] when run as `python kinesis_sql_copy.py ...`).
"""
import logging
import os
import sys

from pyspark.sql import SparkSession

from kinesis_dstream.sql.datasource import register

if __name__ == "__main__":
    if len(sys.argv) != 7:
        print(__doc__, file=sys.stderr)
        sys.exit(-1)
    app, source, target, endpoint, region, checkpoint = sys.argv[1:]
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kinesis_dstream").setLevel(logging.INFO)

    builder = SparkSession.builder.appName("KinesisSqlCopy")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # run as `python job.py`, not by spark-submit
        builder = builder.master("local[2]")      # (a set master would override --master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)  # format("aws-kinesis") from this driver's Python; executors checked
    connection = {"kinesis.endpointUrl": endpoint, "kinesis.region": region}
    records = (spark.readStream.format("aws-kinesis").options(**connection)
               .option("kinesis.streamName", source)
               .option("kinesis.dynamodb.tableName", app)
               .option("kinesis.startingPosition", "TRIM_HORIZON")
               .load())
    query = (records.selectExpr("partitionKey", "data")
             .writeStream.format("aws-kinesis").options(**connection)
             .option("kinesis.streamName", target)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True)
             .start())
    query.awaitTermination()
    print(f"copied {source} to {target}: {query.lastProgress and query.lastProgress['numInputRows']} "
          "rows in the last batch", file=sys.stderr)
    spark.stop()
