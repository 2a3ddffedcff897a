"""Other connectors' option names with no awslabs counterpart (Databricks' and qubole's),
and the awslabs subscription knobs that have nothing to act on here.

Where such an option has a knob here it is an alias or an option in ``options``; this
module holds the rest: the ones with no effect here, each warned about by name once per
process with what it would have done there (a job moved from another connector must not
lose a setting silently). Which connector's names a query uses, and the defaults that follow
from it, is ``vocabulary``'s.
"""
from __future__ import annotations

import logging
from typing import Mapping

log = logging.getLogger(__name__)

CONSUMER_MODE = "consumerMode"
CONSUMER_NAME = "consumerName"
REQUIRE_CONSUMER_DEREGISTRATION = "requireConsumerDeregistration"
# qubole's pair for a least time between GetRecords calls (our kinesis.minFetchPeriod).
QUBOLE_ADD_IDLE_TIME = "kinesis.executor.addIdleTimeBetweenReads"
QUBOLE_IDLE_TIME = "kinesis.executor.idleTimeBetweenReadsInMs"
# qubole's sink names (its README: kinesis.executor.*), aliases of the awslabs sink options
# with the same meaning and the same defaults (100 ms, 1000 ms, 1, true), by SinkOptions field.
# aggregationEnabled=false writes one Kinesis record per row, as the KPL qubole drives does.
# Its README spells the flush wait "kniesis.executor.flushwaittimemillis": a job copied from
# it carries that typo, so it is accepted too.
QUBOLE_SINK_ALIASES: Mapping[str, tuple[str, ...]] = {
    "flush_wait_time_ms": ("kinesis.executor.flushWaitTimeMillis",
                           "kniesis.executor.flushWaitTimeMillis"),
    "record_max_buffered_time_ms": ("kinesis.executor.recordMaxBufferedTime",),
    "max_connections": ("kinesis.executor.maxConnections",),
    "aggregation_enabled": ("kinesis.executor.aggregationEnabled",),
}
# qubole's switch for the instance profile; boto3's default chain covers it (no effect here).
QUBOLE_USE_INSTANCE_PROFILE = "awsUseInstanceProfile"
# Databricks' service credential: refused (a job would otherwise read as another identity).
SERVICE_CREDENTIAL = "serviceCredential"
SERVICE_CREDENTIAL_REFUSAL = (
    "a Databricks service credential exists only in a Databricks workspace; give the IAM "
    "role it stands for as roleArn (kinesis.stsRoleArn), or key options")
# A MB of Databricks' maxFetchRate, as the Kinesis limits count it (2 MB/s a shard).
MB = 1024 * 1024

# Other connectors' options with no effect here: name -> (connector, what it would have done).
# Each is warned about once per process, by name.
NO_EFFECT_ELSEWHERE: Mapping[str, tuple[str, str]] = {
    "kinesis.subscribeToShard.timeoutSec": (
        "awslabs", "bounded each wait for a subscription's next event (60 s); here a task "
        "waits for pushed events at most its time budget (kinesis.maxFetchTimePerShardMs)"),
    "kinesis.subscribeToShard.maxRetries": (
        "awslabs", "retried a failed subscription up to 10 times; here a refused or cut "
        "subscription is retried with the read's backoff, and a task that cannot subscribe "
        "hands out nothing and the next batch subscribes again"),
    "coalesceThresholdBlockSize": ("Databricks", "coalesced small blocks of records before "
                                   "Spark sees them; tasks here hand out Arrow batches of "
                                   "10,000 rows"),
    "coalesceBinSize": ("Databricks", "sized the coalesced blocks; tasks here hand out Arrow "
                        "batches of 10,000 rows"),
    "kinesis.client.maxRetryIntervalMs": ("qubole", "capped the wait between retries; ours "
                                          "double from kinesis.clientRetryIntervalsMs"),
    "kinesis.client.avoidEmptyBatches": ("qubole", "skipped empty micro-batches; this source "
                                         "always does (it probes quiet shards)"),
    QUBOLE_USE_INSTANCE_PROFILE: ("qubole", "used the instance profile; without key options "
                              "boto3's default chain does, the instance profile included"),
}



def endpoint_of_region(region: str) -> str:
    """The public Kinesis endpoint of ``region`` (Databricks' default for ``endpoint``)."""
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"https://kinesis.{region}.{suffix}"


_WARNED: set[str] = set()


def warn_no_effect(given: Mapping[str, str]) -> None:
    """Another connector's option that does nothing here: said once per process, by name,
    with what it would have done there."""
    for name, key in given.items():
        if name in NO_EFFECT_ELSEWHERE and name not in _WARNED:
            _WARNED.add(name)
            who, what = NO_EFFECT_ELSEWHERE[name]
            log.warning("format kinesis (reading): option %r is the %s connector's and has no "
                        "effect here: it would have %s", key, who, what)
