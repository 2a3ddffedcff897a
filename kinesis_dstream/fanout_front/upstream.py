"""Calls from the front to the emulator behind it: Kinesis JSON over loopback HTTP/1.1, and
what a relay passes on between a client and the emulator."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import Any, Iterable

TARGET_PREFIX = "Kinesis_20131202."
JSON_CONTENT_TYPE = "application/x-amz-json-1.1"
# Headers of one connection, not of the message, and the length, which a relay sets for the
# body it sends itself: never passed on.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                        "upgrade", "te", "trailer", "content-length"})


def end_to_end(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The headers of a request that a relay passes on."""
    return {name: value for name, value in headers if name.lower() not in HOP_BY_HOP}


def send_body(handler: BaseHTTPRequestHandler, status: int, headers: Iterable[tuple[str, str]],
              body: bytes) -> None:
    """Answer ``handler``'s request with ``body`` and the end-to-end ``headers`` (kept-alive
    HTTP/1.1: the length is always sent)."""
    handler.send_response(status)
    for name, value in headers:
        if name.lower() not in HOP_BY_HOP:
            handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class UpstreamError(Exception):
    """The emulator answered an error: ``code`` is its ``__type``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message


class Upstream:
    """One kept-alive connection per thread to ``endpoint`` (``http://host:port``)."""

    def __init__(self, endpoint: str) -> None:
        parsed = urllib.parse.urlsplit(endpoint)
        if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
            raise ValueError(f"upstream must be http://host:port, got {endpoint!r}")
        self.host, self.port = parsed.hostname, parsed.port
        self._local = threading.local()

    def request(self, method: str, path: str, body: bytes,
                headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send as is; one retry on a fresh connection if the kept-alive one was closed."""
        for attempt in (1, 2):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                self._local.conn = conn
            try:
                conn.request(method, path, body=body, headers=headers)
                reply = conn.getresponse()
                return reply.status, reply.getheaders(), reply.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def call(self, operation: str, payload: dict[str, Any],
             auth: dict[str, str]) -> dict[str, Any]:
        """A Kinesis call; ``auth`` is the Authorization and X-Amz-Date of the client's own
        request (the emulator wants them and checks no signature)."""
        headers = {"Content-Type": JSON_CONTENT_TYPE, "X-Amz-Target": TARGET_PREFIX + operation,
                   **auth}
        status, _, data = self.request("POST", "/", json.dumps(payload).encode(), headers)
        answer = json.loads(data) if data else {}
        if status != 200:
            code = str(answer.get("__type", "InternalFailure")).rpartition("#")[2]
            raise UpstreamError(status, code, str(answer.get("message", answer)))
        return dict(answer)


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def tunnel(client: socket.socket, host: str, port: int) -> None:
    """Relay a connection byte for byte to host:port until either side closes: an HTTP/2
    client (the Java SDK) reaches the emulator itself, which speaks HTTP/2."""
    with socket.create_connection((host, port), timeout=10) as upstream:
        upstream.settimeout(None)

        def pump(source: socket.socket, sink: socket.socket) -> None:
            try:
                while data := source.recv(65536):
                    sink.sendall(data)
            except OSError:
                pass
            finally:
                for side in (source, sink):
                    try:
                        side.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        back = threading.Thread(target=pump, args=(upstream, client), daemon=True,
                                name="fanout-front-h2")
        back.start()
        pump(client, upstream)
        back.join()
