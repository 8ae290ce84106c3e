"""TLS and node admission on the FNX2 data plane, with fleet identities.

A stage's listener requires a client certificate from the fleet CA, and its peer policy
admits only the identity the installed plan names as the previous hop (or the orchestrator's
gateway for the first stage); anyone else gets one ERROR `PEER_REFUSED` before any hello, and
the refusal is reported to `on_refused` (the service's audit log). A sender checks that the
next hop's certificate carries the identity the plan names for it before it sends anything.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
from collections.abc import Callable
from typing import Any

from libs.fnx2.channel.listener import ListenerLimits, PeerIdentity, PeerPolicy, server_options
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.channel.transport import FrameProtocol
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.security.tls import ReloadingSslContext, TlsPaths, peer_uris

# (who the peer said it was, why it was refused)
RefusalSink = Callable[[str, str], None]

# asyncio gives every TLS connection a read buffer of SSLProtocol.max_size (256 KiB) up front,
# before the peer has authenticated: 100 idle peers pinned 30 MiB of a stage. FNX2's
# buffered protocol never uses that buffer (TLS plaintext goes straight into its own frame
# buffers); protocols that do (aiohttp's) then read one TLS record (at most 16 KiB) at a time.
# The figure is read as each connection is made, so it is set before any listener exists.
TLS_READ_BUFFER_BYTES = 16 * 1024


def bound_tls_read_buffers() -> None:
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES


def _describe(identity: PeerIdentity) -> str:
    return ",".join(identity.uris) or identity.common_name or "unnamed"


class Fnx2Tls:
    def __init__(self, paths: TlsPaths, on_refused: RefusalSink | None = None):
        bound_tls_read_buffers()
        self.server = ReloadingSslContext(paths, server=True)
        self.client = ReloadingSslContext(paths, server=False)
        self._on_refused = on_refused

    def reload(self) -> None:
        """Pick up rotated files (SIGHUP, or before each new connection)."""
        self.server.maybe_reload()
        self.client.maybe_reload()

    def listener_options(self, limits: ListenerLimits) -> dict[str, Any]:
        return server_options(limits, None, self.server.context)

    def admit_only(self, allowed_uri: str) -> PeerPolicy:
        """The peer policy of one bound stage: exactly allowed_uri may open a channel."""
        def allowed(identity: PeerIdentity) -> bool:
            if allowed_uri in identity.uris:
                return True
            if self._on_refused is not None:
                self._on_refused(_describe(identity), f"not the previous hop the plan names ({allowed_uri})")
            return False

        return PeerPolicy(self.server.context, allowed_peer_identities=allowed)

    async def connect(self, host: str, port: int, config: SenderConfig, expected_uri: str) -> Fnx2Client:
        """An FNX2 client to host:port whose certificate must carry expected_uri."""
        self.client.maybe_reload()
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(
            lambda: FrameProtocol(config.codec), host, port, ssl=self.client.context, server_hostname=host)
        found = peer_uris(transport.get_extra_info("ssl_object"))
        if expected_uri not in found:
            transport.close()
            raise Fnx2Error(ErrorCode.PEER_REFUSED,
                            f"{host}:{port} is {', '.join(found) or 'unnamed'}, not the planned {expected_uri}")
        return await Fnx2Client.open(protocol, protocol, config)
