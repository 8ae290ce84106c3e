"""The OpenAI HTTP API: TLS beyond loopback, plain HTTP on loopback, and the body cap."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiohttp
import pytest

from libs.security.identity import Identity, Role
from services.orchestrator.api.http_api import HttpConfig, build_http_app, start_http
from services.orchestrator.api.http_tls import (
    HttpTlsFiles,
    HttpTlsRequired,
    choose_http_tls,
    server_ssl_context,
)
from services.orchestrator.engine.route_slot import RouteSlot
from tests.integration.security.pki import FleetPki

ORCHESTRATOR = Identity(Role.SERVICE, "orchestrator")


def test_beyond_loopback_needs_a_certificate(tmp_path):
    fleet = FleetPki(tmp_path).paths(ORCHESTRATOR)
    user = HttpTlsFiles(Path("/etc/api.pem"), Path("/etc/api.key"))
    assert choose_http_tls("127.0.0.1", None, fleet) is None
    assert choose_http_tls("::1", None, None) is None
    assert choose_http_tls("0.0.0.0", None, fleet) == HttpTlsFiles(fleet.cert, fleet.key)
    assert choose_http_tls("127.0.0.1", user, fleet) == user
    with pytest.raises(HttpTlsRequired):
        choose_http_tls("10.0.0.5", None, None)


def test_https_with_the_fleet_certificate(tmp_path):
    pki = FleetPki(tmp_path)
    files = choose_http_tls("0.0.0.0", None, pki.paths(ORCHESTRATOR))

    async def body():
        app = build_http_app(RouteSlot(), HttpConfig())
        runner, port = await start_http(app, "127.0.0.1", 0, server_ssl_context(files))
        client_ssl = ssl.create_default_context(cafile=str(pki.store.ca_cert))
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"https://127.0.0.1:{port}/v1/models", ssl=client_ssl) as response:
                    listed = (response.status, await response.json())
                with pytest.raises(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{port}/v1/models"):
                        pass
        finally:
            await runner.cleanup()
        return listed

    status, answer = asyncio.run(body())
    # Served over TLS; no route is installed yet, so no model is listed.
    assert status == 200 and answer["data"] == []
