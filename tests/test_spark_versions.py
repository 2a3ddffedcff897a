"""What the README promises per pyspark version; the Spark matrix (make test-spark35) runs this
file on pyspark 3.5 too, where format("aws-kinesis") does not exist."""
from __future__ import annotations

import pyspark
import pytest

HAS_DATA_SOURCE_API = int(pyspark.__version__.split(".")[0]) >= 4

pytestmark = pytest.mark.spark


def test_kinesis_utils_imports_on_this_pyspark():
    from kinesis_dstream import InitialPositionInStream, KinesisRecord, KinesisUtils

    assert KinesisUtils.createStream and InitialPositionInStream.TRIM_HORIZON == 1
    assert KinesisRecord._fields[0] == "data"


def test_register_says_which_pyspark_format_aws_kinesis_needs():
    if HAS_DATA_SOURCE_API:
        from kinesis_dstream.sql.datasource import register

        assert callable(register)
        return
    with pytest.raises(ImportError) as raised:
        from kinesis_dstream.sql.datasource import register  # noqa: F401
    message = str(raised.value)
    assert "needs pyspark >= 4.0" in message and pyspark.__version__ in message
