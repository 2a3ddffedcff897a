"""A Spark task's input acknowledged at once (``executor_process.acknowledge_input_at_once``):
on a loopback socket pair, as a Python worker's to its executor JVM."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.skipif(not hasattr(__import__("socket"), "TCP_QUICKACK"), reason="Linux only")
def test_a_task_has_its_workers_socket_acknowledge_at_once(monkeypatch) -> None:
    """The worker's TCP sockets (those it has at its first task) are put in quick-ack mode
    at every task, so the JVM's second write (the partition) is not held 40 ms."""
    import socket

    from kinesis_dstream.retrieval import executor_process

    listener = socket.create_server(("127.0.0.1", 0))
    worker = socket.create_connection(listener.getsockname())
    jvm, _ = listener.accept()
    try:
        monkeypatch.setattr(executor_process, "_worker_sockets", None)
        worker.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
        executor_process.acknowledge_input_at_once()
        assert worker.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
        worker.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)  # the kernel's own turn
        executor_process.acknowledge_input_at_once()  # the next task: the same socket again
        assert worker.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
        later = socket.create_connection(listener.getsockname())  # one of ours, opened later
        later.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
        executor_process.acknowledge_input_at_once()
        assert later.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 0
        later.close()
    finally:
        for sock in (worker, jvm, listener):
            sock.close()


def test_an_output_task_over_a_batchs_values_acknowledges_its_input(monkeypatch) -> None:
    """A batch's RDD carries ``BatchSerializer``: a task that loads its cached values (an
    output operation's) acknowledges its input first, the driver's own loads (a collect) do
    not; it reads what PySpark's default serializer wrote and compares equal to it, so
    ``union`` and ``_reserialize`` add no pass."""
    import io

    from pyspark import TaskContext, cloudpickle
    from pyspark.serializers import AutoBatchedSerializer, CPickleSerializer

    from kinesis_dstream.spark import task

    calls: list[int] = []
    monkeypatch.setattr(task, "acknowledge_input_at_once", lambda: calls.append(1))
    default = AutoBatchedSerializer(CPickleSerializer())
    written = io.BytesIO()
    default.dump_stream(iter(["a", "b", 3]), written)

    ours = cloudpickle.loads(cloudpickle.dumps(task.BatchSerializer()))  # as in a command
    assert ours == default and default == ours and not ours != default
    assert hash(ours) == hash(default)

    assert list(ours.load_stream(io.BytesIO(written.getvalue()))) == ["a", "b", 3]
    assert calls == []  # the driver's collect: no task
    monkeypatch.setattr(TaskContext, "get", classmethod(lambda cls: object()))
    assert list(ours.load_stream(io.BytesIO(written.getvalue()))) == ["a", "b", 3]
    assert calls == [1]


def test_a_batch_rdd_gets_the_batch_serializer_unless_the_context_has_its_own() -> None:
    from pyspark.serializers import AutoBatchedSerializer, CPickleSerializer, MarshalSerializer

    from kinesis_dstream.spark.task import BatchSerializer, batch_values

    class FakeRDD:
        def __init__(self, serializer: object) -> None:
            self._jrdd_deserializer = serializer

    assert isinstance(batch_values(FakeRDD(AutoBatchedSerializer(CPickleSerializer())))
                      ._jrdd_deserializer, BatchSerializer)
    own = MarshalSerializer()
    assert batch_values(FakeRDD(own))._jrdd_deserializer is own
