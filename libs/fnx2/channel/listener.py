"""Limits and peer admission for FNX2 listeners, applied before a peer is trusted.

A receiver sends nothing and reserves no payload memory for a peer it has not admitted:
- with TLS, asyncio hands the connection over only after the TLS handshake, which has
  its own timeout (`server_options`);
- with an allowed-peer policy, the peer's certificate identity (SAN DNS / URI names and
  the subject CN) must pass it before the hello is sent; otherwise one ERROR
  `PEER_REFUSED` and the channel closes;
- until the peer's hello ACK binds the channel, a frame body may be no larger than a
  small preamble (`unbound_body_bytes`); after that, no larger than the metadata limit
  plus the payload credit the receiver has granted on that channel;
- the hello ACK must come within `handshake_timeout_s`, and a bound channel with nothing
  executing is closed after `idle_timeout_s` without a frame;
- at most `max_connections` channels per listener; one more gets `CONNECTION_LIMIT`.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from libs.fnx2.wire.errors import ErrorCode, Fnx2Error


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float | None = 900.0
    max_connections: int = 128
    # Large enough for a hello ACK or an extension offer (a few hundred bytes).
    unbound_body_bytes: int = 16 * 1024
    # How often leases past their deadline are expired with no message needed.
    sweep_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.handshake_timeout_s <= 0 or self.max_connections < 1 or self.unbound_body_bytes < 1024:
            raise ValueError("listener limits must be positive (unbound_body_bytes >= 1024)")
        if self.idle_timeout_s is not None and self.idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be positive or None")


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """What a verified client certificate says about its holder."""

    common_name: str | None
    dns_names: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.dns_names + self.uris + ((self.common_name,) if self.common_name else ()))

    @classmethod
    def from_peercert(cls, cert: dict[str, Any]) -> PeerIdentity:
        alt = cert.get("subjectAltName", ())
        common_name = next((value for rdn in cert.get("subject", ()) for key, value in rdn
                            if key == "commonName"), None)
        return cls(common_name, tuple(v for k, v in alt if k == "DNS"),
                   tuple(v for k, v in alt if k == "URI"))


AllowedPeers = frozenset[str] | Callable[[PeerIdentity], bool]


@dataclass(frozen=True)
class PeerPolicy:
    """TLS for the listener and, optionally, which client certificate identities may bind.

    `allowed_peer_identities`: a set of names (any SAN DNS / URI name or the CN must be in
    it) or a callable deciding on the whole identity. It needs a context that requires and
    verifies client certificates, so a name can only come from the trusted CA.
    """

    ssl_context: ssl.SSLContext
    allowed_peer_identities: AllowedPeers | None = None

    def __post_init__(self) -> None:
        if self.allowed_peer_identities is not None and self.ssl_context.verify_mode != ssl.CERT_REQUIRED:
            raise ValueError("an allowed-peer policy needs an SSLContext with verify_mode CERT_REQUIRED")

    def admit(self, transport: Any) -> PeerIdentity | None:
        """The admitted peer's identity (None when no policy names peers); raises
        PEER_REFUSED for a plaintext transport, a missing certificate or a name not allowed."""
        if self.allowed_peer_identities is None:
            return None
        if transport.get_extra_info("ssl_object") is None:
            raise Fnx2Error(ErrorCode.PEER_REFUSED, "this listener admits TLS peers only")
        cert = transport.get_extra_info("peercert")
        if not cert:
            raise Fnx2Error(ErrorCode.PEER_REFUSED, "the peer presented no verified certificate")
        identity = PeerIdentity.from_peercert(cert)
        allowed = self.allowed_peer_identities
        ok = allowed(identity) if callable(allowed) else bool(identity.names & allowed)
        if not ok:
            raise Fnx2Error(ErrorCode.PEER_REFUSED, "the peer's certificate identity is not allowed")
        return identity


def server_options(limits: ListenerLimits, policy: PeerPolicy | None,
                   ssl_context: ssl.SSLContext | None = None) -> dict[str, Any]:
    """Keyword arguments for `loop.create_server(receiver.protocol, host, port, **...)`."""
    context = ssl_context if ssl_context is not None else (policy.ssl_context if policy else None)
    if context is None:
        return {}
    return {"ssl": context, "ssl_handshake_timeout": limits.handshake_timeout_s}
