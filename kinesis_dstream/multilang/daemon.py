"""``kinesis-dstream multilang --properties-file F``: a MultiLangDaemon without the JVM.

Reads the same KCL properties file as the Java daemon and runs ``executableName`` as one
child per shard lease on our engine. SIGTERM or SIGINT stops it gracefully: every child
gets ``shutdownRequested`` (and may checkpoint) within ``shutdownGraceMillis``, the
leases are released, and the process exits 0.
"""
from __future__ import annotations

import argparse
import logging
import sys

from ..errors import ConfigurationError
from ..worker.process import run_worker
from .processor import processor_factory
from .properties import load_properties

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kinesis-dstream multilang",
        description="Run a KCL MultiLangDaemon properties file on the kinesis-dstream engine.")
    parser.add_argument("properties", nargs="?", help="the properties file (as the Java daemon)")
    parser.add_argument("-p", "--properties-file", dest="properties_file",
                        help="the properties file; wins over the positional one")
    parser.add_argument("--log-level", default=None,
                        help="DEBUG, INFO, WARNING, ... (default INFO)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    path = args.properties_file or args.properties
    if not path:
        parser.error("a properties file is required: --properties-file F")
    if args.log_level:
        logging.getLogger().setLevel(args.log_level.upper())
    try:
        settings = load_properties(path)
    except ConfigurationError as exc:
        log.error("%s", exc)
        return 2
    log.info("running %s for stream %s, application %s, worker %s",
             " ".join(settings.command), settings.config.stream_name,
             settings.config.application_name, settings.config.worker_id)
    factory = processor_factory(settings.command, action_timeout_s=settings.action_timeout_s)
    return run_worker(settings.config, factory)
