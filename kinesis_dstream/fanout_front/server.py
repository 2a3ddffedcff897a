"""The loopback HTTP/1.1 front: every call goes to the emulator unchanged except
SubscribeToShard, which the front answers as Kinesis does (see the package docstring)."""
from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from . import frames
from .put_log import PutLog
from .rules import MiB, ReadPacer, Refused, SubscribeRules
from .subscription import FrontSettings, SubscribeRequest, Subscription
from .upstream import (
    HTTP2_PREFACE,
    JSON_CONTENT_TYPE,
    TARGET_PREFIX,
    Upstream,
    UpstreamError,
    end_to_end,
    send_body,
    tunnel,
)

log = logging.getLogger(__name__)

_START_TYPES = ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER", "TRIM_HORIZON", "LATEST",
                "AT_TIMESTAMP")


class FanOutFront:
    """SubscribeToShard for boto3 in front of a Kinesis emulator (kinesis-local).

    ``upstream`` is the emulator's ``http://host:port``; ``endpoint`` is where clients go.
    ``lifetime_s`` ends each subscription (Kinesis: 300 s), ``heartbeat_s`` spaces the empty
    events on an idle shard, ``poll_interval_s`` is how often an open subscription asks the
    emulator for new records (backing off to ``idle_poll_interval_s`` while none come; a put
    through the front wakes its shard's subscriptions at once),
    ``read_bytes_per_s`` paces each consumer's reads of a shard.
    ``call_interval_s`` and ``takeover_after_s`` are SubscribeToShard's 1 s and 5 s rules.
    ``wake_only``: every put comes through the front and the stream is not resharded, so a
    shard is read only when a put wakes it and an idle one costs the emulator nothing; the
    put's records are pushed from the put itself (``put_log``) once a subscription is at the tip.
    """

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", port: int = 0,
                 lifetime_s: float = 300.0, heartbeat_s: float = 5.0,
                 poll_interval_s: float = 0.1, idle_poll_interval_s: float = 1.0,
                 read_bytes_per_s: float = 2 * MiB,
                 call_interval_s: float = 1.0, takeover_after_s: float = 5.0,
                 wake_only: bool = False) -> None:
        self.upstream = Upstream(upstream)
        self.settings = FrontSettings(lifetime_s=lifetime_s, heartbeat_s=heartbeat_s,
                                      poll_interval_s=poll_interval_s,
                                      idle_poll_interval_s=idle_poll_interval_s,
                                      wake_only=wake_only)
        self.rules: SubscribeRules[Subscription] = SubscribeRules(
            call_interval_s=call_interval_s, takeover_after_s=takeover_after_s)
        self.pacer = ReadPacer(read_bytes_per_s)
        self._address = (host, port)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._consumer_seen: dict[str, float] = {}  # consumer ARN -> when last seen present
        # ARN -> (ACTIVE description, when): a wide stream's subscribe calls ask once
        self._active: dict[str, tuple[dict[str, Any], float]] = {}
        self._consumers_gone: set[str] = set()
        self._lock = threading.Lock()
        # wake_only: every put comes through here, so its records are pushed from the log
        self.put_log = PutLog() if wake_only else None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the fan-out front is not started")
        return f"http://{self._address[0]}:{self._server.server_port}"

    def start(self) -> "FanOutFront":
        front = self

        class Handler(_FrontHandler):
            owner = front

        self._server = _Server(self._address, Handler)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name="fanout-front", daemon=True)
        self._thread.start()
        log.info("fan-out front at %s for %s:%s", self.endpoint, self.upstream.host,
                 self.upstream.port)
        return self

    def stop(self) -> None:
        """Stop serving; open subscriptions end at once (their clients see the body end)."""
        server, self._server = self._server, None
        for subscription in self.rules.current():
            subscription.end_with("InternalFailureException", "The endpoint is shutting down.")
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FanOutFront":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def subscriptions(self) -> list[Subscription]:
        """The subscriptions open now, one per (consumer, shard) at most."""
        return self.rules.current()

    # -- calls -------------------------------------------------------------------------------
    def forward(self, operation: str, handler: "_FrontHandler", body: bytes) -> None:
        """Pass a call to the emulator and its answer back unchanged."""
        headers = end_to_end(handler.headers.items())
        put = operation in ("PutRecord", "PutRecords")
        relay = self.put_log.relay if put and self.put_log is not None else contextlib.nullcontext()
        with relay:  # a logged put's answer is logged before the next put is relayed
            try:
                status, reply_headers, data = self.exchange(operation, handler.command,
                                                            handler.path, body, headers)
            except OSError as exc:
                send_body(handler, 502, [("Content-Type", "text/plain")],
                          f"upstream unreachable: {exc}".encode())
                return
            if put and status == 200:
                self._records_put(operation, json.loads(body or b"{}"), json.loads(data or b"{}"))
        if operation == "DeregisterStreamConsumer" and status == 200:
            self._consumer_deregistered(json.loads(body or b"{}"), handler)
        send_body(handler, status, reply_headers, data)

    def exchange(self, operation: str, method: str, path: str, body: bytes,
                 headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        """One passed-through call and the emulator's answer (status, headers, body)."""
        return self.upstream.request(method, path, body, headers)

    def subscribe(self, handler: "_FrontHandler", body: bytes) -> None:
        """SubscribeToShard: refuse as Kinesis does, or stream events until the end."""
        auth = {k: v for k, v in handler.headers.items()
                if k.lower() in ("authorization", "x-amz-date")}
        try:
            request, iterator = self._open(json.loads(body or b"{}"), auth)
        except (Refused, UpstreamError) as exc:
            handler.send_error_body(exc.code, exc.message)
            return
        except OSError as exc:  # the emulator is unreachable
            handler.send_error_body("InternalFailureException", str(exc), status=500)
            return
        subscription = Subscription(
            request, iterator, upstream=self.upstream, auth=auth, settings=self.settings,
            pacer=self.pacer, send=self.send, write=handler.write_chunk,
            consumer_gone=lambda arn: self._consumer_gone(arn, auth), put_log=self.put_log)
        previous = self.rules.succeeded(request.consumer_arn, request.shard_id, subscription)
        if previous is not None:
            previous.end_with("ResourceInUseException",
                              f"Another subscription took over consumer {request.consumer_arn} "
                              f"on shard {request.shard_id}.")
        try:
            handler.start_event_stream()
            self.send(subscription, frames.event("initial-response", {}))
            reason = subscription.run()
        except OSError:
            reason = "client-gone"
        finally:
            self.rules.ended(request.consumer_arn, request.shard_id, subscription)
        log.debug("subscription %s ended: %s", subscription.key, reason)
        handler.end_event_stream(cut=reason == "client-gone")

    def send(self, subscription: Subscription, message: bytes) -> None:
        """Write one event-stream message as one chunk (an OSError: the client is gone)."""
        subscription.write(frames.chunk(message))

    def _open(self, call: dict[str, Any], auth: dict[str, str]) -> tuple[SubscribeRequest, str]:
        consumer_arn, shard_id = str(call.get("ConsumerARN", "")), str(call.get("ShardId", ""))
        position = dict(call.get("StartingPosition") or {})
        if position.get("Type") not in _START_TYPES:
            raise Refused("InvalidArgumentException",
                          f"StartingPosition Type must be one of {', '.join(_START_TYPES)}.")
        consumer = self._consumer(consumer_arn, auth)
        if consumer["ConsumerStatus"] != "ACTIVE":
            raise Refused("ResourceInUseException",
                          f"Consumer {consumer_arn} is {consumer['ConsumerStatus']}, not ACTIVE.")
        self.rules.admit(consumer_arn, shard_id)
        stream_name = str(consumer["StreamARN"]).partition(":stream/")[2]
        kwargs: dict[str, Any] = {"ShardIteratorType": position["Type"]}
        if "SequenceNumber" in position:
            kwargs["StartingSequenceNumber"] = position["SequenceNumber"]
        if "Timestamp" in position:
            kwargs["Timestamp"] = position["Timestamp"]
        try:
            iterator = self.upstream.call("GetShardIterator", {
                "StreamName": stream_name, "ShardId": shard_id, **kwargs}, auth)["ShardIterator"]
        except UpstreamError as exc:
            if exc.code == "ResourceNotFoundException" and "SequenceNumber" not in exc.message:
                exc.message = f"Shard {shard_id} in stream {stream_name} not found."
            raise
        return SubscribeRequest(consumer_arn, shard_id, stream_name, position), iterator

    def _consumer(self, consumer_arn: str, auth: dict[str, str]) -> dict[str, Any]:
        """The consumer's description; an ACTIVE one is remembered for a heartbeat."""
        with self._lock:
            known, when = self._active.get(consumer_arn, ({}, -1e9))
        if known and time.monotonic() - when < self.settings.heartbeat_s:
            return known
        return self._describe_consumer(consumer_arn, auth)

    def _describe_consumer(self, consumer_arn: str, auth: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            self._active.pop(consumer_arn, None)
        try:
            answer = self.upstream.call("DescribeStreamConsumer", {"ConsumerARN": consumer_arn},
                                        auth)
        except UpstreamError as exc:
            if exc.code in ("ResourceNotFoundException", "SerializationException"):
                raise Refused("ResourceNotFoundException",
                              f"Consumer {consumer_arn} not found.") from None
            raise
        consumer = dict(answer["ConsumerDescription"])
        if consumer["ConsumerStatus"] == "DELETING":
            raise Refused("ResourceNotFoundException", f"Consumer {consumer_arn} not found.")
        if consumer["ConsumerStatus"] == "ACTIVE":
            with self._lock:
                self._active[consumer_arn] = (consumer, time.monotonic())
        return consumer

    def _consumer_deregistered(self, call: dict[str, Any], handler: "_FrontHandler") -> None:
        """End the deregistered consumer's subscriptions (named by ARN or stream + name)."""
        for subscription in self.rules.current():
            arn = subscription.request.consumer_arn
            named = (call.get("StreamARN") and arn.startswith(f"{call['StreamARN']}/consumer/")
                     and arn.partition("/consumer/")[2].rpartition(":")[0]
                     == call.get("ConsumerName"))
            if arn == call.get("ConsumerARN") or named:
                with self._lock:
                    self._consumers_gone.add(arn)
                    self._active.pop(arn, None)
                subscription.end_with("ResourceNotFoundException", f"Consumer {arn} not found.")

    def _records_put(self, operation: str, call: dict[str, Any], answer: dict[str, Any]) -> None:
        """Log the records (wake_only) and wake the subscriptions of the shards they went to."""
        stream = call.get("StreamName") or str(call.get("StreamARN", "")).partition(":stream/")[2]
        if self.put_log is not None:
            self.put_log.add(stream, operation, call, answer)
        shards = {answer.get("ShardId")} | {r.get("ShardId") for r in answer.get("Records", ())}
        for subscription in self.rules.current():
            if (subscription.request.stream_name == stream
                    and subscription.request.shard_id in shards):
                subscription.wake()

    def _consumer_gone(self, consumer_arn: str, auth: dict[str, str]) -> bool:
        """Is the consumer deregistered? Asked of the emulator at most once a heartbeat."""
        now = time.monotonic()
        with self._lock:
            if consumer_arn in self._consumers_gone:
                return True
            if now - self._consumer_seen.get(consumer_arn, -1e9) < self.settings.heartbeat_s:
                return False
            self._consumer_seen[consumer_arn] = now
        try:
            self._describe_consumer(consumer_arn, auth)
        except Refused:
            with self._lock:
                self._consumers_gone.add(consumer_arn)
            return True
        except (UpstreamError, OSError):
            pass
        return False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a consumer of a wide stream subscribes to every shard at once

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-call is routine: a line in the log, not a traceback on stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug("fan-out front: client %s gone: %s", client_address, error)
        else:
            log.warning("fan-out front: call from %s failed", client_address, exc_info=True)


class _FrontHandler(BaseHTTPRequestHandler):
    owner: FanOutFront
    protocol_version = "HTTP/1.1"  # keep-alive and chunked bodies, as boto3 expects

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - no stderr lines
        pass

    def handle(self) -> None:
        """HTTP/1.1 here; an HTTP/2 connection (its preface) is relayed to the emulator."""
        try:
            first = self.connection.recv(len(HTTP2_PREFACE), socket.MSG_PEEK | socket.MSG_WAITALL)
        except OSError:
            return
        if first == HTTP2_PREFACE:
            tunnel(self.connection, self.owner.upstream.host, self.owner.upstream.port)
            return
        super().handle()

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        operation = self.headers.get("X-Amz-Target", "").removeprefix(TARGET_PREFIX)
        if operation == "SubscribeToShard":
            self.owner.subscribe(self, body)
        else:
            self.owner.forward(operation, self, body)

    do_POST = _handle
    do_GET = _handle

    def send_error_body(self, code: str, message: str, status: int = 400) -> None:
        """An error as Kinesis answers it: HTTP 400 (500 for its own failure), a ``__type``."""
        send_body(self, status, [("Content-Type", JSON_CONTENT_TYPE),
                                 ("x-amzn-RequestId", str(uuid.uuid4()))],
                  json.dumps({"__type": code, "message": message}).encode())

    def start_event_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", frames.EVENT_STREAM_CONTENT_TYPE)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        self.end_headers()
        self.wfile.flush()

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def end_event_stream(self, cut: bool) -> None:
        """The last chunk ends the body (a subscription's normal end); a cut closes the
        connection without it, as a network failure does."""
        if cut:
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        try:
            self.wfile.write(frames.chunk(b""))
            self.wfile.flush()
        except OSError:
            self.close_connection = True
