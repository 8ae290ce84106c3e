"""When the OpenAI HTTP API serves TLS: always beyond loopback, with the operator's certificate
if one is given, else the orchestrator's fleet certificate. On loopback plain HTTP stays the
default, so a local `curl http://127.0.0.1:...` keeps working."""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from libs.security.tls import TlsPaths


class HttpTlsRequired(ValueError):
    """The API would listen beyond loopback with no certificate to serve."""


@dataclass(frozen=True)
class HttpTlsFiles:
    cert: Path
    key: Path


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def choose_http_tls(host: str, user: HttpTlsFiles | None, fleet: TlsPaths | None,
                    plaintext_chosen: bool = False) -> HttpTlsFiles | None:
    """The certificate to serve, or None for plain HTTP (loopback, or plaintext_chosen). Pure."""
    if user is not None:
        return user
    if is_loopback(host) or plaintext_chosen:
        return None
    if fleet is not None:
        return HttpTlsFiles(fleet.cert, fleet.key)
    raise HttpTlsRequired(
        f"the HTTP API binds {host}, beyond loopback, and has no certificate: set FORNAX_HTTP_TLS_CERT "
        "and FORNAX_HTTP_TLS_KEY, run with the fleet's TLS (FORNAX_TLS_*), or choose plain HTTP "
        "explicitly with FORNAX_HTTP_INSECURE=1")


def server_ssl_context(files: HttpTlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(files.cert), str(files.key))
    return context
