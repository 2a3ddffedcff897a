"""What ``clients`` builds a boto3 client from: botocore's shared models, our GetRecords
parser and the provider of an assumed role's credentials.

Apart from ``clients`` so that it is imported with the first client made, not with the
package: these subclass botocore's parsers and credential providers, whose modules cost a
tenth of a second and more to import, and each of Spark's Python processes for a SQL source
imports the package while most of them make no client.
"""
from __future__ import annotations

import binascii
import json
import threading
from typing import Any

import botocore.credentials
import botocore.loaders
import botocore.parsers

_models: botocore.loaders.Loader | None = None
_models_lock = threading.Lock()


def shared_models() -> botocore.loaders.Loader:
    """botocore's endpoint and service models, parsed once per process. A session's own
    loader would keep a copy per client, and again for every stream (configuration) an
    executor's Python worker reads; the models are large and read-only, so one copy serves
    them all."""
    global _models
    with _models_lock:
        if _models is None:
            _models = botocore.loaders.create_loader()
        return _models


class FixedProvider(botocore.credentials.CredentialProvider):
    """Hands botocore's resolver credentials built in ``clients``, ahead of its own chain."""

    METHOD = "assume-role"

    def __init__(self, credentials: botocore.credentials.Credentials):
        super().__init__()
        self._credentials = credentials

    def load(self) -> botocore.credentials.Credentials:
        return self._credentials


class KinesisParserFactory(botocore.parsers.ResponseParserFactory):
    """botocore's parsers, with a direct path for successful GetRecords answers.

    botocore walks the output shape field by field for every record, which costs a reader
    more CPU than anything else it does. A GetRecords answer is flat JSON whose only
    non-JSON field is the base64 ``Data``, so ``json.loads`` plus one decode per record gives
    the same dictionary. Errors and every other operation take botocore's own path.
    """

    def create_parser(self, protocol_name: str) -> Any:
        parser = super().create_parser(protocol_name)
        return _GetRecordsParser(parser) if protocol_name == "json" else parser


class _GetRecordsParser:
    def __init__(self, parser: Any) -> None:
        self._parser = parser

    def parse(self, response: dict, shape: Any) -> dict:
        if response.get("status_code") != 200 or getattr(shape, "name", None) != "GetRecordsOutput":
            return self._parser.parse(response, shape)
        # botocore leaves out members sent as null (kinesis-local sends "ChildShards": null).
        answer = {k: v for k, v in json.loads(response["body"]).items() if v is not None}
        decode = binascii.a2b_base64
        for record in answer.get("Records", ()):
            record["Data"] = decode(record["Data"])
        headers = {k.lower(): v for k, v in response.get("headers", {}).items()}
        answer["ResponseMetadata"] = {"RequestId": headers.get("x-amzn-requestid", ""),
                                      "HTTPStatusCode": 200, "HTTPHeaders": headers}
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)
