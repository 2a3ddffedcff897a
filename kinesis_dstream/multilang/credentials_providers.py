"""The Java daemon's ``AWSCredentialsProvider`` values, read into our credential fields.

A value is a chain, as the KCL's ``AwsCredentialsProviderPropertyValueDecoder`` reads it:
providers separated by ``,``, each a class name (short or fully qualified) with its
arguments after ``|``; the STS providers also take the KCL's nested ``key=value``
properties (``externalId``, ``endpointRegion``, ``endpoint``). The Java daemon asks the
chain's providers in turn on every call; a Python process has no JVM classes to load, so
the chain is resolved once, at start: the first provider that can give credentials here
is used. A provider we cannot honour is refused by name at start, even later in a chain,
rather than skipped as the Java daemon skips a class it cannot build. Errors and log lines
name the key and the provider class, never an argument: an external id or a profile's
name is read by fewer people than a log.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import botocore.exceptions
import botocore.session

from ..config import SERVICE_CREDENTIAL_FIELDS
from ..errors import ConfigurationError

# boto3's default chain: environment, profile, web identity, container and instance roles.
DEFAULT_CHAINS = frozenset({"DefaultAWSCredentialsProviderChain", "DefaultCredentialsProvider"})
# The KCL 2.x (SDK v1) and 3.x (SDK v2) names of STS AssumeRole; KCL 3 builds the plain
# StsAssumeRoleCredentialsProvider as its Kcl one, and so do we for the v1 names.
ASSUME_ROLE = frozenset({"KclStsAssumeRoleCredentialsProvider", "StsAssumeRoleCredentialsProvider",
                         "KclSTSAssumeRoleSessionCredentialsProvider",
                         "STSAssumeRoleSessionCredentialsProvider"})
PROFILE = "ProfileCredentialsProvider"
ENVIRONMENT = "EnvironmentVariableCredentialsProvider"
# Providers we refuse, and why: each reads something a Python process has not, or would be
# only approximated by boto3's chain.
REFUSED: Mapping[str, str] = {
    **dict.fromkeys(("SystemPropertyCredentialsProvider", "SystemPropertiesCredentialsProvider"),
                    "reads JVM system properties (aws.accessKeyId), and there is no JVM here; "
                    "use EnvironmentVariableCredentialsProvider"),
    **dict.fromkeys(("InstanceProfileCredentialsProvider", "ContainerCredentialsProvider",
                     "EC2ContainerCredentialsProviderWrapper", "WebIdentityTokenCredentialsProvider",
                     "WebIdentityTokenFileCredentialsProvider", "ProcessCredentialsProvider",
                     "SsoCredentialsProvider"),
                    "is only one link of boto3's chain, which would ask the environment and "
                    "profiles first; use DefaultCredentialsProvider, which ends with it"),
    **dict.fromkeys(("AnonymousCredentialsProvider", "AnonymousAWSCredentialsProvider"),
                    "sends unsigned requests, which Kinesis and DynamoDB refuse"),
    **dict.fromkeys(("StaticCredentialsProvider", "AWSStaticCredentialsProvider",
                     "PropertiesFileCredentialsProvider",
                     "ClasspathPropertiesFileCredentialsProvider"),
                    "keeps keys in the properties file or a Java resource; put them in the "
                    "environment or a profile (EnvironmentVariableCredentialsProvider, "
                    "ProfileCredentialsProvider)"),
}
NESTED_KEYS = ("externalId", "endpointRegion", "endpoint")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
_ROLE_ARN = re.compile(r"arn:aws[a-zA-Z-]*:iam::\d{12}:role/\S+")


@dataclass(frozen=True)
class Provider:
    """One provider of a chain: its class name and the credential fields it sets."""

    name: str
    fields: dict[str, Any] = field(default_factory=dict, repr=False)
    # Why it cannot give credentials here (None: it can).
    unavailable: str | None = None


def read_provider_chain(key: str, value: str, environ: Mapping[str, str] | None = None
                        ) -> dict[str, Any]:
    """Every credential field (``SERVICE_CREDENTIAL_FIELDS``) as ``value`` sets it; raises
    ``ConfigurationError`` naming ``key`` and a provider class when it cannot be honoured."""
    environ = os.environ if environ is None else environ
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    if not entries:
        raise ConfigurationError(f"{key}: a credentials provider is required")
    chain = [_provider(key, entry, environ) for entry in entries]
    for provider in chain:
        if provider.unavailable is None:
            return {name: provider.fields.get(name) for name in SERVICE_CREDENTIAL_FIELDS}
    reasons = "; ".join(f"{p.name} {p.unavailable}" for p in chain)
    raise ConfigurationError(f"{key}: no provider of the chain can give credentials here: "
                             f"{reasons}")


def _provider(key: str, entry: str, environ: Mapping[str, str]) -> Provider:
    name, *args = [part.strip() for part in entry.split("|")]
    short = name.rsplit(".", 1)[-1]
    where = f"{key} = {short}"
    if short in DEFAULT_CHAINS:
        if args:
            raise ConfigurationError(f"{where}: takes no arguments")
        return Provider(short)
    if short == ENVIRONMENT:
        if args:
            raise ConfigurationError(f"{where}: takes no arguments")
        missing = [v for v in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not environ.get(v)]
        # Set, boto3's chain reads them before anything else: the same keys sign.
        return Provider(short, unavailable=f"needs {' and '.join(missing)} set"
                        if missing else None)
    if short == PROFILE:
        return _profile(where, short, args, environ)
    if short in ASSUME_ROLE:
        return Provider(short, _assume_role(where, args))
    if short in REFUSED:
        raise ConfigurationError(f"{where}: not supported by this engine: it {REFUSED[short]}")
    raise ConfigurationError(
        f"{where}: not a credentials provider this engine knows; supported: "
        f"{', '.join(sorted(DEFAULT_CHAINS))}, {ENVIRONMENT}, {PROFILE}, "
        f"{', '.join(sorted(ASSUME_ROLE))}")


def _profile(where: str, short: str, args: list[str], environ: Mapping[str, str]) -> Provider:
    if len(args) > 1:
        # SDK v1's (configFilePath, profileName): point AWS_SHARED_CREDENTIALS_FILE there.
        raise ConfigurationError(f"{where}: a credentials file path is not supported; set "
                                 "AWS_SHARED_CREDENTIALS_FILE and give the profile name alone")
    # No argument: the SDK's default profile, AWS_PROFILE or "default", from the files only.
    profile = args[0] if args and args[0] else environ.get("AWS_PROFILE") or "default"
    try:
        known = botocore.session.Session().available_profiles
    except botocore.exceptions.BotoCoreError:
        known = []
    unavailable = None if profile in known else \
        "names a profile in neither the shared config nor the credentials file"
    return Provider(short, {"aws_profile": profile}, unavailable)


def _assume_role(where: str, args: list[str]) -> dict[str, Any]:
    positional = [a for a in args if not _is_nested(a)]
    nested = [a for a in args if _is_nested(a)]
    if not positional or not _ROLE_ARN.fullmatch(positional[0]):
        raise ConfigurationError(f"{where}: the first argument must be a role ARN "
                                 "(arn:aws:iam::<account>:role/<name>)")
    if len(positional) > 2:
        raise ConfigurationError(f"{where}: takes a role ARN, a session name and nested "
                                 f"{', '.join(NESTED_KEYS)}; got {len(positional)} plain "
                                 "arguments")
    fields: dict[str, Any] = {
        "sts_assume_role_arn": positional[0],
        # The Java daemon needs a session name; without one ours names the session
        # (config.default_sts_session_name), as for Databricks' roleArn alone.
        "sts_session_name": positional[1] if len(positional) == 2 and positional[1] else None,
    }
    for item in nested:
        nested_key, _, value = item.partition("=")
        nested_key = nested_key.strip()
        if nested_key not in NESTED_KEYS:
            raise ConfigurationError(f"{where}: unknown nested property {nested_key!r} "
                                     f"(known: {', '.join(NESTED_KEYS)})")
        value = value.strip()
        if nested_key == "externalId":
            if not value:
                raise ConfigurationError(f"{where}: externalId is empty")
            fields["sts_external_id"] = value
        elif nested_key == "endpointRegion":
            fields["sts_region"] = _region(where, "endpointRegion", value)
        else:  # endpoint = URL^signing region, as NestedPropertyKey.ENDPOINT
            url, caret, region = value.partition("^")
            if not caret or not url:
                raise ConfigurationError(f"{where}: endpoint must be <url>^<signing region>")
            if "://" not in url:
                url = f"https://{url}"  # as KclStsAssumeRoleCredentialsProvider.acceptEndpoint
            fields["sts_endpoint"] = url
            fields["sts_region"] = _region(where, "endpoint's signing region", region)
    return fields


def _is_nested(arg: str) -> bool:
    """A KCL nested property (``key=value`` with a lower-camel-case key); a session name may
    hold ``=`` too, but never starts with one of these keys followed by it."""
    key, equals, _ = arg.partition("=")
    return bool(equals) and re.fullmatch(r"[a-z][A-Za-z]*", key.strip()) is not None


def _region(where: str, what: str, value: str) -> str:
    if not _REGION.fullmatch(value):
        raise ConfigurationError(f"{where}: {what} is not an AWS region name")
    return value
