"""Small objects under one root, created once and never overwritten: what the file range
store (``range_files``) needs of a file system, on a local path and on S3.

Four operations: ``create`` (only if absent, atomically: of two writers racing on one key,
exactly one succeeds), ``read``, ``list_names`` (the names under a prefix, in order) and
``delete``. Neither pyarrow's file systems nor fsspec's offer a create-if-absent (pyarrow's
``open_output_stream`` overwrites, fsspec's ``mode="xb"`` is a check-then-write on S3), so
each supported root has its own atomic primitive:

- a local path (or ``file://``): the object is written to a temporary file in the same
  directory, then hard-linked to its name; ``os.link`` fails if the name exists (POSIX),
  and readers never see a half-written object. A shared POSIX file system (NFS, a mounted
  HDFS) that honours ``link`` works the same way.
- ``s3://`` / ``s3a://`` (the bucket and key prefix; ``s3a`` is Hadoop's name for the same):
  boto3's ``put_object`` with ``IfNoneMatch="*"``, S3's conditional write (Aug. 2024): S3
  answers 412 PreconditionFailed when the key exists, 409 ConditionalRequestConflict to the
  loser of a race still in flight (retried: the winner's object then exists). boto3 is
  already our client for every AWS call (retry policy, credentials, endpoints).

Any other scheme (``hdfs://``, ``gs://``, ``abfs://``) is refused when the options are
parsed (``range_location.root_of``), naming the option: we know no atomic create-if-absent there.
Listings are bounded (``MAX_LIST_PAGES`` pages of 1,000 keys).
"""
from __future__ import annotations

import logging
import os
import re
import time
import uuid
from typing import Any, Iterable, Protocol

import botocore.exceptions

from ..config import ConsumerConfig
from ..errors import KinesisDStreamError
from ..retry import RetryPolicy
from .clients import call, error_code, make_client
from .range_location import root_of

log = logging.getLogger(__name__)

# A shard holds only the batches since its last commit: a listing longer than this many
# pages (of 1,000) means clean-up stopped long ago, and is refused rather than walked.
MAX_LIST_PAGES = 100
# S3's DeleteObjects takes at most this many keys a call.
S3_DELETE_BATCH = 1000


class RangeStoreError(KinesisDStreamError):
    """An object of the range store cannot be used (unreadable, not what we wrote); the
    message names it. Permanent: waiting does not mend it."""


class Blobs(Protocol):
    """Objects under one root, by ``/``-separated relative name."""

    location: str

    def create(self, name: str, body: bytes) -> bool:
        """Store ``body`` under ``name`` unless an object is there: True if this call did."""

    def read(self, name: str) -> bytes | None:
        """The object's bytes, None if there is none."""

    def list_names(self, prefix: str, start_after: str = "") -> list[str]:
        """The names under ``prefix`` (a directory, ending in ``/``), sorted, those after
        ``start_after`` (a full name) only."""

    def delete(self, names: Iterable[str]) -> None:
        """Delete these objects; one already gone is no error."""


def open_blobs(config: ConsumerConfig, location: str) -> Blobs:
    root = root_of(location, "range path")
    if root.scheme == "file":
        return LocalBlobs(root.path)
    return S3Blobs(config, root.bucket, root.path)


_TEMPORARY = re.compile(r"^\..*\.tmp$")


class LocalBlobs:
    """A local (or POSIX-mounted) directory; atomic creation by ``os.link``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.location = directory

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, *name.split("/"))

    def create(self, name: str, body: bytes) -> bool:
        target = self._path(name)
        folder = os.path.dirname(target)
        os.makedirs(folder, exist_ok=True)
        temporary = os.path.join(folder, f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp")
        with open(temporary, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temporary, target)  # fails if target exists: the one atomic step
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(temporary)

    def read(self, name: str) -> bytes | None:
        try:
            with open(self._path(name), "rb") as source:
                return source.read()
        except FileNotFoundError:
            return None

    def list_names(self, prefix: str, start_after: str = "") -> list[str]:
        try:
            entries = os.listdir(self._path(prefix.rstrip("/")))
        except FileNotFoundError:
            return []
        names = sorted(prefix + e for e in entries if not _TEMPORARY.match(e))
        return [n for n in names if n > start_after]

    def delete(self, names: Iterable[str]) -> None:
        for name in names:
            try:
                os.unlink(self._path(name))
            except FileNotFoundError:
                pass


# S3's answers to a conditional write that lost: the key exists, or a concurrent one won.
_EXISTS = "PreconditionFailed"
_CONFLICT = "ConditionalRequestConflict"


class S3Blobs:
    """A bucket and key prefix; atomic creation by a conditional PUT (``IfNoneMatch``)."""

    def __init__(self, config: ConsumerConfig, bucket: str, prefix: str,
                 client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.location = f"s3://{bucket}/{self.prefix}"
        self.client = client if client is not None else make_client(config, "s3")
        self.retry = RetryPolicy.from_config(config)

    def _call(self, what: str, operation: str, expected: tuple[str, ...] = (),
              **kwargs: Any) -> Any:
        return call(self.retry, getattr(self.client, operation), f"{what} ({self.location})",
                    expected=expected, Bucket=self.bucket, **kwargs)

    def create(self, name: str, body: bytes) -> bool:
        for attempt in range(self.retry.max_attempts):
            if attempt:
                time.sleep(self.retry.jittered_backoff_ms(attempt) / 1000.0)
            try:
                self._call(f"writing {name}", "put_object", expected=(_EXISTS, _CONFLICT),
                           Key=self.prefix + name, Body=body, IfNoneMatch="*",
                           ContentType="application/json")
                return True
            except botocore.exceptions.ClientError as exc:
                if error_code(exc) == _EXISTS:
                    return False
                # a race in flight: ask again, the winner's object is there by then
        raise RangeStoreError(f"writing {self.location}{name}: S3 answered "
                              f"{_CONFLICT} {self.retry.max_attempts} times")

    def read(self, name: str) -> bytes | None:
        try:
            answer = self._call(f"reading {name}", "get_object", expected=("NoSuchKey",),
                                Key=self.prefix + name)
        except botocore.exceptions.ClientError:
            return None
        body: bytes = answer["Body"].read()
        return body

    def list_names(self, prefix: str, start_after: str = "") -> list[str]:
        kwargs: dict[str, Any] = {"Prefix": self.prefix + prefix}
        if start_after:
            kwargs["StartAfter"] = self.prefix + start_after
        names: list[str] = []
        for _ in range(MAX_LIST_PAGES):
            page = self._call(f"listing {prefix}", "list_objects_v2", **kwargs)
            names.extend(item["Key"][len(self.prefix):] for item in page.get("Contents", []))
            if not page.get("IsTruncated"):
                return names
            kwargs["ContinuationToken"] = page["NextContinuationToken"]
        raise RangeStoreError(f"listing {self.location}{prefix}: more than "
                              f"{MAX_LIST_PAGES * 1000} objects (are old ranges deleted?)")

    def delete(self, names: Iterable[str]) -> None:
        keys = [{"Key": self.prefix + name} for name in names]
        for i in range(0, len(keys), S3_DELETE_BATCH):
            answer = self._call("deleting old ranges", "delete_objects",
                                Delete={"Objects": keys[i:i + S3_DELETE_BATCH], "Quiet": True})
            errors = answer.get("Errors", [])
            if errors:
                raise RangeStoreError(f"deleting from {self.location}: {len(errors)} not "
                                      f"deleted, e.g. {errors[0].get('Key')}: "
                                      f"{errors[0].get('Code')}")
