"""The throttled-delete test: the batch-range table's deletion under DynamoDB throttling.

DynamoDB throttles a BatchWriteItem by giving requests back as ``UnprocessedItems``; moto
never does, so ``fault_proxy`` sits in front of it and gives back all but one request of the
next calls. The resends are spaced by the retry policy's backoff, bounded in number, and
what is deleted once the throttle ends is exactly what was asked.
"""
from __future__ import annotations

import time

import pytest

from kinesis_dstream.aws.range_table import UNPROCESSED_ATTEMPTS, BatchRange, BatchRangeTable
from kinesis_dstream.errors import RetriesExhaustedError
from kinesis_dstream.records import ExtendedSequenceNumber as ESN

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

WAIT_MS = 20
SHARDS = ("shardId-000000000000", "shardId-000000000001")


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


@pytest.fixture
def table(aws_env, dynamodb, make_config, make_fault_proxy):
    proxy = make_fault_proxy(share=0.0, upstream=dynamodb)
    config = make_config("ranges-of", dynamodb_endpoint=proxy.endpoint, retry_wait_time_ms=WAIT_MS)
    ranges = BatchRangeTable(config)
    ranges.create_table_if_not_exists()
    yield ranges, proxy
    ranges.delete_table()


def test_unprocessed_items_are_resent_after_the_backoff_and_exactly_what_was_asked_goes(table):
    ranges, proxy = table
    for shard in SHARDS:
        for batch in range(1, 21):
            ranges.put_if_absent(BatchRange("s", shard, batch * 1000, ESN.TRIM_HORIZON))
    doomed = [("s", shard, batch * 1000) for shard in SHARDS for batch in range(1, 16)]
    proxy.unprocessed_writes, proxy.processed_per_write = 6, 1
    del proxy.write_times[:]
    assert ranges.delete(doomed) == 30
    # 25 in the first call: 6 throttled calls delete one each, the 7th the other 19; then 5
    assert len(proxy.write_times) == 8
    for attempt, gap in enumerate(gaps(proxy.write_times[:7]), start=1):
        floor_s = WAIT_MS * 2 ** (attempt - 1) / 2 / 1000  # equal jitter: half the ceiling
        assert gap >= floor_s, f"resend {attempt} came {gap * 1000:.0f} ms after the last call"
    for shard in SHARDS:
        assert ranges.batch_times("s", shard) == [b * 1000 for b in range(16, 21)]


def test_a_throttle_that_lasts_is_given_up_on_naming_the_table_and_what_is_left(table):
    ranges, proxy = table
    for batch in (1, 2):
        ranges.put_if_absent(BatchRange("s", SHARDS[0], batch * 1000, ESN.TRIM_HORIZON))
    proxy.unprocessed_writes, proxy.processed_per_write = 1000, 0
    del proxy.write_times[:]
    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError) as info:
        ranges.delete([("s", SHARDS[0], 1000), ("s", SHARDS[0], 2000)])
    assert len(proxy.write_times) == UNPROCESSED_ATTEMPTS
    # the backoff's ceilings, 20 ms doubling, summed: the give-up comes within them
    assert time.monotonic() - started < sum(WAIT_MS * 2 ** n for n in range(7)) / 1000 + 5
    message = str(info.value)
    assert ranges.table_name in message
    assert f"s/{SHARDS[0]}@1000" in message and f"s/{SHARDS[0]}@2000" in message
    assert ranges.batch_times("s", SHARDS[0]) == [1000, 2000]
    proxy.unprocessed_writes = 0  # the throttle ends
    assert ranges.delete([("s", SHARDS[0], 1000)]) == 1
    assert ranges.batch_times("s", SHARDS[0]) == [2000]
