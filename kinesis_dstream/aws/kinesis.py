"""A thin Kinesis client: the calls a polling consumer needs, and SubscribeToShard, with our errors.

Every call goes through the one ``RetryPolicy`` (Spark's retry settings), and every
botocore error is translated by ``translate_error`` so callers see ``StreamNotFoundError``,
``ThrottlingError`` and friends instead of botocore's codes. Messages name the stream, the
region and the endpoint, because "ResourceNotFoundException" alone does not tell a user
which of their settings is wrong.
"""
from __future__ import annotations

import datetime as _dt
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..config import ConsumerConfig
from ..errors import PERMANENT, KinesisDStreamError, ThrottlingError, TransientServiceError
from ..retry import RetryPolicy
from .clients import call, error_code, make_client, translate_error
from .protocols import KinesisAPI, StreamConsumerAPI

log = logging.getLogger(__name__)

ITERATOR_TYPES = ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER", "TRIM_HORIZON", "LATEST",
                  "AT_TIMESTAMP")
# A subscription's connection waits this long for the next event: Kinesis pushes one at
# least every few seconds, even on an idle shard, so silence this long is a dead connection.
SUBSCRIPTION_READ_TIMEOUT_S = 35.0
# Every subscription holds one connection for its 5 minutes: a worker's shards need a pool
# of that many, or urllib3 opens and discards connections beyond it with a warning each.
SUBSCRIPTION_POOL_SIZE = 1000


@dataclass(frozen=True)
class Shard:
    """One shard as ListShards describes it; hash keys are decimal strings as in the lease table."""

    shard_id: str
    parent_shard_id: str | None
    adjacent_parent_shard_id: str | None
    starting_hash_key: str
    ending_hash_key: str
    starting_sequence_number: str | None
    ending_sequence_number: str | None

    @property
    def is_closed(self) -> bool:
        """A closed shard (after a split or merge) has an ending sequence number."""
        return self.ending_sequence_number is not None

    @property
    def parent_shard_ids(self) -> list[str]:
        return [p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p]

    @classmethod
    def from_api(cls, item: dict) -> "Shard":
        hash_range = item.get("HashKeyRange", {})
        seq_range = item.get("SequenceNumberRange", {})
        return cls(
            shard_id=item["ShardId"],
            parent_shard_id=item.get("ParentShardId"),
            adjacent_parent_shard_id=item.get("AdjacentParentShardId"),
            starting_hash_key=hash_range.get("StartingHashKey", "0"),
            ending_hash_key=hash_range.get("EndingHashKey", "0"),
            starting_sequence_number=seq_range.get("StartingSequenceNumber"),
            ending_sequence_number=seq_range.get("EndingSequenceNumber"),
        )


