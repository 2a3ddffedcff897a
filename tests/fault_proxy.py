"""A loopback HTTP proxy in front of a Kinesis emulator that throttles a share of GetRecords,
or (``dropping``) drops every connection unanswered, as an endpoint outage does.

With ``share=0`` it is a plain counting proxy: ``calls`` counts every forwarded call by
(operation, TableName) (an S3 REST call by its operation, ``s3_operation``), which the
benchmarks use to count DynamoDB writes, and ``signers``
by (operation, the access key id that signed it), ``session_tokens`` by (operation, the
X-Amz-Security-Token it carried), and ``by_arn`` the calls naming the stream by StreamARN.
Query-protocol calls (STS: a form body ``Action=AssumeRole&...``) count under their Action, so
a proxy in front of moto's STS counts AssumeRole. With ``track_callers`` it also counts
``callers`` by (operation, pid of the local process that sent the call), found from the
connection's port in /proc (Linux): Spark's Python workers are told apart that way.

With ``put_failure_share`` it also fails a share of PutRecords *entries* the way Kinesis
does: those entries are taken out of the request before it is forwarded (so they are not
written) and come back in the answer, at their place, with ErrorCode ``put_failure_code``
(ProvisionedThroughputExceededException unless told); ``put_entries_failed`` counts them.

With ``limits`` (a ``ShardLimits``) it enforces Kinesis' per-shard read limits instead:
GetRecords at 5 calls/s and 2 MiB/s per shard, GetShardIterator at 5 calls/s per shard for
every client of the proxy together (the limit is per account); ``ShardLimits.refused`` counts
the refusals by (operation, shard).

Two modes stand in for what no emulator does with time:
- ``iterator_ttl_s`` / ``expire_next``: a GetRecords whose iterator was handed out (by
  GetShardIterator or as a NextShardIterator) longer ago than ``iterator_ttl_s``, or the next
  ``expire_next`` GetRecords, are answered ``ExpiredIteratorException`` (``expired`` counts them).
  Iterator ages are read on the proxy's own clock, which ``advance_clock`` moves forward: a
  test ages every iterator handed out so far at a moment it chooses, without sleeping.
- ``trim_horizon`` {shard id: sequence number}: records before it are gone, as after the
  stream's retention. TRIM_HORIZON starts there; AT/AFTER_SEQUENCE_NUMBER before it start there
  too (``trim_shape`` "silent") or are refused with InvalidArgumentException ("refuse");
  GetRecords never returns a record before it. ``refused`` counts the refusals.

Two modes answer for DynamoDB and for one shard what AWS answers and no emulator does:
- ``unprocessed_writes``: the next N BatchWriteItem calls forward only the first
  ``processed_per_write`` requests (per table) and give the rest back as ``UnprocessedItems``,
  as DynamoDB does when it throttles a batch; ``write_times`` notes when each BatchWriteItem
  came, so a test reads the spacing of the retries.
- ``answer_error`` {(operation, shard id): error code}: those calls are answered HTTP 400 with
  that code (``AccessDeniedException`` to GetRecords on one shard, say); ``errors_answered``
  notes when each was.

No emulator throttles (emulators.md), so throttling tests put this between the consumer and
kinesis-local. Injected answers are what Kinesis sends: HTTP 400 with
``{"__type": "ProvisionedThroughputExceededException", ...}``. Speaks HTTP/1.1 JSON (boto3),
not the HTTP/2 the Java KCL uses.
"""
from __future__ import annotations

import http.client
import json
import os
import random
import re
import threading
import time
import urllib.parse
from collections import Counter, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from kinesis_dstream.fanout_front.upstream import end_to_end, send_body

GET_RECORDS_TARGET = "Kinesis_20131202.GetRecords"
GET_SHARD_ITERATOR_TARGET = "Kinesis_20131202.GetShardIterator"
PUT_RECORDS_TARGET = "Kinesis_20131202.PutRecords"
THROTTLE_BODY = json.dumps({
    "__type": "ProvisionedThroughputExceededException",
    "message": "Rate exceeded for shard in account 000000000000.",
}).encode()

MiB = 1024 * 1024


