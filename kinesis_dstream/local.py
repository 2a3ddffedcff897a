"""Local Kinesis and DynamoDB emulators on loopback ports, for development, tests and the demo.

Emulators run as child processes bound to 127.0.0.1 on free ports; ``start()`` returns only once
the emulator answers HTTP, so callers never race its start-up. The children exit on their own
when the Python process that started them dies (a ``kill -9`` of a test run leaves no stray
node process). docs/operations.md ("Local emulators") says how to use them.

``LocalStack(fanout=True)`` puts a ``FanOutFront`` before kinesis-local: its Kinesis
endpoint then serves SubscribeToShard to boto3 (``kinesis_dstream.fanout_front``).
``kinesis-dstream local`` is ``kinesis_dstream.local_command``.
"""
from __future__ import annotations

import http.client
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from .fanout_front import FanOutFront

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
KINESIS_KINDS = ("kinesis-local", "kinesalite")
DYNAMODB_KINDS = ("moto", "dynalite")
KINDS = KINESIS_KINDS + DYNAMODB_KINDS
NODE_MODULES_ENV = "KINESIS_DSTREAM_NODE_MODULES"
DUMMY_REGION = "us-east-1"
DUMMY_ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"  # AWS's documented example key, never valid
DUMMY_SECRET_ACCESS_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

# The npm emulators and the versions tested (package.json pins the same; a test compares).
NPM_EMULATORS = ("kinesis-local@0.6.2", "kinesalite@3.3.3", "dynalite@4.0.0")
_PRELOAD = Path(__file__).with_name("_loopback.js")
_NODE_ENTRY = {
    "kinesis-local": ("kinesis-local", "main.js"),
    "kinesalite": ("kinesalite", "cli.js"),
    "dynalite": ("dynalite", "cli.js"),
}
# kinesis-local: streams go ACTIVE in 100 ms rather than 500 ms (tests create many); quiet
# logs; nothing persisted or loaded from the working directory.
_KINESIS_LOCAL_ENV = {
    "CREATE_STREAM_DURATION": "100ms",
    "DELETE_STREAM_DURATION": "100ms",
    "SHARD_LIMIT": "200",
    "ON_DEMAND_STREAM_COUNT_LIMIT": "50",
    "LOG_LEVEL": "WARN",
    "ROOT_LOG_LEVEL": "ERROR",
    "SHOULD_PERSIST_DATA": "false",
    "LOAD_DATA_IF_EXISTS": "false",
}
# moto runs through this launcher so that it, too, exits when its parent dies, and so that
# its DynamoDB answers one request at a time. moto's server is threaded and its UpdateItem
# checks a ConditionExpression and then writes without a lock: two guarded writes to one
# lease could both win, as DynamoDB never lets them (a worker's checkpoint and another's
# take of that lease, seen as records delivered twice). Served one at a time, each request
# is atomic, as in DynamoDB.
_MOTO_LAUNCHER = (
    "import os, sys, threading, time\n"
    "parent = os.getppid()\n"
    "def watch():\n"
    "    while os.getppid() == parent:\n"
    "        time.sleep(0.5)\n"
    "    os._exit(0)\n"
    "threading.Thread(target=watch, daemon=True).start()\n"
    "from moto.dynamodb.responses import DynamoHandler\n"
    "one_at_a_time = threading.Lock()\n"
    "call_action = DynamoHandler.call_action\n"
    "def atomic_call_action(self):\n"
    "    with one_at_a_time:\n"
    "        return call_action(self)\n"
    "DynamoHandler.call_action = atomic_call_action\n"
    "from moto.server import main\n"
    "main(sys.argv[1:])\n"
)
# Seconds between SIGTERM and SIGKILL. kinesis-local may take 30 s to honour SIGTERM and keeps
# nothing worth a clean exit (no persistence), so it gets little time.
_KILL_AFTER_S = {"kinesis-local": 0.3}
_DEFAULT_KILL_AFTER_S = 2.0


class EmulatorError(RuntimeError):
    """An emulator could not be found, started or reached."""


