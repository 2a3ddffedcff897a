"""Drop-in ``KinesisUtils.createStream``: PySpark's signature, no Kinesis ASL jar.

``from kinesis_dstream import KinesisUtils, InitialPositionInStream`` replaces
``from pyspark.streaming.kinesis import ...``; the positional parameters, their order and
defaults are PySpark's. What Scala users have and Python users lack comes as keyword-only
extensions. Runs in the driver; how batches are planned, read and checkpointed:
``coordinator.py`` (leases), ``planner.py`` (batches), ``retrieval/`` (the reads, on executors),
``checkpointer.py`` (the checkpoint policy), ``dstream.py`` (the Spark hooks).
"""
from __future__ import annotations

import logging
import tempfile
import uuid
from datetime import datetime
from typing import Any, Callable, Mapping, Optional

from pyspark.storagelevel import StorageLevel
from pyspark.streaming import DStream, StreamingContext
from pyspark.streaming import kinesis as _pyspark_kinesis  # pure Python: needs no ASL jar

from ..config import ConsumerConfig, check_credentials, parse_stream_arn
from ..errors import ConfigurationError
from ..preflight import check_executors, use_driver_python_on_local_master
from ..worker.stall import ShardsView, largest_lag
from .dstream import attach, make_batch_function
from .planner import StreamSpec
from .rate import RateSettings
from .records import KinesisRecord, record_values
from .registry import coordinators, planner_for
from .task import batch_values

log = logging.getLogger(__name__)

__all__ = ["KinesisUtils", "InitialPositionInStream", "MetricsLevel", "utf8_decoder", "KinesisRecord"]



class InitialPositionInStream:
    LATEST, TRIM_HORIZON = (0, 1)
    AT_TIMESTAMP = 2  # extension: give initialPositionTimestamp too


class MetricsLevel:
    DETAILED, SUMMARY, NONE = (0, 1, 2)


# PySpark's own function: the default compares equal, and executors unpickle it from pyspark.
utf8_decoder = _pyspark_kinesis.utf8_decoder


_POSITIONS = {0: "LATEST", 1: "TRIM_HORIZON", 2: "AT_TIMESTAMP"}
_METRICS = {0: "DETAILED", 1: "SUMMARY", 2: "NONE"}


def _initial_position(value: Any, timestamp: Any) -> tuple[str, float | None]:
    if isinstance(value, datetime):
        value, timestamp = InitialPositionInStream.AT_TIMESTAMP, value
    if isinstance(value, str) and value.upper() in _POSITIONS.values():
        name = value.upper()
    elif isinstance(value, int) and not isinstance(value, bool) and value in _POSITIONS:
        name = _POSITIONS[value]
    else:
        raise ConfigurationError(
            "initialPositionInStream must be InitialPositionInStream.LATEST, TRIM_HORIZON or "
            f"AT_TIMESTAMP, got {value!r}")
    if name != "AT_TIMESTAMP":
        if timestamp is not None:
            raise ConfigurationError("initialPositionTimestamp is only for "
                                     "InitialPositionInStream.AT_TIMESTAMP")
        return name, None
    if timestamp is None:
        raise ConfigurationError("InitialPositionInStream.AT_TIMESTAMP needs "
                                 "initialPositionTimestamp (a datetime or epoch seconds)")
    if isinstance(timestamp, datetime):
        return name, timestamp.timestamp()
    if isinstance(timestamp, (int, float)) and not isinstance(timestamp, bool):
        return name, float(timestamp)
    raise ConfigurationError(f"initialPositionTimestamp must be a datetime or epoch seconds, "
                             f"got {timestamp!r}")


# createStream's argument names, for the credentials rule's messages.
_CREDENTIAL_ARGUMENTS = {"aws_access_key_id": "awsAccessKeyId", "aws_secret_key": "awsSecretKey",
                         "sts_assume_role_arn": "stsAssumeRoleArn",
                         "sts_session_name": "stsSessionName", "sts_external_id": "stsExternalId"}


def _batch_interval_ms(ssc: StreamingContext) -> int:
    return int(ssc._jssc.ssc().graph().batchDuration().milliseconds())


