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
