"""Records and ExtendedSequenceNumber ordering (tier 1)."""
from __future__ import annotations

import base64

import pytest

from kinesis_dstream.records import (
    SHARD_END,
    Record,
    is_valid_sequence_number,
)
from kinesis_dstream.records import (
    ExtendedSequenceNumber as ESN,
)

pytestmark = pytest.mark.unit

BIG = "49590338271490256608559692538361571095921575989136588898"  # a real 56-digit one


def test_sentinels_sort_around_real_positions():
    real = ESN("1")
    assert ESN.TRIM_HORIZON < ESN.AT_TIMESTAMP < ESN.LATEST < real < ESN(BIG) < ESN.SHARD_END
    assert ESN.SHARD_END > ESN(BIG, 10**6)
    assert ESN.TRIM_HORIZON < ESN("0")


def test_numeric_not_lexicographic_order():
    assert ESN("9") < ESN("10")
    assert ESN(BIG) < ESN(str(int(BIG) + 1))
    assert ESN("1" + "0" * 127) > ESN("9" * 127)


def test_sub_sequence_orders_within_one_sequence_number():
    assert ESN(BIG, 0) < ESN(BIG, 1) < ESN(BIG, 99)
    assert ESN(BIG, 99) < ESN(str(int(BIG) + 1), 0)
    assert max([ESN(BIG, 3), ESN(BIG, 7), ESN(BIG, 5)]) == ESN(BIG, 7)


def test_equality_and_hashing():
    assert ESN(BIG, 2) == ESN(BIG, 2)
    assert ESN(BIG, 2) != ESN(BIG, 3)
    assert len({ESN(BIG, 2), ESN(BIG, 2), ESN(BIG, 3)}) == 2
    assert ESN("TRIM_HORIZON") == ESN.TRIM_HORIZON
    assert ESN.SHARD_END is SHARD_END and SHARD_END == ESN("SHARD_END")  # one SHARD_END
    assert ESN("5") != "5"
    assert ESN.TRIM_HORIZON <= ESN.TRIM_HORIZON and ESN(BIG) >= ESN(BIG)


def test_sentinel_properties_and_str():
    assert ESN.SHARD_END.is_shard_end and ESN.SHARD_END.is_sentinel
    assert ESN.LATEST.is_sentinel and not ESN.LATEST.is_shard_end
    assert not ESN(BIG).is_sentinel
    assert str(ESN.TRIM_HORIZON) == "TRIM_HORIZON"
    assert str(ESN(BIG, 4)) == f"{BIG}/4"


def test_sorting_a_mixed_list():
    items = [ESN.SHARD_END, ESN("20", 1), ESN.TRIM_HORIZON, ESN("3"), ESN("20"), ESN.LATEST]
    assert sorted(items) == [ESN.TRIM_HORIZON, ESN.LATEST, ESN("3"), ESN("20"), ESN("20", 1),
                             ESN.SHARD_END]


@pytest.mark.parametrize("value, ok", [
    (BIG, True), ("1", True), ("9" * 128, True), ("9" * 129, False), ("", False),
    ("-1", False), ("1.0", False), (" 1", False), ("abc", False), (None, False), (12, False),
    ("TRIM_HORIZON", False),
    ("\u00b2", False),  # superscript two: str.isdigit() says yes, int() says no
    ("\u0661\u0662", False),  # Arabic-Indic digits are not a Kinesis sequence number
])
def test_is_valid_sequence_number(value, ok):
    assert is_valid_sequence_number(value) is ok


def test_record_has_kclpy_attribute_names():
    record = Record(binary_data=b"hello", partition_key="pk", sequence_number=BIG,
                    sub_sequence_number=3, approximate_arrival_timestamp=1700000000123)
    assert record.data == base64.b64encode(b"hello").decode()
    assert record.extended_sequence_number == ESN(BIG, 3)
    assert record.to_json_dict() == {
        "action": "record", "data": "aGVsbG8=", "partitionKey": "pk", "sequenceNumber": BIG,
        "subSequenceNumber": 3, "approximateArrivalTimestamp": 1700000000123,
    }
