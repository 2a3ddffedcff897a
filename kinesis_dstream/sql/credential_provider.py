"""``kinesis.credentialProviderClass`` / ``kinesis.credentialProviderParam``: the awslabs
connector's credential providers, as the credentials a ``ConsumerConfig`` holds.

The awslabs connector loads a JVM class implementing its ``ConnectorAwsCredentialsProvider``
and hands it the param string; Python loads no JVM class. The connector's own provider
classes, and the AWS SDK's default-chain and profile providers, mean credentials we have
(boto3's default chain, a profile, static keys with or without a session token, an STS role),
so those names are honoured: each class takes its constructor's fields, in order, as the
comma-separated param. Any other class (a job's own provider) is refused by name when the
options are read, listing the accepted ones, rather than replaced by the default chain, which
would sign as another identity.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import ConfigurationError

PROVIDER_CLASS = "kinesis.credentialProviderClass"
PROVIDER_PARAM = "kinesis.credentialProviderParam"

_AWSLABS = "org.apache.spark.sql.connector.kinesis."
_SDK = "software.amazon.awssdk.auth.credentials."


@dataclass(frozen=True)
class _Provider:
    """``fields``: the ``ConsumerConfig`` fields the param's comma-separated parts fill, in
    order; the first ``required`` of them must be given. ``form``: the param, as docs say."""

    fields: tuple[str, ...]
    required: int
    form: str
    means: str


_DEFAULT_CHAIN = _Provider((), 0, "no param", "boto3's default credential chain")
PROVIDERS: Mapping[str, _Provider] = {
    f"{_AWSLABS}ConnectorDefaultCredentialsProvider": _DEFAULT_CHAIN,
    f"{_SDK}DefaultCredentialsProvider": _DEFAULT_CHAIN,
    f"{_SDK}ProfileCredentialsProvider": _Provider(
        ("aws_profile",), 0, "<profile name> (default: AWS_PROFILE, else default)",
        "a profile of the shared config and credentials files"),
    f"{_AWSLABS}BasicAwsCredentials": _Provider(
        ("aws_access_key_id", "aws_secret_key"), 2, "<access key id>,<secret key>",
        "static keys"),
    f"{_AWSLABS}BasicAwsSessionCredentials": _Provider(
        ("aws_access_key_id", "aws_secret_key", "aws_session_token"), 3,
        "<access key id>,<secret key>,<session token>", "temporary static keys"),
    f"{_AWSLABS}ConnectorSTSCredentialsProvider": _Provider(
        ("sts_assume_role_arn", "sts_session_name"), 1, "<role ARN>[,<session name>]",
        "the role, assumed once per process and again before it expires"),
}

# The credential fields a provider class replaces: given beside one, they would disagree.
_CREDENTIAL_FIELDS = ("aws_access_key_id", "aws_secret_key", "aws_session_token",
                      "sts_assume_role_arn", "sts_session_name", "sts_external_id")


def accepted_classes() -> str:
    """The accepted class names, each with its param, for errors and docs."""
    return "; ".join(f"{name} ({provider.form}): {provider.means}"
                     for name, provider in PROVIDERS.items())


def apply_provider(given: Mapping[str, Any], config_values: dict[str, Any],
                   names: Mapping[str, str]) -> None:
    """Fill ``config_values``' credential fields from the provider class and param in
    ``given`` (``provider_class``, ``provider_param``); ``names``: field -> option name, for
    errors. Raises ``ConfigurationError`` naming the option for an unknown class, a param it
    cannot take, or a credential option given beside the class."""
    class_name, param = given.get("provider_class"), given.get("provider_param")
    if class_name is None:
        if param is not None:
            raise ConfigurationError(f"{PROVIDER_PARAM} given without {PROVIDER_CLASS}: it is "
                                     "that class's parameter")
        return
    provider = PROVIDERS.get(class_name.strip())
    if provider is None:
        raise ConfigurationError(
            f"{PROVIDER_CLASS}: {class_name!r} is not a provider this connector has (it "
            "cannot load JVM classes); accepted: " + accepted_classes())
    beside = [names.get(field, field) for field in _CREDENTIAL_FIELDS
              if config_values.get(field) is not None]
    if beside:
        raise ConfigurationError(f"{PROVIDER_CLASS} {class_name} and {', '.join(beside)} both "
                                 "give credentials: keep one")
    parts = [] if param is None or not str(param).strip() else \
        [part.strip() for part in str(param).split(",", max(len(provider.fields) - 1, 0))]
    if len(parts) < provider.required or len(parts) > len(provider.fields) or \
            any(not part for part in parts):
        raise ConfigurationError(f"{PROVIDER_PARAM} for {class_name}: expected "
                                 f"{provider.form}, got {param!r}")
    config_values.update(zip(provider.fields, parts, strict=False))
    if provider.fields == ("aws_profile",) and "aws_profile" not in config_values:
        config_values["aws_profile"] = os.environ.get("AWS_PROFILE") or "default"
