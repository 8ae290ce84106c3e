"""The raw-socket TLS contexts the data plane uses: mutual verification and in-place reload."""

import asyncio
import datetime as dt

import pytest

from libs.security.identity import Identity, Role, stage_identity
from libs.security.store import CertStore
from libs.security.tls import ReloadingSslContext, peer_uris

NOW = dt.datetime.now(dt.UTC)


async def _handshake(server_ctx, client_ctx) -> tuple[str | None, tuple[str, ...]]:
    """(URI the server saw from the client, URIs the client saw from the server)."""
    seen = asyncio.get_running_loop().create_future()

    async def on_client(reader, writer):
        seen.set_result(peer_uris(writer.get_extra_info("ssl_object")))
        writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="localhost")
        client_saw = peer_uris(writer.get_extra_info("ssl_object"))
        server_saw = await asyncio.wait_for(seen, 5)
        writer.close()
    finally:
        server.close()
    return server_saw, client_saw


def test_both_sides_verify_and_see_each_others_identity(tmp_path):
    store = CertStore(tmp_path)
    store.init(NOW)
    server = ReloadingSslContext(store.ensure(stage_identity(1), NOW), server=True)
    client = ReloadingSslContext(store.ensure(stage_identity(0), NOW), server=False)
    server_saw, client_saw = asyncio.run(_handshake(server.context, client.context))
    assert server_saw == ("spiffe://fornax/stage/stage-0",)
    assert client_saw == ("spiffe://fornax/stage/stage-1",)


def test_a_client_from_another_ca_fails_the_handshake(tmp_path):
    store, stranger = CertStore(tmp_path / "a"), CertStore(tmp_path / "b")
    store.init(NOW)
    stranger.init(NOW)
    server = ReloadingSslContext(store.ensure(stage_identity(1), NOW), server=True)
    foreign = ReloadingSslContext(stranger.ensure(stage_identity(0), NOW), server=False)
    foreign.context.load_verify_locations(cafile=str(store.ca_cert))  # trusts the server, is not trusted
    with pytest.raises((ConnectionError, OSError)):
        asyncio.run(_handshake(server.context, foreign.context))


def test_rotation_reloads_into_the_same_context(tmp_path):
    store = CertStore(tmp_path)
    store.init(NOW)
    who = Identity(Role.STAGE, "stage-1")
    server = ReloadingSslContext(store.ensure(who, NOW), server=True)
    context = server.context
    assert not server.maybe_reload()
    store.rotate([who], NOW)
    assert server.maybe_reload() and server.context is context and server.reloads == 2


def test_ca_rotation_trusts_both_then_only_the_new_ca_on_the_same_listener_context(tmp_path):
    store = CertStore(tmp_path)
    store.init(NOW)
    server = ReloadingSslContext(store.ensure(stage_identity(1), NOW), server=True)
    listener_context = server.context
    old_client = ReloadingSslContext(store.ensure(stage_identity(0), NOW), server=False)
    old_context = old_client.context

    store.rotate_ca(NOW)
    assert store.leaves_of_retiring_ca() == [stage_identity(0), stage_identity(1)]
    store.rotate(store.identities(), NOW)
    assert server.maybe_reload() and old_client.maybe_reload()
    new_context = old_client.context
    # Transition: the new CA's leaves and the old CA's are both accepted.
    assert asyncio.run(_handshake(listener_context, new_context))[0] == ("spiffe://fornax/stage/stage-0",)
    old_context.load_verify_locations(cafile=str(store.ca_cert))  # the old leaf trusts the new server
    assert asyncio.run(_handshake(listener_context, old_context))[0] == ("spiffe://fornax/stage/stage-0",)

    assert store.leaves_of_retiring_ca() == []
    store.retire_ca()
    assert server.maybe_reload()
    assert server.context is listener_context
    assert asyncio.run(_handshake(listener_context, new_context))[0] == ("spiffe://fornax/stage/stage-0",)
    with pytest.raises((ConnectionError, OSError)):
        asyncio.run(_handshake(listener_context, old_context))
