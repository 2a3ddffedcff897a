"""Polling pages read ahead between a shard's readings (retrieval.prefetch), against an
in-memory shard that answers GetRecords as Kinesis does (pages, NextShardIterator, lag)."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from kinesis_dstream.config import ConsumerConfig
from kinesis_dstream.errors import ThrottlingError
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.retrieval import peer_messages, prefetch, read_loop
from kinesis_dstream.retrieval.fetch_pace import ShardBudget
from kinesis_dstream.retrieval.polling import KinesisDataFetcher

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

CONFIG = ConsumerConfig(application_name="prefetch-unit", stream_name="s",
                        region_name="us-east-1", aws_access_key_id="AKIDEXAMPLE",
                        aws_secret_key="secret", kinesis_endpoint="http://127.0.0.1:9",
                        max_records=10)
SHARD = "shardId-000000000000"
KEY = "s@query"
MiB = 1024 * 1024


class Shard:
    """One shard of ``count`` records ("1", "2", ...) of ``size`` bytes; iterators name the
    index of the next record. Every GetRecords call is kept with its time and limit."""

    def __init__(self, count: int, size: int = 100) -> None:
        self.records = [{"Data": b"x" * size, "PartitionKey": "k", "SequenceNumber": str(i),
                         "ApproximateArrivalTimestamp": 1_700_000_000.0}
                        for i in range(1, count + 1)]
        self.calls: list[tuple[float, str, int]] = []
        self.iterator_calls = 0
        self.refuse: set[int] = set()  # these calls (1, 2, ...) refused, as of a shard in debt
        self.refused_at: list[float] = []
        self.answered = 0
        self.lock = threading.Lock()

    def get_records(self, iterator: str, limit: int, *, shard_id: str = "") -> dict[str, Any]:
        with self.lock:
            self.answered += 1
            if self.answered in self.refuse:
                self.refused_at.append(time.time())
                raise ThrottlingError("ProvisionedThroughputExceededException (test shard)")
            self.calls.append((time.time(), iterator, limit))
        first = int(iterator.split("-")[1])
        page = self.records[first:first + limit]
        after = first + len(page)
        return {"Records": page, "NextShardIterator": f"it-{after}",
                "MillisBehindLatest": 1000 if after < len(self.records) else 0}

    def get_shard_iterator(self, shard_id: str, iterator_type: str, **kwargs: Any) -> str:
        self.iterator_calls += 1
        if iterator_type == "TRIM_HORIZON":
            return "it-0"
        return f"it-{int(kwargs['sequence_number']) - 1}"  # AT_SEQUENCE_NUMBER


@pytest.fixture
def registry(monkeypatch) -> prefetch.PrefetchRegistry:
    fresh = prefetch.PrefetchRegistry(hold_s=5.0)
    monkeypatch.setattr(prefetch.prefetches, "_value", fresh)
    return fresh


def reading_of(shard: Shard, start: ESN, **bounds: Any) -> read_loop.Reading:
    bounds.setdefault("time_budget_s", 5.0)
    bounds.setdefault("ahead", KEY)
    return read_loop.read(shard, CONFIG, SHARD, start, None, **bounds)  # type: ignore[arg-type]


def numbers(reading: read_loop.Reading) -> list[int]:
    return [int(r.sequence_number) for r in reading.records]


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_the_next_page_is_read_ahead_and_the_next_reading_takes_exactly_it(registry):
    shard = Shard(35)
    first = reading_of(shard, ESN.TRIM_HORIZON, max_records=3)  # a small first reading
    assert numbers(first) == [1, 2, 3] and first.more_left and first.ahead
    wait_for(lambda: len(shard.calls) == 2)  # read ahead, with the config's page size
    assert shard.calls[1][1:] == ("it-3", 10)
    second = reading_of(shard, ESN("3"), max_records=10)
    assert numbers(second) == list(range(4, 14))
    # its page came ahead: counted as its call, and no GetShardIterator anywhere after the first
    assert second.calls >= 1 and second.shard_iterator_calls == 0 and shard.iterator_calls == 1
    assert registry.taken == 1
    # exactly what a reading without any page ahead reads from the same start
    alone = read_loop.read(Shard(35), CONFIG, SHARD, ESN("3"), None,  # type: ignore[arg-type]
                           time_budget_s=5.0, max_records=10)
    assert numbers(alone) == numbers(second)


def test_a_page_read_ahead_after_another_position_is_not_taken(registry):
    shard = Shard(35)
    reading_of(shard, ESN.TRIM_HORIZON, max_records=3)
    wait_for(lambda: registry.held() and len(shard.calls) == 2)
    # a range starting elsewhere (a driver restarted from another offset) reads its own
    other = reading_of(shard, ESN("7"), max_records=2)
    assert numbers(other) == [8, 9] and registry.taken == 0
    assert (KEY, SHARD) not in registry.held() or registry.held()[(KEY, SHARD)] == ESN("9")


def test_a_reading_cut_inside_a_page_leaves_the_rest_for_the_next_one(registry):
    shard = Shard(35)
    reading_of(shard, ESN.TRIM_HORIZON, max_records=3)
    wait_for(lambda: len(shard.calls) == 2)
    cut = reading_of(shard, ESN("3"), max_records=4)  # the page of 10 cut at 4
    assert numbers(cut) == [4, 5, 6, 7] and cut.ahead and cut.iterator is None
    calls = len(shard.calls)
    rest = reading_of(shard, ESN("7"), max_records=3)
    assert numbers(rest) == [8, 9, 10] and len(shard.calls) == calls  # no call: kept here
    assert shard.iterator_calls == 1


def test_a_reading_at_the_tip_reads_nothing_ahead(registry):
    shard = Shard(5)
    reading = reading_of(shard, ESN.TRIM_HORIZON)
    assert numbers(reading) == [1, 2, 3, 4, 5] and not reading.more_left
    assert not reading.ahead and registry.held() == {}


def test_the_page_ahead_waits_for_the_shards_budget(registry):
    """A page past a second's worth of 2 MiB/s puts the shard in debt: the read ahead is
    made when it is paid, not at once (Kinesis would refuse it)."""
    shard = Shard(30, size=MiB // 2)  # pages of 10 x 0.5 MiB = 5 MiB: 2.5 s of debt each
    began = time.time()
    first = reading_of(shard, ESN.TRIM_HORIZON)
    assert numbers(first) == list(range(1, 11)) and first.more_left and first.ahead
    wait_for(lambda: len(shard.calls) == 2, 10.0)
    called = shard.calls[1][0]
    # a full bucket (2 MiB) less 5 MiB: 1.5 s after the first page
    assert called >= first.ready_at - 0.05 and first.ready_at > began + 1.0
    second = reading_of(shard, ESN("10"))
    assert numbers(second) == list(range(11, 21))
    # its ready time counts its page from when the shard served it (an empty bucket then)
    assert second.ready_at == pytest.approx(called + 2.5, abs=0.3)


def test_a_page_due_after_the_readings_time_budget_is_left_for_the_next(registry):
    shard = Shard(30, size=MiB // 2)
    first = reading_of(shard, ESN.TRIM_HORIZON)
    early = reading_of(shard, ESN("10"), time_budget_s=0.2)  # due in about 2 s
    assert early.records == [] and early.more_left and early.ahead and early.calls == 0
    assert early.ready_at == pytest.approx(first.ready_at)
    later = reading_of(shard, ESN("10"))
    assert numbers(later) == list(range(11, 21)) and registry.taken == 1


def test_a_page_no_reading_takes_is_let_go(monkeypatch):
    registry = prefetch.PrefetchRegistry(hold_s=0.2)
    monkeypatch.setattr(prefetch.prefetches, "_value", registry)
    shard = Shard(35)
    reading_of(shard, ESN.TRIM_HORIZON, max_records=3)
    wait_for(lambda: registry.let_go == 1)
    assert registry.held() == {}
    # the next reading reads for itself
    second = reading_of(shard, ESN("3"), max_records=10)
    assert numbers(second) == list(range(4, 14))


def test_a_process_holds_at_most_its_pages(monkeypatch):
    registry = prefetch.PrefetchRegistry(max_pages=2, hold_s=5.0)
    monkeypatch.setattr(prefetch.prefetches, "_value", registry)
    shard = Shard(35)
    fetchers = [KinesisDataFetcher(shard, CONFIG, f"shardId-{i}")  # type: ignore[arg-type]
                for i in range(3)]
    for fetcher in fetchers:
        fetcher.resume(ESN("3"), "it-3")
    kept = [registry.fetch_after((KEY, f.shard_id), ESN("3"), f, ShardBudget())
            for f in fetchers]
    assert kept == [True, True, False] and len(registry.held()) == 2


def test_a_reply_carries_the_ready_time_and_whether_a_page_is_read_ahead():
    reading = read_loop.Reading(records=[], ready_at=1234.5, ahead=True, more_left=True)
    header, bodies = peer_messages.encode_reply(reading)
    decoded, size = peer_messages.decode_reply_header(header[4:])
    back = peer_messages.decode_reading(decoded, b"".join(bodies), SHARD)
    assert back.ready_at == 1234.5 and back.ahead and back.more_left


def test_a_task_elsewhere_gets_the_page_from_the_process_that_read_it_ahead(registry,
                                                                           monkeypatch):
    """The next task of a shard runs in any process: it asks the one that read the page
    ahead (``subscription_peers``, over TLS with the query's key), which hands over exactly
    that page and reads the next one ahead. A process holding no page for the start answers
    none, and the task reads the range itself."""
    from kinesis_dstream.retrieval import subscription_peers
    from kinesis_dstream.retrieval.peer_tls import new_peer_key

    shard = Shard(35)
    monkeypatch.setattr(subscription_peers, "clients_for",
                        lambda config: type("Clients", (), {"kinesis": shard})())
    key = new_peer_key()
    address = subscription_peers.serve(key, KEY, CONFIG)
    assert address is not None

    def ask() -> read_loop.Reading | None:
        return subscription_peers.read_at(address, key, KEY, "s", SHARD, ESN("3"), None,
                                          time_budget_s=5.0, max_records=10)

    assert ask() is None and shard.calls == []  # nothing read ahead: no call made for it
    reading_of(shard, ESN.TRIM_HORIZON, max_records=3)
    reading = ask()
    assert reading is not None and numbers(reading) == list(range(4, 14))
    assert reading.ahead and reading.iterator == "it-13" and registry.taken == 1
    wait_for(lambda: registry.held().get((KEY, SHARD)) == ESN("13"))


def test_the_page_ahead_keeps_the_pacing_the_query_asked_for(registry):
    """minFetchPeriod / maxFetchRate leave room for a shard's other readers: the page read
    ahead waits for them as the reading's next call would."""
    from kinesis_dstream.retrieval.fetch_pace import FetchPace

    shard = Shard(35)
    reading_of(shard, ESN.TRIM_HORIZON, max_records=3, pace=FetchPace(0.0, 0.6))
    wait_for(lambda: len(shard.calls) == 2)
    assert shard.calls[1][0] - shard.calls[0][0] >= 0.55
    slow = Shard(35, size=1000)
    reading_of(slow, ESN.TRIM_HORIZON, max_records=3, pace=FetchPace(10_000.0, 0.0))
    wait_for(lambda: len(slow.calls) == 2)  # 3,000 bytes at 10 kB/s: 0.3 s
    assert slow.calls[1][0] - slow.calls[0][0] >= 0.25


def test_a_reading_that_took_all_the_rest_reads_the_next_page_ahead(registry):
    shard = Shard(35)
    reading_of(shard, ESN.TRIM_HORIZON, max_records=3)
    wait_for(lambda: len(shard.calls) == 2)
    reading_of(shard, ESN("3"), max_records=4)  # keeps 8..13
    rest = reading_of(shard, ESN("7"), max_records=6)  # takes exactly the rest, no call
    assert numbers(rest) == list(range(8, 14)) and rest.ahead
    wait_for(lambda: len(shard.calls) == 3)
    assert shard.calls[2][1] == "it-13"
    assert numbers(reading_of(shard, ESN("13"), max_records=10)) == list(range(14, 24))


def test_a_page_refused_ahead_makes_the_next_reading_wait_before_its_first_call(registry):
    """The page ahead is refused (the shard's budget spent, e.g. by an answer that timed out
    on its way): the next reading does not call into the same refusal at once, but a second
    after it, and reads on from exactly where the last one left."""
    shard = Shard(35)
    shard.refuse = {2}  # the page read ahead
    first = reading_of(shard, ESN.TRIM_HORIZON, max_records=3)
    assert numbers(first) == [1, 2, 3] and first.ahead
    wait_for(lambda: shard.refused_at)
    second = reading_of(shard, ESN("3"), max_records=10)
    assert numbers(second) == list(range(4, 14))
    waited = shard.calls[1][0] - shard.refused_at[0]
    assert waited >= prefetch.REFUSED_RETRY_S - 0.05, waited
    assert second.waited_s > 0 and registry.taken == 0


def test_a_page_refused_ahead_past_the_next_reading_s_time_leaves_the_wait_to_the_one_after(
        registry):
    shard = Shard(35)
    shard.refuse = {2}  # the page read ahead
    reading_of(shard, ESN.TRIM_HORIZON, max_records=3)
    wait_for(lambda: shard.refused_at)
    second = reading_of(shard, ESN("3"), max_records=10, time_budget_s=0.2)
    assert numbers(second) == [] and second.more_left and len(shard.calls) == 1
    assert second.ready_at >= shard.refused_at[0] + prefetch.REFUSED_RETRY_S - 0.05
