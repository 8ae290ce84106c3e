"""Why a connection was refused before any RPC: the stable reason codes of the TLS front. Pure.

The front (libs.service.tls_front) sees three kinds of stranger that gRPC's own TLS would turn
away silently: a peer that does not speak TLS, a peer whose handshake fails (its certificate is
from another CA, expired or malformed), and a peer that never finishes the handshake.
"""

from __future__ import annotations

import enum
import ssl

# The first byte of every TLS record carrying a handshake message (a ClientHello).
TLS_HANDSHAKE_RECORD = 0x16

# OpenSSL X509_V_ERR_* codes (x509_vfy.h) that mean "no chain to a CA we trust".
_UNKNOWN_ISSUER_CODES = frozenset({
    2,   # UNABLE_TO_GET_ISSUER_CERT
    18,  # DEPTH_ZERO_SELF_SIGNED_CERT
    19,  # SELF_SIGNED_CERT_IN_CHAIN
    20,  # UNABLE_TO_GET_ISSUER_CERT_LOCALLY
    21,  # UNABLE_TO_VERIFY_LEAF_SIGNATURE
})
_EXPIRED_CODES = frozenset({
    9,   # CERT_NOT_YET_VALID
    10,  # CERT_HAS_EXPIRED
})


class HandshakeRefusal(enum.Enum):
    PLAINTEXT_REFUSED = "PLAINTEXT_REFUSED"
    UNKNOWN_CA = "UNKNOWN_CA"
    CERTIFICATE_EXPIRED = "CERTIFICATE_EXPIRED"
    BAD_CERTIFICATE = "BAD_CERTIFICATE"
    HANDSHAKE_TIMEOUT = "HANDSHAKE_TIMEOUT"
    # The peer gave up on us (it does not trust our certificate, or shares no cipher or version).
    HANDSHAKE_FAILED = "HANDSHAKE_FAILED"
    # Too many connections on this listener are still handshaking.
    TOO_MANY_HANDSHAKES = "TOO_MANY_HANDSHAKES"


def is_tls_hello(first_byte: bytes) -> bool:
    return first_byte[:1] == bytes([TLS_HANDSHAKE_RECORD])


def classify(exc: BaseException) -> HandshakeRefusal:
    """The refusal reason for an exception raised while a server-side TLS handshake ran."""
    if isinstance(exc, TimeoutError):
        return HandshakeRefusal.HANDSHAKE_TIMEOUT
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        if code in _UNKNOWN_ISSUER_CODES:
            return HandshakeRefusal.UNKNOWN_CA
        if code in _EXPIRED_CODES:
            return HandshakeRefusal.CERTIFICATE_EXPIRED
        return HandshakeRefusal.BAD_CERTIFICATE
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or "").upper()
        if "CERTIFICATE" in reason and "ALERT" not in reason:
            return HandshakeRefusal.BAD_CERTIFICATE
        return HandshakeRefusal.HANDSHAKE_FAILED
    if isinstance(exc, ConnectionAbortedError) and "longer than" in str(exc):
        return HandshakeRefusal.HANDSHAKE_TIMEOUT  # asyncio's own ssl_handshake_timeout
    return HandshakeRefusal.HANDSHAKE_FAILED
