"""The KPL aggregate format's protobuf messages (aws-kinesis-agg's generated code), loaded once.

aws-kinesis-agg's deaggregator and aggregator modules import ``six`` (undeclared) and put the
package's own directory first on ``sys.path`` so that ``messages_pb2``'s plain
``import config_pb2`` resolves. Both the consumer (de-aggregation) and the producer need only
the generated messages: ``config_pb2`` is made importable under its plain name for the
length of that one import, and nothing else changes for the application.

Format (amazon-kinesis-producer aggregation-format.md): MAGIC (4 bytes) + protobuf
``AggregatedRecord`` + MD5 of the protobuf (16 bytes).
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

from aws_kinesis_agg import DIGEST_SIZE, MAGIC

__all__ = ["DIGEST_SIZE", "MAGIC", "messages_pb2"]


def _load_messages() -> ModuleType:
    loaded = sys.modules.get("aws_kinesis_agg.messages_pb2")
    if loaded is not None:
        return loaded
    if "config_pb2" in sys.modules:  # aws-kinesis-agg's own sys.path trick ran already
        return importlib.import_module("aws_kinesis_agg.messages_pb2")
    sys.modules["config_pb2"] = importlib.import_module("aws_kinesis_agg.config_pb2")
    try:
        return importlib.import_module("aws_kinesis_agg.messages_pb2")
    finally:
        sys.modules.pop("config_pb2", None)


messages_pb2 = _load_messages()
