"""createStream end to end: several input streams of one application (a union) split the
shards between them and resume where the application stopped.

kinesis-local + moto, the session's one SparkContext (conftest ``sc``), 1 s batches, a new
StreamingContext per test stopped with stopSparkContext=False.
"""
from __future__ import annotations

import warnings

import pytest

from emulators import list_shard_ids
from spark_helpers import (
    count_words,
    create,
    duplicated_ids,
    leases,
    make_ssc,
    unique_lines,
    wait_until,
    words_in,
)

warnings.filterwarnings("ignore", message="DStream is deprecated", category=FutureWarning)

pytestmark = pytest.mark.spark


def test_four_input_streams_with_one_application_split_the_shards_and_resume(
        sc, env, make_stream, put_records, unique_app_name):
    """The Scala sample's scaling pattern: four createStream calls, one application name,
    unioned over a 4-shard stream. One coordinator in the driver assigns each shard to one
    of them: exact counts. A second run resumes from the checkpoints: exact again."""
    stream = make_stream(4)
    lines = unique_lines(1600)
    halves = (lines[:800], lines[800:])
    for run, half in enumerate(halves):
        offset = 800 * run
        put_records(stream, [(f"pk{i}", line) for i, line in enumerate(half, offset)])
        ssc = make_ssc(sc)
        streams = [create(ssc, unique_app_name, stream, env) for _ in range(4)]
        counts = count_words(ssc.union(*streams))
        ssc.start()
        try:
            wanted = sum(words_in(half).values())
            wait_until(lambda counts=counts, wanted=wanted: sum(counts.values()) >= wanted, 60,
                       f"run {run}: every record")
            per_stream = [set(s.metrics()) for s in streams]
            assert all(len(shards) == 1 for shards in per_stream), per_stream
            assert set.union(*per_stream) == set(list_shard_ids(env["kinesis"], stream))
            counts.settle()
        finally:
            ssc.stop(stopSparkContext=False, stopGraceFully=True)
        assert not duplicated_ids(counts)
        assert counts == words_in(half), f"run {run}"
        assert all("leaseOwner" not in item for item in leases(env, unique_app_name).values())
