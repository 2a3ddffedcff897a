"""Where a file range store's root is (``kinesis.metadataPath``): parsed without any AWS
import, as the SQL options are parsed in every one of Spark's Python processes."""
from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigurationError

S3_SCHEMES = ("s3", "s3a")


@dataclass(frozen=True)
class Root:
    """Where the range store keeps its objects: ``scheme`` "file" or "s3", and the local
    directory, or the bucket and key prefix."""

    scheme: str
    path: str  # a local directory, or the key prefix ("" at a bucket's top)
    bucket: str = ""

    def __str__(self) -> str:
        return self.path if self.scheme == "file" else f"s3://{self.bucket}/{self.path}"


def root_of(location: str, option: str) -> Root:
    """The root a location names (a local path, ``file://``, ``s3://`` or ``s3a://``), or
    ``ConfigurationError`` naming ``option`` and the schemes we can create atomically on."""
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if scheme in ("", "file") and not (scheme == "file" and parts.netloc not in ("", "localhost")):
        path = parts.path if scheme == "file" else location
        if not path:
            raise ConfigurationError(f"{option}: an empty path")
        return Root("file", os.path.abspath(path))
    if scheme in S3_SCHEMES:
        if not parts.netloc:
            raise ConfigurationError(f"{option}: {location!r} names no bucket "
                                     "(s3://<bucket>/<prefix>)")
        return Root("s3", parts.path.strip("/"), parts.netloc)
    raise ConfigurationError(
        f"{option}: {location!r} is on a file system ({scheme}://) where the batch ranges "
        "cannot be written atomically; give a local path, file://, s3:// or s3a://")
