"""Helpers shared by the createStream end-to-end tests (test_spark_stream.py,
test_spark_java_engine.py): waiting, and the word count whose result must be exact."""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Callable

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def word_lines(n: int) -> list[str]:
    """n lines of 1 to 4 words each."""
    return [" ".join(WORDS[(i + j) % 5] for j in range(1 + i % 4)) for i in range(n)]


def words_in(lines: list[str]) -> Counter:
    return Counter(w for line in lines for w in line.split())


def count_words(kstream: Any) -> Counter:
    """Spark's word count on ``kstream``; returns the Counter each batch adds to.

    The counter is updated on the driver under a lock; read ``sum(counts.values())``
    (a copy of the values) from the test thread."""
    counts: Counter = Counter()
    lock = threading.Lock()
    pairs = kstream.flatMap(lambda line: line.split(" ")).map(lambda w: (w, 1)) \
        .reduceByKey(lambda a, b: a + b)

    def add(rdd):
        got = rdd.collect()
        with lock:
            counts.update(dict(got))

    pairs.foreachRDD(add)
    return counts
