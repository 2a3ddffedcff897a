"""The ``aws-kinesis`` data source: one class that Spark finds by name.

Streaming reads (``reader.py`` plans on the driver, ``partition_reader.py`` reads on
executors), batch and streaming writes (``sink.py``). ``schema()`` is the source's:
``aws-kinesis`` has the awslabs connector's columns, ``kinesis`` Databricks' (``stream``,
``shardId``), both with ``subSequenceNumber`` so KPL user records can be told apart (see
``partition_reader``).
A batch read (``spark.read``) is not offered: it fails in one place, ``_no_batch_read``.

Registration needs no call: the top-level modules ``pyspark_kinesis_dstream`` (``aws-kinesis``)
and ``pyspark_kinesis`` (``kinesis``) expose subclasses as ``DefaultSource``, which PySpark
imports at its first data source lookup, in the Python that ``PYSPARK_DRIVER_PYTHON`` /
``PYSPARK_PYTHON`` name when the JVM starts, else ``python3`` from PATH: a job run as
``venv/bin/python job.py`` finds nothing there (Spark's ``DATA_SOURCE_NOT_FOUND``).
``register(spark)`` registers both names from the driver's own interpreter instead, after
checking that Spark's Python workers on the executors can import what the reads and writes
need.
"""
from __future__ import annotations

import logging
import sys
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ..preflight import (
    SQL_MODULES,
    check_executors,
    check_local_imports,
    python_exec,
    use_driver_python_on_local_master,
)
from .executor_guard import guarded_reduce
from .source_stop import LISTENER_ENV

# What a method needs is imported in it: every one of Spark's Python processes for a query
# imports this module (the lookup, the schema, the source's runner, the read's planning, the
# executors' readers), and each needs a different part. The lookup needs this class alone;
# the schema the options; only the runner and the readers make AWS clients (boto3).


def _no_batch_read(format_name: str) -> NoReturn:
    raise NotImplementedError(
        f"format {format_name!r} reads as a stream only: use spark.readStream (with "
        "Trigger.AvailableNow to read what the stream holds and stop)")


# Spark SQL's own setting for the interpreter of the executors' SQL Python workers (the
# reads and writes of a Python data source); the driver-side calls run the data source's own.
SQL_WORKER_PYTHON = "spark.sql.execution.pyspark.python"
log = logging.getLogger(__name__)
_ROLE = "The Python process Spark started for format(\"aws-kinesis\")"


def _check_this_python() -> None:
    """Spark starts executors' data source workers with this interpreter too, by default."""
    check_local_imports(SQL_MODULES[1:], _ROLE)


def _choose_workers_python() -> None:
    """``spark.dataSource.register(KinesisDataSource)`` asks ``name()`` in the driver just
    before it records the interpreter the source's processes run (``sc.pythonExec``): on a
    local master with none chosen, this driver's, as ``register(spark)`` does, rather than
    ``python3`` from PATH. Elsewhere (Spark's own lookup, the source's processes) no
    SparkContext is active in the process and nothing changes."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is not None:
        use_driver_python_on_local_master(sc)


class KinesisDataSource(DataSource):
    """``format("aws-kinesis")``: options as the awslabs spark-sql-kinesis-connector names them."""

    # The columns of its rows (see partition_reader.LAYOUTS).
    layout = "awslabs"

    @classmethod
    def name(cls) -> str:
        _choose_workers_python()
        return "aws-kinesis"

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Spark ships the source with its readers: a worker without the package fails
        # naming its interpreter (executor_guard).
        return guarded_reduce(self, dict(self.__dict__), "format(\"aws-kinesis\")'s reads "
                              "and writes") or super().__reduce_ex__(protocol)

    def schema(self) -> StructType:
        from .options import parse_source_options
        from .partition_reader import spark_schema

        # Spark asks for the schema of a read only: a bad source option fails load(), named.
        parse_source_options(self.options)
        return spark_schema(self.layout)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .options import parse_options
        from .sink import KinesisBatchWriter

        _check_this_python()
        return KinesisBatchWriter(parse_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .options import parse_options
        from .sink import KinesisStreamWriter

        _check_this_python()
        return KinesisStreamWriter(parse_options(self.options), schema)

    def reader(self, schema: StructType) -> NoReturn:
        _no_batch_read(self.name())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        from .options import parse_source_options
        from .reader import KinesisStreamReader

        _check_this_python()
        return KinesisStreamReader(parse_source_options(self.options), layout=self.layout)


class KinesisShortNameDataSource(KinesisDataSource):
    """``kinesis``: the name qubole's and Databricks' connectors use; the same options, which
    include those connectors' names (``initialPosition``, ``region``, ...: see ``options``),
    and Databricks' row schema (``stream``, ``shardId``)."""

    layout = "databricks"

    @classmethod
    def name(cls) -> str:
        _choose_workers_python()
        return "kinesis"