class ShardLimits:
    """Kinesis' per-shard read limits, as a token bucket per shard (the proxy's limits mode).

    GetRecords: at most ``calls_per_s`` served calls in any second per shard, and a byte
    budget that refills at ``bytes_per_s`` up to ``burst_bytes``: a call is served while the
    shard's budget is positive and is then charged the data it returned, so a 10 MiB page
    puts the shard about 4 s into debt, and the calls of those seconds are refused, as
    Kinesis refuses them. GetShardIterator: ``calls_per_s`` per shard. Refused calls cost
    nothing. The 10,000 records / 10 MiB per call are the emulator's business.

    GetRecords names no shard: the proxy knows its iterator's shard from the answer that
    handed the iterator out (``FaultProxy.shard_read``). A call the proxy cannot attribute
    is served unlimited (``unattributed``). ``clock`` is injectable so the limiter is tested
    without waiting.
    """

    def __init__(self, *, calls_per_s: int = 5, bytes_per_s: float = 2 * MiB,
                 burst_bytes: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.calls_per_s = calls_per_s
        self.bytes_per_s = bytes_per_s
        self.burst_bytes = bytes_per_s if burst_bytes is None else burst_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._budget: dict[str, tuple[float, float]] = {}  # shard -> (bytes, as of when)
        self._calls: dict[tuple[str, str], deque[float]] = {}  # (operation, shard) -> served at
        self.refused: Counter[tuple[str, str]] = Counter()  # (operation, shard)
        self.served_bytes: Counter[str] = Counter()  # data bytes GetRecords returned, by shard
        # Seconds a shard's budget stood full, refilling for nobody: what its readers left
        # unread (a reader at the limit leaves none), by shard; ``idle_until_now`` adds the
        # time since each shard's last call.
        self.idle_s: Counter[str] = Counter()
        self.unattributed = 0

    def _refill(self, shard: str, now: float) -> float:
        budget, when = self._budget.get(shard, (self.burst_bytes, now))
        refilled = budget + (now - when) * self.bytes_per_s
        if refilled > self.burst_bytes:
            self.idle_s[shard] += (refilled - max(budget, self.burst_bytes)) / self.bytes_per_s
        budget = min(self.burst_bytes, refilled)
        self._budget[shard] = (budget, now)
        return budget

    def idle_until_now(self) -> dict[str, float]:
        """``idle_s`` of every shard seen, counted up to now."""
        with self._lock:
            now = self._clock()
            for shard in list(self._budget):
                self._refill(shard, now)
            return dict(self.idle_s)

    def admit(self, operation: str, shard: str) -> bool:
        """May this call be served now? A refusal is counted; a served call uses a call slot."""
        if operation not in ("GetRecords", "GetShardIterator"):
            return True
        if not shard:
            with self._lock:
                self.unattributed += 1
            return True
        with self._lock:
            now = self._clock()
            served = self._calls.setdefault((operation, shard), deque())
            while served and now - served[0] >= 1.0:
                served.popleft()
            ok = len(served) < self.calls_per_s
            if ok and operation == "GetRecords":
                ok = self._refill(shard, now) > 0
            if ok:
                served.append(now)
            else:
                self.refused[(operation, shard)] += 1
            return ok

    def charge(self, shard: str, data_bytes: int) -> None:
        """A served GetRecords returned ``data_bytes`` of record data."""
        if not shard:
            return
        with self._lock:
            budget = self._refill(shard, self._clock())
            self._budget[shard] = (budget - data_bytes, self._budget[shard][1])
            self.served_bytes[shard] += data_bytes


_ITERATOR_IN = re.compile(rb'"ShardIterator"\s*:\s*"([^"]+)"')
_DATA = re.compile(rb'"Data"\s*:\s*"([^"]*)"')


def _data_bytes(answer: bytes) -> int:
    """Record data in a GetRecords answer (base64 in the JSON), without parsing it all."""
    total = 0
    for match in _DATA.finditer(answer):
        encoded = match.group(1)
        total += len(encoded) * 3 // 4 - encoded[-2:].count(b"=")
    return total


class FaultProxy:
    """Forwards everything to ``upstream`` except ``share`` (0..1) of GetRecords calls.

    Counters: ``injected`` (throttled GetRecords), ``get_records_forwarded``, ``forwarded``
    (all calls); in limits mode, ``limits.refused`` and ``limits.served_bytes``.
    ``max_injections`` caps the throttles; ``max_lifetime_s`` stops the proxy by itself so a
    forgotten one cannot outlive its test run by long.
    """

    def __init__(self, upstream: str, *, share: float = 0.5, seed: int | None = None,
                 max_injections: int | None = None, max_lifetime_s: float = 900.0,
                 put_failure_share: float = 0.0, max_put_failures: int | None = None,
                 put_failure_code: str = "ProvisionedThroughputExceededException",
                 limits: ShardLimits | None = None) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.share = share
        self.max_injections = max_injections
        self.max_lifetime_s = max_lifetime_s
        self.injected = 0
        self.dropping = False  # drop every connection unanswered: an endpoint outage
        self.dropped = 0
        self.put_failure_share = put_failure_share
        self.max_put_failures = max_put_failures
        self.put_failure_code = put_failure_code
        self.put_entries_failed = 0
        self.limits = limits
        self.get_records_forwarded = 0
        self.forwarded = 0
        self.calls: Counter[tuple[str, str]] = Counter()  # (operation, TableName or "")
        # (operation, TableName or "", shard id) for calls that name one shard
        self.shard_calls: Counter[tuple[str, str, str]] = Counter()
        # (operation, access key id of the request's SigV4 signature) for every forwarded call
        self.signers: Counter[tuple[str, str]] = Counter()
        # (operation, X-Amz-Security-Token or "") for every forwarded call
        self.session_tokens: Counter[tuple[str, str]] = Counter()
        # operation -> forwarded calls that named the stream by StreamARN
        self.by_arn: Counter[str] = Counter()
        # (operation, pid of the sending process, 0 if not found), when track_callers is set
        self.track_callers = False
        self.callers: Counter[tuple[str, int]] = Counter()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self.iterator_ttl_s: float | None = None
        self.expire_next = 0
        self.expired = 0
        self.trim_horizon: dict[str, str] = {}
        self.trim_shape = "silent"
        self.refused = 0
        self._iterators: dict[str, tuple[float, str]] = {}  # iterator -> (handed out, shard)
        self._clock_offset = 0.0  # what advance_clock added to time.monotonic()
        self.unprocessed_writes = 0
        self.processed_per_write = 1
        self.write_times: list[float] = []  # monotonic time of each BatchWriteItem
        self.answer_error: dict[tuple[str, str], str] = {}
        self.errors_answered: list[float] = []  # monotonic time of each answer_error answer

    @property
    def share(self) -> float:
        return self._share

    @share.setter
    def share(self, value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"share must be within 0..1, got {value}")
        self._share = value

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("proxy not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def now(self) -> float:
        """The proxy's clock, by which iterators age: monotonic time plus every advance."""
        return time.monotonic() + self._clock_offset

    def advance_clock(self, seconds: float) -> None:
        """Move the proxy's clock ``seconds`` forward: every iterator handed out before is
        that much older, the ones handed out later are not."""
        with self._lock:
            self._clock_offset += seconds

    def should_throttle(self, target: str) -> bool:
        if target != GET_RECORDS_TARGET:
            return False
        with self._lock:
            if self.max_injections is not None and self.injected >= self.max_injections:
                inject = False
            else:
                inject = self._random.random() < self._share
            if inject:
                self.injected += 1
            else:
                self.get_records_forwarded += 1
            return inject

    # -- expired iterators and trimmed records ----------------------------------------------
    def refuse_or_rewrite(self, target: str, body: bytes) -> tuple[bytes, bytes | None]:
        """The body to forward, or the error answer (HTTP 400) to give instead."""
        if target == GET_RECORDS_TARGET and (self.iterator_ttl_s is not None or self.expire_next):
            iterator = json.loads(body).get("ShardIterator", "")
            with self._lock:
                now = self.now()
                born = self._iterators.get(iterator, (now, ""))[0]
                old = self.iterator_ttl_s is not None and now - born > self.iterator_ttl_s
                if not old and self.expire_next > 0:
                    self.expire_next -= 1
                    old = True
                if old:
                    self.expired += 1
                    return body, _error("ExpiredIteratorException",
                                        "Iterator expired. The iterator was created at time "
                                        f"{time.time() - 300:.0f} while right now it is "
                                        f"{time.time():.0f} which is further in the future than "
                                        "the tolerated delay of 300000 milliseconds.")
        if target != GET_SHARD_ITERATOR_TARGET or not self.trim_horizon:
            return body, None
        request = json.loads(body)
        horizon = self.trim_horizon.get(request.get("ShardId", ""))
        kind = request.get("ShardIteratorType")
        if horizon is None or kind in ("LATEST", "AT_TIMESTAMP"):
            return body, None
        if kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
            if int(request["StartingSequenceNumber"]) >= int(horizon):
                return body, None
            if self.trim_shape == "refuse":
                with self._lock:
                    self.refused += 1
                return body, _error(
                    "InvalidArgumentException",
                    f"StartingSequenceNumber {request['StartingSequenceNumber']} used in "
                    f"GetShardIterator on shard {request['ShardId']} in stream "
                    f"{request.get('StreamName')} under account 000000000000 is invalid "
                    "because it is no longer available (trimmed by the retention period).")
        request.update(ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=horizon)
        return json.dumps(request).encode(), None

    # -- DynamoDB's unprocessed items and errors for one shard ---------------------------------
    def hold_back_writes(self, target: str, body: bytes) -> tuple[bytes, dict[str, list]]:
        """The BatchWriteItem body to forward and the requests to give back unprocessed."""
        if not target.endswith(".BatchWriteItem"):
            return body, {}
        with self._lock:
            self.write_times.append(time.monotonic())
            if self.unprocessed_writes <= 0:
                return body, {}
            self.unprocessed_writes -= 1
        request = json.loads(body)
        kept = self.processed_per_write
        held = {table: items[kept:] for table, items in request["RequestItems"].items()
                if items[kept:]}
        request["RequestItems"] = {table: items[:kept]
                                   for table, items in request["RequestItems"].items()
                                   if items[:kept]}
        return json.dumps(request).encode(), held

    def error_to_answer(self, operation: str, shard: str) -> bytes | None:
        code = self.answer_error.get((operation, shard))
        if code is None:
            return None
        with self._lock:
            self.errors_answered.append(time.monotonic())
        return _error(code, f"User: arn:aws:iam::000000000000:user/test is not authorized to "
                            f"perform: kinesis:{operation} on shard {shard} (fault proxy)")

    def shard_read(self, operation: str, body: bytes) -> str:
        """The shard a read names: GetShardIterator's ShardId, or the shard of a GetRecords
        iterator (``note_answer`` remembers which shard each iterator handed out reads)."""
        if operation == "GetShardIterator":
            return _shard_named(body)
        if operation == "GetRecords":
            found = _ITERATOR_IN.search(body)
            if found:
                with self._lock:
                    return self._iterators.get(found.group(1).decode(), (0.0, ""))[1]
        return ""

    def note_answer(self, target: str, request: bytes, data: bytes) -> bytes:
        """Remember when and for which shard iterators were handed out; drop trimmed records."""
        if target not in (GET_RECORDS_TARGET, GET_SHARD_ITERATOR_TARGET):
            return data
        answer = json.loads(data)
        asked = json.loads(request)
        with self._lock:
            if target == GET_SHARD_ITERATOR_TARGET:
                shard = asked.get("ShardId", "")
                handed = answer.get("ShardIterator")
            else:
                shard = self._iterators.get(asked.get("ShardIterator", ""), (0.0, ""))[1]
                handed = answer.get("NextShardIterator")
            if handed:
                if len(self._iterators) > 100_000:  # a long benchmark: forget the oldest half
                    for old in list(self._iterators)[:50_000]:
                        del self._iterators[old]
                self._iterators[handed] = (self.now(), shard)
        horizon = self.trim_horizon.get(shard)
        if target == GET_RECORDS_TARGET and horizon is not None and answer.get("Records"):
            kept = [r for r in answer["Records"] if int(r["SequenceNumber"]) >= int(horizon)]
            if len(kept) != len(answer["Records"]):
                answer["Records"] = kept
                return json.dumps(answer).encode()
        return data

    def fail_put_entries(self, target: str, body: bytes) -> tuple[bytes, list[int]]:
        """The PutRecords body to forward and the indexes of the entries failed instead."""
        if target != PUT_RECORDS_TARGET or self.put_failure_share <= 0:
            return body, []
        request = json.loads(body)
        records = request["Records"]
        failed: list[int] = []
        with self._lock:
            for index in range(len(records)):
                if (self.max_put_failures is not None
                        and self.put_entries_failed >= self.max_put_failures):
                    break
                if self._random.random() < self.put_failure_share:
                    failed.append(index)
                    self.put_entries_failed += 1
        if not failed:
            return body, []
        gone = set(failed)
        request["Records"] = [r for i, r in enumerate(records) if i not in gone]
        return json.dumps(request).encode(), failed

    def start(self) -> "FaultProxy":
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name="fault-proxy", daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.max_lifetime_s, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.cancel()
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class _ProxyHandler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, as boto3 expects
    _upstream = threading.local()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr
        pass

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._upstream, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.owner.upstream_host, self.owner.upstream_port,
                                              timeout=60)
            self._upstream.conn = conn
        return conn

    def _caller(self) -> int:
        """The pid that sent this connection's calls, looked up once a connection."""
        pid = getattr(self, "_caller_pid", None)
        if pid is None:
            pid = self._caller_pid = peer_pid(self.client_address[1],
                                              self.server.server_address[1])
        return pid

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.owner.dropping:
            with self.owner._lock:
                self.owner.dropped += 1
            self.close_connection = True
            self.connection.shutdown(2)  # no answer at all, as from a dead endpoint
            return
        target = self.headers.get("X-Amz-Target", "")
        limits, limited = self.owner.limits, ""
        if limits is not None:
            operation = target.rpartition(".")[2]
            limited = self.owner.shard_read(operation, body)
            if not limits.admit(operation, limited):
                send_body(self, 400, [("Content-Type", "application/x-amz-json-1.1"),
                                      ("x-amzn-RequestId", f"fault-proxy-{time.monotonic_ns()}")],
                          _limit_body(operation, limited))
                return
        if self.owner.answer_error:
            operation = target.rpartition(".")[2]
            answer = self.owner.error_to_answer(operation, self.owner.shard_read(operation, body))
            if answer is not None:
                send_body(self, 400, [("Content-Type", "application/x-amz-json-1.1")], answer)
                return
        body, held = self.owner.hold_back_writes(target, body)
        if held and not json.loads(body)["RequestItems"]:  # DynamoDB refuses an empty batch
            send_body(self, 200, [("Content-Type", "application/x-amz-json-1.0")],
                      json.dumps({"UnprocessedItems": held}).encode())
            return
        if self.owner.should_throttle(target):
            send_body(self, 400, [("Content-Type", "application/x-amz-json-1.1"),
                                  ("x-amzn-RequestId", f"fault-proxy-{time.monotonic_ns()}")],
                      THROTTLE_BODY)
            return
        body, refusal = self.owner.refuse_or_rewrite(self.headers.get("X-Amz-Target", ""), body)
        if refusal is not None:
            send_body(self, 400, [("Content-Type", "application/x-amz-json-1.1")], refusal)
            return
        body, failed = self.owner.fail_put_entries(self.headers.get("X-Amz-Target", ""), body)
        if failed and not json.loads(body)["Records"]:  # all failed: Kinesis refuses an empty call
            send_body(self, 200, [("Content-Type", "application/x-amz-json-1.1")],
                      _merge_put_answer(b'{"Records": []}', failed, len(failed),
                                        self.owner.put_failure_code))
            return
        caller = self._caller() if self.owner.track_callers else 0
        # the body follows at once (this handler answered any Expect: 100-continue)
        headers = {k: v for k, v in end_to_end(self.headers.items()).items()
                   if k.lower() != "expect"}
        for attempt in (1, 2):  # a kept-alive upstream connection may have been closed
            conn = self._connection()
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._upstream.conn = None
                if attempt == 2:
                    send_body(self, 502, [("Content-Type", "text/plain")], b"upstream unreachable")
                    return
        with self.owner._lock:
            self.owner.forwarded += 1
            operation = (_operation(target, body) if target or body.startswith(b"Action=")
                         else (s3_operation(self.command, self.path), ""))
            self.owner.calls[operation] += 1
            signer = re.search(r"Credential=([^/,\s]+)/", self.headers.get("Authorization", ""))
            self.owner.signers[(operation[0], signer.group(1) if signer else "")] += 1
            self.owner.session_tokens[(operation[0],
                                       self.headers.get("X-Amz-Security-Token", ""))] += 1
            if b'"StreamARN"' in body:
                self.owner.by_arn[operation[0]] += 1
            if self.owner.track_callers:
                self.owner.callers[(operation[0], caller)] += 1
            shard = _shard_named(body) or limited
            if shard:
                self.owner.shard_calls[(*operation, shard)] += 1
        if reply.status == 200:
            data = self.owner.note_answer(self.headers.get("X-Amz-Target", ""), body, data)
            if limited and target == GET_RECORDS_TARGET:
                limits.charge(limited, _data_bytes(data))
        if held and reply.status == 200:
            answer = json.loads(data)
            answer.setdefault("UnprocessedItems", {}).update(held)
            data = json.dumps(answer).encode()
        if failed and reply.status == 200:
            data = _merge_put_answer(data, failed, len(json.loads(body)["Records"]) + len(failed),
                                     self.owner.put_failure_code)
        headers_back = reply.getheaders()
        if held:  # the body changed: botocore would check DynamoDB's CRC32 of the old one
            headers_back = [h for h in headers_back if h[0].lower() != "x-amz-crc32"]
        send_body(self, reply.status, headers_back, data)

    do_POST = _handle
    do_GET = _handle
    do_PUT = _handle  # S3's REST calls (s3_operation)
    do_DELETE = _handle


def s3_operation(method: str, path: str) -> str:
    """The S3 operation of a path-style REST call (``PUT /bucket/key`` -> PutObject), for
    the counts of the file range store's calls."""
    where, _, query = path.partition("?")
    parts = where.strip("/").split("/", 1)
    on_object = len(parts) == 2 and bool(parts[1])
    queried = set(urllib.parse.parse_qs(query, keep_blank_values=True))
    if method == "GET":
        return "GetObject" if on_object else (
            "ListObjectsV2" if "list-type" in queried else "ListObjects")
    if method == "POST" and "delete" in queried:
        return "DeleteObjects"
    if method == "PUT":
        return "PutObject" if on_object else "CreateBucket"
    if method == "DELETE":
        return "DeleteObject" if on_object else "DeleteBucket"
    return f"{method} {where}"


def _operation(target: str, body: bytes) -> tuple[str, str]:
    """(operation, table) of a JSON-protocol call: ("PutItem", "app"), ("GetRecords", ""); of
    a query-protocol one (STS), its Action: ("AssumeRole", "")."""
    if not target and body.startswith(b"Action="):
        action = urllib.parse.parse_qs(body.decode(errors="replace")).get("Action", [""])[0]
        return action, ""
    table = ""
    if b'"TableName"' in body or b'"RequestItems"' in body:
        try:
            request = json.loads(body)
        except ValueError:
            request = {}
        table = request.get("TableName") or next(iter(request.get("RequestItems") or {}), "")
    return target.rpartition(".")[2], table


def peer_pid(peer_port: int, local_port: int) -> int:
    """The pid of the local process whose TCP connection from ``peer_port`` reaches
    ``local_port`` on this machine (from /proc/net/tcp and the processes' open sockets);
    0 when none is found. Asked while the connection is open, so the process holds it."""
    wanted = f":{peer_port:04X}", f":{local_port:04X}"
    inode = ""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                for line in lines:
                    fields = line.split()
                    if len(fields) > 9 and fields[1].endswith(wanted[0]) and \
                            fields[2].endswith(wanted[1]):
                        inode = fields[9]
                        break
        except OSError:
            continue
        if inode:
            break
    if not inode or inode == "0":
        return 0
    link = f"socket:[{inode}]"
    for pid in (name for name in os.listdir("/proc") if name.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == link:
                    return int(pid)
            except OSError:
                continue
    return 0


_SHARD_ID = re.compile(rb'(shardId-[0-9]{12})')


def _shard_named(body: bytes) -> str:
    """The one shard a call names (GetShardIterator's ShardId, a lease item's leaseKey, a
    batch range's rangeKey), or "" for none or several."""
    found = set(_SHARD_ID.findall(body))
    return found.pop().decode() if len(found) == 1 else ""


def _error(code: str, message: str) -> bytes:
    return json.dumps({"__type": code, "message": message}).encode()


def _limit_body(operation: str, shard: str) -> bytes:
    what = "read" if operation == "GetRecords" else "GetShardIterator"
    return _error("ProvisionedThroughputExceededException",
                  f"Rate exceeded for shard {shard} in stream (fault proxy) under account "
                  f"000000000000 ({what}).")


def _merge_put_answer(data: bytes, failed: list[int], total: int, code: str) -> bytes:
    """Put the failed entries back into a PutRecords answer at their places."""
    answer = json.loads(data)
    written = iter(answer["Records"])
    gone = set(failed)
    answer["Records"] = [
        {"ErrorCode": code,
         "ErrorMessage": f"{code} (fault proxy)."} if i in gone else next(written)
        for i in range(total)]
    answer["FailedRecordCount"] = answer.get("FailedRecordCount", 0) + len(failed)
    return json.dumps(answer).encode()