class KinesisClient:
    """Kinesis calls for one stream, retried and translated.

    ``client``, ``sleep`` and ``rand`` exist so unit tests can pass a stubbed boto3 client,
    a fake clock and a fixed jitter; ``policy`` replaces the config's retry policy (the
    executors' reads pace throttles themselves).
    """

    def __init__(self, config: ConsumerConfig, client: KinesisAPI | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[], float] = random.random,
                 policy: RetryPolicy | None = None,
                 subscriber: StreamConsumerAPI | None = None) -> None:
        self._config = config
        self._client = client if client is not None else make_client(config, "kinesis")
        # Made on the first fan-out call (a polling reader never needs it); a stubbed client
        # serves both.
        self._subscriber = subscriber if subscriber is not None else (
            client if client is not None else None)
        self._policy = policy if policy is not None else RetryPolicy.from_config(config)
        self._sleep = sleep
        self._rand = rand
        self.stream_name = config.stream_name
        # How every call names the stream: by ARN when the config has one (a stream of another
        # account, read through its resource policy, is known by ARN only), else by name.
        self.stream: dict[str, Any] = ({"StreamARN": config.stream_arn} if config.stream_arn
                                       else {"StreamName": config.stream_name})

    @property
    def endpoint_url(self) -> str:
        return str(getattr(self._client.meta, "endpoint_url", "") or "")

    def _where(self) -> str:
        return (f"stream {self._config.stream_arn or self.stream_name!r} in "
                f"{self._config.kinesis_region} at {self.endpoint_url}")

    def _call(self, operation: str, what: str, **kwargs: Any) -> dict:
        return call(self._policy, getattr(self._client, operation), what, sleep=self._sleep,
                    rand=self._rand, **kwargs)

    def describe_stream_summary(self) -> dict:
        """The stream's summary; called at start so a wrong name fails at once, clearly."""
        answer = self._call("describe_stream_summary", f"describing {self._where()}",
                            **self.stream)
        return answer["StreamDescriptionSummary"]

    def list_shards(self) -> list[Shard]:
        """Every shard of the stream, open and closed, following NextToken."""
        what = f"listing shards of {self._where()}"
        answer = self._call("list_shards", what, **self.stream)
        shards = [Shard.from_api(s) for s in answer.get("Shards", [])]
        while answer.get("NextToken"):
            # NextToken may not be combined with StreamName (nor StreamARN).
            answer = self._call("list_shards", what, NextToken=answer["NextToken"])
            shards.extend(Shard.from_api(s) for s in answer.get("Shards", []))
        return shards

    def get_shard_iterator(self, shard_id: str, iterator_type: str,
                           sequence_number: str | None = None,
                           timestamp: float | _dt.datetime | None = None) -> str:
        if iterator_type not in ITERATOR_TYPES:
            raise ValueError(f"unknown iterator type {iterator_type!r}")
        kwargs: dict[str, Any] = {**self.stream, "ShardId": shard_id,
                                  "ShardIteratorType": iterator_type}
        if iterator_type in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
            if not sequence_number:
                raise ValueError(f"{iterator_type} needs a sequence number")
            kwargs["StartingSequenceNumber"] = sequence_number
        if iterator_type == "AT_TIMESTAMP":
            if timestamp is None:
                raise ValueError("AT_TIMESTAMP needs a timestamp")
            if not isinstance(timestamp, _dt.datetime):
                timestamp = _dt.datetime.fromtimestamp(float(timestamp), tz=_dt.timezone.utc)
            kwargs["Timestamp"] = timestamp
        position = f" {sequence_number}" if sequence_number else ""
        answer = self._call(
            "get_shard_iterator",
            f"getting a {iterator_type}{position} iterator for shard {shard_id} of {self._where()}",
            **kwargs)
        return answer["ShardIterator"]

    def get_records(self, iterator: str, limit: int, *, shard_id: str = "") -> dict:
        """The raw GetRecords answer (Records, NextShardIterator, MillisBehindLatest, ChildShards).

        Retrying with the same iterator is safe: an iterator can be read again until it expires.
        """
        shard = f" shard {shard_id}" if shard_id else ""
        # GetRecords names no stream, but takes StreamARN: a cross-account read sends it.
        arn = {"StreamARN": self._config.stream_arn} if self._config.stream_arn else {}
        return self._call("get_records", f"reading{shard} of {self._where()}",
                          ShardIterator=iterator, Limit=limit, **arn)

    # -- enhanced fan-out -----------------------------------------------------------------------
    @property
    def consumers(self) -> StreamConsumerAPI:
        """The client of fan-out calls: its own pool and a read timeout that outlasts the
        pause between a subscription's events."""
        if self._subscriber is None:
            self._subscriber = make_client(
                self._config, "kinesis",
                read_timeout_s=max(self._config.read_timeout_s, SUBSCRIPTION_READ_TIMEOUT_S),
                pool_size=SUBSCRIPTION_POOL_SIZE)
        return self._subscriber  # type: ignore[return-value]

    def call_consumers(self, operation: str, what: str, *, expected: tuple[str, ...] = (),
                       **kwargs: Any) -> dict:
        """A consumer call (Describe/Register/DeregisterStreamConsumer) under the retry policy."""
        return call(self._policy, getattr(self.consumers, operation), what, expected=expected,
                    sleep=self._sleep, rand=self._rand, **kwargs)

    def subscribe_to_shard(self, consumer_arn: str, shard_id: str,
                           starting_position: dict[str, Any]) -> Any:
        """Open one subscription; its ``EventStream`` yields ``{"SubscribeToShardEvent": ...}``.

        One try, no retry: the record source paces its resubscriptions. ResourceInUse (the
        5 s rule, a consumer not ACTIVE yet) comes back as a throttle, to be waited out.
        """
        what = (f"subscribing to shard {shard_id} of {self._where()} at "
                f"{starting_position.get('Type')} {starting_position.get('SequenceNumber', '')}")
        try:
            answer = self.consumers.subscribe_to_shard(
                ConsumerARN=consumer_arn, ShardId=shard_id, StartingPosition=starting_position)
        except Exception as exc:  # noqa: BLE001 - translated to ours
            raise subscription_error(exc, what) from exc
        return answer["EventStream"]


def subscription_error(exc: BaseException, what: str) -> KinesisDStreamError:
    """Our error for a failed subscribe or a subscription that failed mid-stream.

    ResourceInUse is a refusal to wait out (another subscription within 5 s, a consumer
    still CREATING), so it is a throttle; a broken connection is transient.
    """
    if error_code(exc) == "ResourceInUseException":
        error = ThrottlingError(f"{what}: {exc}")
        error.code = "ResourceInUseException"
        return error
    translated = translate_error(exc, what)
    if translated.kind == PERMANENT and translated.code is None and _is_connection_error(exc):
        return TransientServiceError(f"{what}: {type(exc).__name__}: {exc}")
    return translated


def _is_connection_error(exc: BaseException) -> bool:
    """urllib3 and socket errors raised while an event stream is read (botocore wraps only
    the errors of the request itself). urllib3 is imported here, not with the module: a
    process that reads nothing need not import it, and one reading an event stream has."""
    import urllib3.exceptions

    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))
