"""What the README promises per pyspark version; the Spark matrix (make test-spark35) runs this
file on pyspark 3.5 too, where format("aws-kinesis") does not exist."""
from __future__ import annotations

import pyspark
import pytest

HAS_DATA_SOURCE_API = int(pyspark.__version__.split(".")[0]) >= 4

pytestmark = pytest.mark.spark


@pytest.mark.matrix
def test_create_stream_gives_a_dstream_of_this_pyspark(sc):
    """createStream, called as pyspark.streaming.kinesis' is, gives this pyspark's DStream of
    the StreamingContext it was given, whose records are decoded by the default decoder."""
    from pyspark.streaming import DStream, StreamingContext

    from kinesis_dstream import InitialPositionInStream, KinesisRecord, KinesisUtils

    ssc = StreamingContext(sc, 1)
    try:
        kstream = KinesisUtils.createStream(ssc, "versions-app", "versions-stream",
                                            "http://127.0.0.1:9", "us-east-1",
                                            InitialPositionInStream.TRIM_HORIZON, 1)
        assert isinstance(kstream, DStream) and kstream._ssc is ssc
        assert kstream.context() is ssc
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    assert KinesisRecord._fields[0] == "data"


@pytest.mark.matrix
def test_register_says_which_pyspark_format_aws_kinesis_needs(sc):
    if HAS_DATA_SOURCE_API:
        from pyspark.sql import SparkSession

        from kinesis_dstream.sql.datasource import register
        from kinesis_dstream.sql.partition_reader import SCHEMA

        spark = SparkSession(sc)
        register(spark)
        opts = {"kinesis.streamName": "s", "kinesis.endpointUrl": "http://127.0.0.1:9",
                "kinesis.region": "us-east-1"}  # nothing is read: no endpoint needed
        df = spark.readStream.format("aws-kinesis").options(**opts).load()
        assert df.isStreaming and df.schema == SCHEMA
        with pytest.raises(Exception, match="reads as a stream only"):
            spark.read.format("aws-kinesis").options(**opts).load().collect()
        return
    with pytest.raises(ImportError) as raised:
        from kinesis_dstream.sql.datasource import register  # noqa: F401
    message = str(raised.value)
    assert "needs pyspark >= 4.0" in message and pyspark.__version__ in message