class KinesisUtils:
    @staticmethod
    def createStream(
        ssc: StreamingContext,
        kinesisAppName: str,
        streamName: str,
        endpointUrl: str,
        regionName: str,
        initialPositionInStream: int,
        checkpointInterval: int,
        metricsLevel: int = MetricsLevel.DETAILED,
        storageLevel: StorageLevel = StorageLevel.MEMORY_AND_DISK_2,
        awsAccessKeyId: Optional[str] = None,
        awsSecretKey: Optional[str] = None,
        decoder: Callable[[Optional[bytes]], Any] = utf8_decoder,
        stsAssumeRoleArn: Optional[str] = None,
        stsSessionName: Optional[str] = None,
        stsExternalId: Optional[str] = None,
        *,
        initialPositionTimestamp: Optional[datetime | float] = None,
        messageHandler: Optional[Callable[[KinesisRecord], Any]] = None,
        dynamoDBEndpoint: Optional[str] = None,
        cloudWatchEndpoint: Optional[str] = None,
        propertiesFile: Optional[str] = None,
        configOverrides: Optional[Mapping[str, Any]] = None,
    ) -> DStream:
        """Create an input stream that pulls messages from a Kinesis stream.

        Parameters as ``pyspark.streaming.kinesis.KinesisUtils.createStream``. Executors
        read each batch's records (a task reads a group of leased shards) and cache them at
        ``storageLevel``; the driver only plans. A position is checkpointed
        (``checkpointInterval`` seconds at most once per shard) only after the batch holding
        it completed, with its KPL sub-sequence number. Several createStream calls with one
        application name split the shards between them. Spark's checkpoint keeps
        ``awsAccessKeyId`` but never ``awsSecretKey``: a driver recovered by
        ``StreamingContext.getOrCreate`` reads that key's secret from its environment or
        ``AWS_PROFILE`` (docs/operations.md, Secrets). ``stsAssumeRoleArn`` may come without
        ``stsSessionName`` (the session is then named ``kinesis-dstream-<epoch seconds>``)
        and without ``stsExternalId``, which PySpark's JVM helper refused. ``streamName``
        may be the stream's ARN: every Kinesis call then names it by ARN (a stream of another
        account, read through its resource policy) and the ARN's region signs them;
        ``regionName`` stays the lease table's and the metrics' region.

        Keyword-only extensions:
        initialPositionTimestamp: with ``InitialPositionInStream.AT_TIMESTAMP`` (a datetime or
            epoch seconds; a datetime as initialPositionInStream also means AT_TIMESTAMP).
        messageHandler: called with a ``KinesisRecord`` (data, partition_key,
            sequence_number, sub_sequence_number, approximate_arrival_timestamp, shard_id)
            instead of ``decoder(data)``.
        dynamoDBEndpoint, cloudWatchEndpoint: endpoints of the lease table and metrics.
        propertiesFile: a KCL properties file as the source of settings; the non-None
            arguments above override it.
        configOverrides: ConsumerConfig fields by name (e.g. max_records,
            failover_time_ms), for tuning.
        """
        # A role may come alone (PySpark's JVM helper wanted all three STS arguments or none;
        # every combination it ran still runs).
        check_credentials(dict(aws_access_key_id=awsAccessKeyId, aws_secret_key=awsSecretKey,
                               sts_assume_role_arn=stsAssumeRoleArn,
                               sts_session_name=stsSessionName, sts_external_id=stsExternalId),
                          _CREDENTIAL_ARGUMENTS)
        if not isinstance(storageLevel, StorageLevel):
            raise ConfigurationError(f"storageLevel must be a pyspark StorageLevel, got {storageLevel!r}")
        if decoder is not None and not callable(decoder):
            raise ConfigurationError("decoder must be callable")
        if messageHandler is not None:
            if not callable(messageHandler):
                raise ConfigurationError("messageHandler must be callable")
            if decoder is not utf8_decoder and decoder is not None:
                raise ConfigurationError("give either decoder or messageHandler, not both")
        if (isinstance(checkpointInterval, bool) or not isinstance(checkpointInterval, (int, float))
                or checkpointInterval <= 0):
            raise ConfigurationError(
                f"checkpointInterval must be a positive number of seconds, got {checkpointInterval!r}")
        if metricsLevel not in _METRICS:
            raise ConfigurationError(
                f"metricsLevel must be MetricsLevel.DETAILED, SUMMARY or NONE, got {metricsLevel!r}")

        settings: dict[str, Any] = dict(
            application_name=kinesisAppName,
            **_stream_identity(streamName),
            region_name=regionName,
            kinesis_endpoint=endpointUrl or None,
            dynamodb_endpoint=dynamoDBEndpoint,
            cloudwatch_endpoint=cloudWatchEndpoint,
            aws_access_key_id=awsAccessKeyId,
            aws_secret_key=awsSecretKey,
            sts_assume_role_arn=stsAssumeRoleArn,
            sts_session_name=stsSessionName,
            sts_external_id=stsExternalId,
            checkpoint_interval_ms=int(checkpointInterval * 1000),
            metrics_level=_METRICS[metricsLevel],
        )
        if initialPositionInStream is not None or propertiesFile is None:
            position, timestamp = _initial_position(initialPositionInStream, initialPositionTimestamp)
            settings.update(initial_position=position, initial_position_timestamp=timestamp)
        config = _build_config(settings, propertiesFile, configOverrides)
        conf = dict(ssc.sparkContext.getConf().getAll())
        config = config.with_spark_conf(conf)
        use_driver_python_on_local_master(ssc.sparkContext)
        check_executors(ssc.sparkContext)  # fails here, naming the workers' Python, not 10 s in
        if config.retrieval_mode == "FANOUT":
            config = config.replace(consumer_arn=_fan_out_consumer(config))

        spec = StreamSpec(
            key=uuid.uuid4().hex,
            config=config.to_dict(),
            batch_interval_ms=_batch_interval_ms(ssc),
            rate=RateSettings.from_spark_conf(conf),
            storage_level=storageLevel,
        )
        empty_dir = tempfile.mkdtemp(prefix="kinesis-dstream-input-")
        values = record_values(None if messageHandler is not None else decoder, messageHandler)
        planner = planner_for(spec)
        attach(ssc, planner, values)
        base = ssc.textFileStream("file://" + empty_dir)
        stream = base.transform(make_batch_function(spec, empty_dir, values))
        # foreachRDD wraps each batch's RDD with the stream's serializer, not the RDD's own:
        # the same rule as the batch RDD's, so the two always agree
        batch_values(stream)
        stream.metrics = lambda: planner_for(spec).coordinator.metrics(spec.key)  # type: ignore[attr-defined]
        log.info("Kinesis DStream on %s (application %s, %s); leases are taken when the "
                 "StreamingContext starts", config.stream_name, config.application_name,
                 config.initial_position)
        return stream

    @staticmethod
    def metrics(streamName: Optional[str] = None) -> ShardsView:
        """Per-shard view of this driver's Kinesis streams (of ``streamName`` if given).

        shard id -> records (read by executors), data_bytes, millis_behind_latest, owner
        (this driver's worker id while it holds the lease), last_checkpoint (as written to
        the lease table), processed (highest position of a completed batch), state,
        read_by_pids (the executor processes that read it), throttled (reads Kinesis refused
        for throughput, waited out, in completed batches), faults (other transient read
        failures waited out). The application's figures are attributes (``ShardsView``):
        millis_behind_latest (the largest over the shards), stalled_shards, stalls.
        """
        if streamName is not None:  # an ARN as createStream took it
            streamName = _stream_identity(streamName)["stream_name"]
        views = [coordinator.metrics() for coordinator in coordinators()
                 if coordinator.started and streamName in (None, coordinator.config.stream_name)]
        return ShardsView({k: v for view in views for k, v in view.items()},
                          largest_lag(view.millis_behind_latest for view in views),
                          [s for view in views for s in view.stalled_shards],
                          sum(view.stalls for view in views))