def free_port(host: str = LOOPBACK) -> int:
    """A port free right now; the emulator start retries if another process takes it first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def find_node_modules(start: Path | None = None) -> Path:
    """The node_modules holding the npm emulators: env var, then up from cwd and this package."""
    configured = os.environ.get(NODE_MODULES_ENV)
    if configured:
        path = Path(configured)
        if path.is_dir():
            return path
        raise EmulatorError(f"{NODE_MODULES_ENV}={configured} is not a directory")
    roots = [start] if start else []
    roots += [Path.cwd(), Path(__file__).resolve().parent]
    for root in roots:
        for directory in (root, *root.parents):
            candidate = directory / "node_modules"
            if (candidate / "kinesis-local").is_dir():
                return candidate
    raise EmulatorError(
        "npm emulators not found (no node_modules/kinesis-local above the working directory or "
        f"the package): run `npm install {' '.join(NPM_EMULATORS)}` here (a clone: `make "
        f"setup`), or set {NODE_MODULES_ENV} to their node_modules"
    )


def _answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Any HTTP response counts: the emulators answer GET / with 200, 400 or 404."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class Emulator:
    """One emulator process on a free loopback port.

    ``kind`` is one of ``kinesis-local``, ``kinesalite`` (Kinesis), ``moto``, ``dynalite``
    (DynamoDB; moto's server also serves Kinesis, but not faithfully enough for consumers).
    """

    def __init__(self, kind: str, *, port: int | None = None, node_modules: Path | None = None,
                 extra_env: dict[str, str] | None = None, log_dir: Path | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown emulator {kind!r}; one of {', '.join(KINDS)}")
        self.kind = kind
        self.host = LOOPBACK
        self.port = port
        self._fixed_port = port is not None
        self._node_modules = node_modules
        self._extra_env = dict(extra_env or {})
        self._log_dir = log_dir
        self._log_file: IO[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise EmulatorError(f"{self.kind} is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _command(self, port: int) -> tuple[list[str], dict[str, str], str | None]:
        env = dict(os.environ)
        env.update({"KINESIS_DSTREAM_LISTEN_HOST": self.host,
                    "KINESIS_DSTREAM_EXIT_WITH_PARENT": "1"})
        if self.kind == "moto":
            if importlib.util.find_spec("moto") is None:
                raise EmulatorError("moto is not installed (DynamoDB and CloudWatch): "
                                    "pip install 'kinesis-dstream[local]'")
            argv = [sys.executable, "-c", _MOTO_LAUNCHER, "-H", self.host, "-p", str(port)]
            env.update(self._extra_env)
            return argv, env, None
        modules = self._node_modules or find_node_modules()
        package, entry = _NODE_ENTRY[self.kind]
        script = modules / package / entry
        if not script.is_file():
            raise EmulatorError(f"{script} is missing; run `make setup` (or `npm install`)")
        argv = ["node", "--require", str(_PRELOAD), str(script)]
        cwd = None
        if self.kind == "kinesis-local":
            env.pop("INITIALIZE_STREAMS", None)  # empty is rejected; unset means none
            env.update(_KINESIS_LOCAL_ENV)
            env["KINESIS_MOCK_PLAIN_PORT"] = str(port)
            env["KINESIS_MOCK_TLS_PORT"] = str(free_port(self.host))
            env["KINESIS_MOCK_CERT_PATH"] = str(modules / "kinesis-local" / "server.json")
            cwd = tempfile.gettempdir()  # it may write a data/ directory into its cwd
        elif self.kind == "kinesalite":
            argv += ["--port", str(port), "--createStreamMs", "100", "--deleteStreamMs", "100",
                     "--updateStreamMs", "100", "--shardLimit", "200"]
        else:  # dynalite
            argv += ["--port", str(port), "--host", self.host, "--createTableMs", "0",
                     "--deleteTableMs", "0", "--updateTableMs", "0"]
        env.update(self._extra_env)
        return argv, env, cwd

    def start(self, timeout: float = 60.0) -> "Emulator":
        """Start and wait until it answers HTTP; raises EmulatorError with its log tail if not."""
        with self._lock:
            if self.process is not None:
                return self
            deadline = time.monotonic() + timeout
            attempts = 1 if self._fixed_port else 3
            for attempt in range(1, attempts + 1):
                port = self.port if self._fixed_port else free_port(self.host)
                assert port is not None
                self._spawn(port)
                try:
                    self._wait_until_answering(deadline)
                    log.info("%s answering at %s (pid %s)", self.kind, self.endpoint, self.pid)
                    return self
                except EmulatorError:
                    exited = self.process is not None and self.process.poll() is not None
                    tail = self.log_tail()
                    self._terminate()
                    port_taken = "EADDRINUSE" in tail or "in use" in tail.lower()
                    if exited and port_taken and attempt < attempts and time.monotonic() < deadline:
                        log.warning("%s exited at start on port %s; retrying on another port",
                                    self.kind, port)
                        continue
                    raise EmulatorError(
                        f"{self.kind} did not answer on {self.host}:{port} within {timeout:.0f} s"
                        f"{' (it exited)' if exited else ''}; its output:\n{tail}"
                    ) from None
            raise AssertionError("unreachable")

    def _spawn(self, port: int) -> None:
        argv, env, cwd = self._command(port)
        # The output goes to an unlinked temporary file: readable for error messages
        # (log_tail), gone with the last descriptor, so a killed run leaves no files.
        self._log_file = tempfile.TemporaryFile(prefix=f"kinesis-dstream-{self.kind}-",
                                                dir=self._log_dir)
        self.port = port
        try:
            self.process = subprocess.Popen(
                argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        except FileNotFoundError as exc:
            self._close_log()
            raise EmulatorError(f"cannot run {argv[0]!r} for {self.kind}: {exc}") from exc

    def _wait_until_answering(self, deadline: float) -> None:
        assert self.process is not None and self.port is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmulatorError(f"{self.kind} exited with {self.process.returncode}")
            # Checking the process again after an answer catches a foreign server that took
            # the port first (our emulator then exits at once with EADDRINUSE).
            if _answers(self.host, self.port) and self.process.poll() is None:
                return
            time.sleep(0.05)
        raise EmulatorError(f"{self.kind} start timed out")

    def log_tail(self, limit: int = 4000) -> str:
        """The last ``limit`` bytes the emulator wrote (stdout and stderr), for diagnostics."""
        if self._log_file is None:
            return "(no output)"
        fd = self._log_file.fileno()
        size = os.fstat(fd).st_size
        data = os.pread(fd, limit, max(size - limit, 0))
        return data.decode("utf-8", "replace") or "(no output)"

    def _terminate(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=_KILL_AFTER_S.get(self.kind, _DEFAULT_KILL_AFTER_S))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=10)
        elif process is not None:
            process.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after a grace period); safe to call twice."""
        with self._lock:
            if self.process is not None:
                log.info("stopping %s (pid %s)", self.kind, self.process.pid)
            self._terminate()

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Emulator({self.kind!r}, endpoint={self.port and self.endpoint!r}, pid={self.pid})"


class LocalStack:
    """A Kinesis emulator plus a DynamoDB emulator, started in parallel.

    moto's server also serves CloudWatch; with dynalite for DynamoDB a moto server is
    started for CloudWatch alone, so metrics always have somewhere local to go.
    ``fanout`` (kinesis-local only) serves Kinesis through a ``FanOutFront`` whose
    subscriptions last ``fanout_lifetime_s``: ``kinesis_endpoint`` is then the front's.
    """

    def __init__(self, kinesis: str = "kinesis-local", dynamodb: str = "moto", *,
                 fanout: bool = False, fanout_lifetime_s: float = 300.0) -> None:
        if kinesis not in KINESIS_KINDS:
            raise ValueError(f"unknown Kinesis emulator {kinesis!r}; one of {KINESIS_KINDS}")
        if dynamodb not in DYNAMODB_KINDS:
            raise ValueError(f"unknown DynamoDB emulator {dynamodb!r}; one of {DYNAMODB_KINDS}")
        if fanout and kinesis != "kinesis-local":
            raise ValueError("the fan-out endpoint needs kinesis-local (kinesalite has no "
                             "consumers)")
        self.kinesis = Emulator(kinesis)
        self.dynamodb = Emulator(dynamodb)
        self.cloudwatch = self.dynamodb if dynamodb == "moto" else Emulator("moto")
        self.fanout: FanOutFront | None = None
        self._fanout_lifetime_s = fanout_lifetime_s if fanout else None

    @property
    def kinesis_endpoint(self) -> str:
        """Where Kinesis clients go: the fan-out front if there is one, else the emulator."""
        return self.fanout.endpoint if self.fanout is not None else self.kinesis.endpoint

    @property
    def emulators(self) -> list[Emulator]:
        """Each emulator once (moto may serve DynamoDB and CloudWatch)."""
        unique: list[Emulator] = []
        for emulator in (self.kinesis, self.dynamodb, self.cloudwatch):
            if all(emulator is not seen for seen in unique):
                unique.append(emulator)
        return unique

    def start(self, timeout: float = 60.0) -> "LocalStack":
        errors: list[BaseException] = []

        def run(emulator: Emulator) -> None:
            try:
                emulator.start(timeout)
            except BaseException as exc:  # noqa: BLE001 - re-raised below in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(e,), daemon=True)
                   for e in self.emulators]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            self.stop()
            if len(errors) == 1:
                raise errors[0]
            # e.g. a pip install without npm emulators or moto: say everything that is missing
            raise EmulatorError("; ".join(dict.fromkeys(str(e) for e in errors))) from errors[0]
        if self._fanout_lifetime_s is not None:
            self.fanout = FanOutFront(self.kinesis.endpoint,
                                      lifetime_s=self._fanout_lifetime_s).start()
        return self

    def stop(self) -> None:
        fanout, self.fanout = self.fanout, None
        if fanout is not None:
            fanout.stop()
        for emulator in self.emulators:
            emulator.stop()

    def environment(self) -> dict[str, str]:
        """What boto3 (and the Java SDK) read to reach these emulators with dummy credentials."""
        return {
            "AWS_ENDPOINT_URL_KINESIS": self.kinesis_endpoint,
            "AWS_ENDPOINT_URL_DYNAMODB": self.dynamodb.endpoint,
            "AWS_ENDPOINT_URL_CLOUDWATCH": self.cloudwatch.endpoint,
            "AWS_DEFAULT_REGION": DUMMY_REGION,
            "AWS_REGION": DUMMY_REGION,
            "AWS_ACCESS_KEY_ID": DUMMY_ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET_ACCESS_KEY,
        }

    def __enter__(self) -> "LocalStack":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
