"""Rate control: RateController's limits (maxRate, backpressure), then maxRate end to end."""
from __future__ import annotations

import re
import threading
import time
import warnings

import pytest

from spark_helpers import create, make_ssc, wait_until

from kinesis_dstream.config import SPARK_RECEIVER_MAX_RATE
from kinesis_dstream.spark.rate import RateController, RateSettings

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)


@pytest.mark.unit
def test_max_rate_limits_each_batch() -> None:
    rc = RateController(RateSettings.from_spark_conf({"spark.streaming.receiver.maxRate": "500"}),
                        batch_interval_ms=2000)
    assert rc.batch_limit() == 1000
    assert RateController(RateSettings(), 1000).batch_limit() is None



@pytest.mark.unit
def test_backpressure_follows_processing_rate() -> None:
    conf = {"spark.streaming.backpressure.enabled": "true",
            "spark.streaming.receiver.maxRate": "100000"}
    rc = RateController(RateSettings.from_spark_conf(conf), batch_interval_ms=1000)
    assert rc.batch_limit() == 100000  # no estimate yet: maxRate
    assert rc.batch_completed(1000, records=2000, processing_delay_ms=1000,
                              scheduling_delay_ms=0) == 2000  # the next batch's limit
    assert rc.batch_limit() == 2000
    # slower processing with a growing scheduling delay: the limit falls
    rc.batch_completed(2000, records=2000, processing_delay_ms=2000, scheduling_delay_ms=1000)
    assert rc.batch_limit() < 2000


@pytest.mark.matrix
@pytest.mark.spark
def test_receiver_max_rate_caps_every_batch(sc, env, make_stream, put_records, unique_app_name,
                                            caplog):
    """maxRate spreads a backlog over batches of at most its rate. Each capped batch stopped
    before a shard's tip, so the next one is read early, as soon as Spark has asked for the
    capped one (one batch ahead of its clock); the first is read at the context's start."""
    from kinesis_dstream.spark.dstream import _first_batch_ms

    caplog.set_level("DEBUG", logger="kinesis_dstream.spark")
    stream = make_stream(2)
    total = 1000
    put_records(stream, [(f"k{i}", f"r{i}") for i in range(total)])
    ssc = make_ssc(sc)
    # The SparkContext is the session's; createStream reads the rate settings from its conf
    # (RateSettings.from_spark_conf), once: set the key for this call only.
    jconf = sc._conf._jconf
    before = jconf.get(SPARK_RECEIVER_MAX_RATE) if jconf.contains(SPARK_RECEIVER_MAX_RATE) else None
    jconf.set(SPARK_RECEIVER_MAX_RATE, "200")
    try:
        kstream = create(ssc, unique_app_name, stream, env)
    finally:
        if before is None:
            jconf.remove(SPARK_RECEIVER_MAX_RATE)
        else:
            jconf.set(SPARK_RECEIVER_MAX_RATE, before)
    sizes: list[int] = []
    times: list[int] = []
    rows: list[str] = []
    lock = threading.Lock()

    def keep(time, rdd):
        got = rdd.collect()
        with lock:
            sizes.append(len(got))
            times.append(round(time.timestamp() * 1000))
            rows.extend(got)

    kstream.foreachRDD(keep)
    ssc.start()
    started = time.time()
    first_ms = _first_batch_ms(ssc)
    try:
        wait_until(lambda: len(rows) >= total, 60, "the whole backlog")
        settled = len(sizes) + 2
        wait_until(lambda: len(sizes) >= settled, 30, "two more batches")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert max(sizes) <= 200, sizes
    # The cap (200 a batch, 100 a shard) is what spread the backlog over batches.
    assert sum(1 for s in sizes if s > 0) >= total // 200, sizes
    assert sorted(rows) == sorted(f"r{i}" for i in range(total))
    assert first_ms == min(times), (first_ms, times)  # the batch the start reads early
    early = {int(m) for m in re.findall(r"batch (\d+) is read early", caplog.text)}
    with_data = sorted(t for t, n in zip(times, sizes) if n)
    assert set(with_data[1:]) <= early, (with_data, sorted(early))
    # the start's early read of the first batch loses only to a batch due at once
    assert first_ms in early or first_ms / 1000 - started < 0.05, (first_ms, started, early)
    assert max(early) <= max(times) + 1000  # never more than one batch ahead
