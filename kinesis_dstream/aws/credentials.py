"""A static key's secret, found again where the driver's environment keeps it.

Spark's DStream checkpoint holds a stream's configuration, but never its secret key (a
checkpoint directory is read by more people, and kept longer, than the job's secrets). A
driver recovered from one (``StreamingContext.getOrCreate``) knows the access key id only,
and finds its secret where botocore itself would look first: the environment
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``), then the profile ``AWS_PROFILE`` names
(default: ``default``) in the shared credentials and config files. Only a secret given with
the same key id counts: another key's secret would sign as a different identity.
"""
from __future__ import annotations

import botocore.exceptions
import botocore.session

from ..errors import ConfigurationError

# botocore's providers of static keys, in its order; no role, container or instance lookup
# (those give keys of their own, never the secret of a key id named elsewhere).
_STATIC_PROVIDERS = ("env", "shared-credentials-file", "config-file")


def stored_secret_key(access_key_id: str) -> str | None:
    """The secret key of ``access_key_id`` in the environment or the current profile."""
    try:
        resolver = botocore.session.Session().get_component("credential_provider")
        for method in _STATIC_PROVIDERS:
            credentials = resolver.get_provider(method).load()
            if credentials is not None and credentials.access_key == access_key_id:
                return str(credentials.secret_key)
    except botocore.exceptions.BotoCoreError:  # a broken or missing profile: not found
        return None
    return None


def recovered_secret_key(access_key_id: str, stream: str) -> str:
    """The secret key of a recovered stream's ``access_key_id``; raises ``ConfigurationError``
    naming the key id, where it was looked for and the fix when it is nowhere."""
    secret = stored_secret_key(access_key_id)
    if secret is None:
        raise ConfigurationError(
            f"stream {stream}: recovered from Spark's checkpoint, which keeps its access key id "
            f"{access_key_id} but never the secret key; give the driver that key before "
            f"StreamingContext.getOrCreate: AWS_ACCESS_KEY_ID={access_key_id} with "
            "AWS_SECRET_ACCESS_KEY in its environment, or AWS_PROFILE naming a profile that "
            "holds the key (or give createStream no static key and let a role or profile "
            "supply credentials)")
    return secret