def register(spark: Any) -> None:
    """Register ``aws-kinesis`` and ``kinesis`` in ``spark``, working wherever the driver runs.

    The data source's driver-side calls then run in this driver's interpreter (which has the
    package: it is running this), the executors' reads and writes in the interpreter Spark's
    Python workers use (``PYSPARK_PYTHON`` / ``spark.pyspark.python``; on a local master with
    neither, this one), recorded as ``spark.sql.execution.pyspark.python`` unless that is
    set. A probe read (``worker_probe``) checks that those workers import the package,
    boto3, protobuf and pyarrow, and raises ``ExecutorEnvironmentError`` naming the
    interpreter if not; it leaves them started for the first batch of a query.

    It also adds the query listener that deregisters a fan-out consumer when its query
    stops (``consumer_listener``; a source has no stop hook of its own that PySpark keeps).
    """
    from .worker_probe import data_source_probe_job

    sc = spark.sparkContext
    use_driver_python_on_local_master(sc)
    chosen = spark.conf.get(SQL_WORKER_PYTHON, None)
    executor_python = chosen or sc.pythonExec
    spark.conf.set(SQL_WORKER_PYTHON, executor_python)  # the probe's read runs there too
    # The sources' processes leave deregistration to the listener (source_stop). The probe
    # is made with the same environment: Spark keeps a pool of Python workers per
    # interpreter and environment, and the workers the probe starts are to serve the first
    # query's reads (with another environment the first reading started its own, cold:
    # 5-6 s more to a first query's rows, found by bench_restarts' first cycle).
    environment = {**source_runner_environment(sc), LISTENER_ENV: "1"}
    try:
        with _environment(sc, environment):
            check_executors(sc, SQL_MODULES, python=executor_python,
                            purpose="format(\"aws-kinesis\")'s reads and writes",
                            job=data_source_probe_job(spark, executor_python,
                                                      sc.defaultParallelism))
    except BaseException:
        if chosen is None:
            spark.conf.unset(SQL_WORKER_PYTHON)
        raise
    with python_exec(sc, sys.executable), _environment(sc, environment):
        for source in (KinesisDataSource, KinesisShortNameDataSource):
            _register_unless_found(spark, source)
    _listen_for_stops(spark)


@contextmanager
def _environment(sc: Any, values: dict[str, str]) -> Iterator[None]:
    """``values`` in the environment of the Python functions (here: data sources) that are
    wrapped meanwhile: PySpark gives them ``sc.environment``."""
    previous = {name: sc.environment.get(name) for name in values}
    sc.environment.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                sc.environment.pop(name, None)
            else:
                sc.environment[name] = value


def source_runner_environment(sc: Any) -> dict[str, str]:
    """What Spark's streaming source runner adds to a registered source's environment, with
    the values it adds, so that its additions are never new keys.

    Each query's runner (``PythonStreamingSourceRunner.init``, pyspark 4.x) puts these into
    the environment map of the registered data source's function: one ``java.util.HashMap``
    shared by every query of the source and serialized into their tasks, with no lock. Two
    queries starting at once could add the same keys together and leave its count wrong;
    every task of every query of the source then failed as executors deserialized it
    (``java.io.OptionalDataException``: docs/operations.md, "Queries started together").
    With the keys present from registration, a runner only replaces values, which changes no
    count. Every runner that starts a worker (the source's, the planner's, the executors')
    sets these in its copy first, so the values here are never a worker's: they are the
    configured ones, as near as the driver's Python knows them without Spark's internals."""
    conf = sc.getConf()
    try:
        timeout = sc._jvm.org.apache.spark.network.util.JavaUtils.timeStringAsSec(
            conf.get("spark.python.authenticate.socketTimeout", "15s"))
    except Exception as exc:  # noqa: BLE001 - py4j's errors: Spark's internals moved
        log.warning("cannot prepare the data source's shared environment (%s): queries of "
                    "it started at the same moment may fail their tasks", exc)
        return {}
    return {
        "SPARK_LOCAL_DIRS": conf.get("spark.local.dir", None) or tempfile.gettempdir(),
        "SPARK_AUTH_SOCKET_TIMEOUT": str(timeout),
        "SPARK_BUFFER_SIZE": str(int(conf.get("spark.buffer.size", "65536"))),
        "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER",
    }


def _listen_for_stops(spark: Any) -> None:
    """One ``ConsumerDeregistration`` per session, however often ``register`` is called."""
    from .consumer_listener import listen

    if getattr(spark, _LISTENING, False):
        return
    listen(spark)
    setattr(spark, _LISTENING, True)


_LISTENING = "_kinesis_dstream_consumer_listener"


def _register_unless_found(spark: Any, source: type[DataSource]) -> None:
    """pyspark 4.0 refuses to register a name its own lookup found (4.1+ replaces it): that
    registration came from a Python that has the package, so it serves as well."""
    try:
        spark.dataSource.register(source)
    except Exception as exc:  # noqa: BLE001 - pyspark's AnalysisException, matched by its code
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
        log.info("format(%r) was found by Spark's own lookup; that registration stays",
                 source.name())