def _stream_identity(stream_name: str) -> dict[str, Any]:
    """ConsumerConfig's stream fields for createStream's ``streamName``, a name or an ARN
    (stream names have no colon, so anything starting ``arn:`` is meant as one)."""
    arn = parse_stream_arn(stream_name) if isinstance(stream_name, str) else None
    if arn is not None:
        return {"stream_name": arn.stream_name, "stream_arn": stream_name}
    if isinstance(stream_name, str) and stream_name.startswith("arn:"):
        raise ConfigurationError(
            f"streamName {stream_name!r} is neither a stream name nor a Kinesis stream ARN "
            "(arn:aws:kinesis:<region>:<account>:stream/<name>)")
    return {"stream_name": stream_name, "stream_arn": None}


def _fan_out_consumer(config: ConsumerConfig) -> str:
    """The ARN of the application's ACTIVE fan-out consumer, registered here, once, by the
    driver (never deregistered, as the KCL), for the tasks' config; a consumer that cannot be
    registered stops createStream with a ``ConsumerRegistrationError`` in bounded time."""
    from ..aws.kinesis import KinesisClient
    from ..aws.stream_consumer import check_stream_consumer, register_stream_consumer

    kinesis = KinesisClient(config)
    if config.consumer_arn is not None:
        arn = check_stream_consumer(kinesis, config.consumer_arn)
    else:
        arn = register_stream_consumer(kinesis, config.fan_out_consumer_name)
    log.info("executors read stream %s by enhanced fan-out as consumer %s", config.stream_name,
             arn)
    return arn


def _build_config(settings: dict[str, Any], properties_file: Optional[str],
                  overrides: Optional[Mapping[str, Any]]) -> ConsumerConfig:
    """One ConsumerConfig: properties file (if any) < createStream arguments < configOverrides."""
    settings = dict(settings)
    if properties_file is not None:
        from ..multilang.properties import consumer_config_from_properties

        given = {k: v for k, v in settings.items() if v is not None}
        if given.get("metrics_level") == "DETAILED":  # createStream's default: the file's wins
            given.pop("metrics_level")
        config = consumer_config_from_properties(properties_file, **given)
    else:
        config = ConsumerConfig(**settings)
    if overrides:
        config = config.replace(**dict(overrides))
    return config
