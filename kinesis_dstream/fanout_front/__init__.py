"""A local endpoint that serves SubscribeToShard (enhanced fan-out) to boto3 as Kinesis does.

kinesis-local implements consumers but answers SubscribeToShard in a way botocore cannot read
(no initial-response event, errors as HTTP 200, no ChildShards, no 5 s takeover). The
``FanOutFront`` is a loopback HTTP/1.1 server in front of it: every other call passes through
unchanged; SubscribeToShard is answered here, built from the emulator's GetShardIterator and
GetRecords:

- refusals as HTTP 400 with Kinesis' ``__type``: an unknown or deregistered consumer or an
  unknown shard is ResourceNotFoundException, a consumer not ACTIVE ResourceInUseException,
  a second call within 1 s LimitExceededException, a call within 5 s of a successful one
  ResourceInUseException; later, the new subscription takes over and the old stream ends with
  a ResourceInUseException event;
- HTTP 200, chunked, ``application/vnd.amazon.eventstream``: an ``initial-response`` event,
  then one ``SubscribeToShardEvent`` per chunk. Records put through the front are pushed at
  once (it sees which shards PutRecord/PutRecords wrote to); others within ``poll_interval_s``
  (0.1 s) on a busy shard, ``idle_poll_interval_s`` (1 s) on one that has been idle; an
  idle shard gets an empty event every ``heartbeat_s``; events are paced to 2 MiB/s per
  consumer and shard;
- at the shard's end an event without continuation naming the ChildShards, then the body
  ends; after ``lifetime_s`` (300 s) the body simply ends, as AWS's does.

It serves SubscribeToShard over HTTP/1.1 (what botocore uses); an HTTP/2 connection (the Java
SDK's) is relayed to the emulator unchanged.
"""
from __future__ import annotations

from .rules import ReadPacer, Refused, SubscribeRules
from .server import FanOutFront
from .subscription import FrontSettings, SubscribeRequest, Subscription

__all__ = ["FanOutFront", "FrontSettings", "ReadPacer", "Refused", "SubscribeRequest",
           "SubscribeRules", "Subscription"]
