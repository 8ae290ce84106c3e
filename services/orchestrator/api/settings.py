"""The HTTP front's settings (FORNAX_* variables): port, key, limits, TLS."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from libs.service.env_settings import integer, read_env, setting, switch, text, write_env
from services.orchestrator.api.http_api import HttpConfig
from services.orchestrator.api.http_tls import HttpTlsFiles


@dataclass(frozen=True)
class HttpSettings:
    # OpenAI-compatible HTTP port; 0 = the OS chooses.
    port: int = setting("FORNAX_HTTP_PORT", 0, integer(0))
    # Never from a flag, so it stays out of process listings.
    api_key: str | None = setting("FORNAX_API_KEY", None, text())
    max_body_bytes: int = setting("FORNAX_HTTP_MAX_BODY_BYTES", HttpConfig.max_body_bytes, integer(1))
    # Kernel send buffer per HTTP client connection; 0 leaves the kernel's autotuning.
    send_buffer_bytes: int = setting("FORNAX_HTTP_SEND_BUFFER_BYTES", 0, integer(0))
    # Operator-supplied HTTP certificate and key (both or neither); otherwise the fleet
    # certificate beyond loopback.
    tls_cert: str | None = setting("FORNAX_HTTP_TLS_CERT", None, text())
    tls_key: str | None = setting("FORNAX_HTTP_TLS_KEY", None, text())
    # Plain HTTP beyond loopback, said explicitly (TLS terminated in front of the pod, say).
    insecure: bool = setting("FORNAX_HTTP_INSECURE", False, switch())

    def __post_init__(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SystemExit("set both FORNAX_HTTP_TLS_CERT and FORNAX_HTTP_TLS_KEY, or neither")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HttpSettings:
        return read_env(cls, env)

    def to_env(self, *fields: str) -> dict[str, str]:
        return write_env(self, fields)

    @property
    def tls(self) -> HttpTlsFiles | None:
        return HttpTlsFiles(Path(self.tls_cert), Path(self.tls_key)) if self.tls_cert and self.tls_key else None

    def http_config(self, idle_write_timeout_s: float) -> HttpConfig:
        """What the HTTP app runs with; an idle-write timeout of 0 waits forever."""
        return HttpConfig(api_key=self.api_key, idle_write_timeout_s=idle_write_timeout_s or None,
                          send_buffer_bytes=self.send_buffer_bytes or None, max_body_bytes=self.max_body_bytes)
