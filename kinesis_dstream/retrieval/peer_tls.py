"""The key a query's tasks prove themselves with to each other: one TLS identity per query.

The driver makes a fresh P-256 key and a self-signed certificate for it (``new_peer_key``)
and gives both to the query's tasks inside their planned ranges, as it gives them
everything else they read with: they travel as Spark's own task messages do (encrypted
where ``spark.network.crypto.enabled`` or ``spark.ssl`` is set). Executors then speak TLS
1.3 to each other with that one identity on both ends, each side requiring the other's
certificate to be the query's: both are authenticated by the same handshake that keys the
channel, so nothing can be relayed or read on the way, and a process without the key (a
stranger, a task of another query) completes no handshake.

Only the driver needs ``cryptography`` (to make the certificate); executors use the
standard library's ``ssl``, which loads a key from a file only: it is written to a private
temporary file for the moment ``load_cert_chain`` reads it.
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import os
import shutil
import ssl
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

# The contexts this process keeps, one per query key it met (a process serves few queries).
_MAX_CONTEXTS = 8


@dataclass(frozen=True)
class PeerKey:
    """A query's TLS identity: a certificate and its private key (DER), never shown."""

    certificate: bytes = field(repr=False)
    private_key: bytes = field(repr=False)

    @property
    def id(self) -> str:
        """A name for this key that reveals nothing of it (the certificate's digest)."""
        return hashlib.sha256(self.certificate).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"PeerKey(id={self.id})"


def new_peer_key() -> PeerKey:
    """A fresh key for one query (or one DStream driver), made in the driver."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kinesis-dstream query peer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        # A query may run for years; the key dies with the driver process that made it.
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(key, hashes.SHA256()))
    return PeerKey(
        certificate.public_bytes(serialization.Encoding.DER),
        key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()))


_contexts: OrderedDict[tuple[PeerKey, bool], ssl.SSLContext] = OrderedDict()
_contexts_lock = threading.Lock()


def tls_context(key: PeerKey, *, server: bool) -> ssl.SSLContext:
    """This process's TLS 1.3 context for ``key``'s side ``server`` (made once per key):
    it presents the query's certificate and accepts only a peer presenting it too."""
    with _contexts_lock:
        context = _contexts.get((key, server))
        if context is None:
            context = _contexts[(key, server)] = _new_context(key, server)
            while len(_contexts) > 2 * _MAX_CONTEXTS:
                _contexts.popitem(last=False)
        _contexts.move_to_end((key, server))
        return context


def _new_context(key: PeerKey, server: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False  # the peer is named by its certificate, not its host
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=key.certificate)
    directory = tempfile.mkdtemp(prefix="kinesis-dstream-peer-")  # mode 0700
    try:
        path = os.path.join(directory, "peer.pem")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(ssl.DER_cert_to_PEM_cert(key.certificate))
            out.write(_pem("PRIVATE KEY", key.private_key))
        context.load_cert_chain(path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return context


def _pem(label: str, der: bytes) -> str:
    body = base64.encodebytes(der).decode("ascii")
    return f"-----BEGIN {label}-----\n{body}-----END {label}-----\n"


def is_the_query(connection: ssl.SSLSocket, key: PeerKey) -> bool:
    """Did the peer present exactly the query's certificate? (Verification already
    requires one signed by the query's key, which only the query's tasks hold.)"""
    presented = connection.getpeercert(binary_form=True) or b""
    return hmac.compare_digest(presented, key.certificate)
