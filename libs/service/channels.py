"""One way to reach another service: every gRPC client channel is opened here.

    channel = open_aio_channel(address, ChannelConfig(), idempotent=(PLANNER_SERVICE,))
    stub = PlannerServiceStub(channel)

Each channel gets the same message size limit as the servers (`MAX_MESSAGE_BYTES`), the
OpenTelemetry client interceptors, a default deadline on unary calls that set none, a retry
policy carried in gRPC's service config, and TLS when client credentials are given.

Retries follow the house rule: only UNAVAILABLE and RESOURCE_EXHAUSTED, with exponential
backoff, and only on the RPCs the caller names as idempotent (reads, or mutations that carry a
`request_id` the server deduplicates). gRPC itself resends the request, so the same request id
travels on every attempt.
"""

from __future__ import annotations

import json
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import grpc

# What every Fornax server accepts and sends; clients use the same figure so a reply the server
# is willing to send (a 32 MiB evidence blob, say) is one the client is willing to receive.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# A unary call that names no timeout of its own still ends: a peer that never answers is a fault.
DEFAULT_DEADLINE_S = 60.0
RETRYABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


@dataclass(frozen=True)
class ClientCredentials:
    """TLS material for a client: a CA bundle to trust, and an optional client certificate (mTLS)."""

    ca_pem: bytes
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    # The name the server's certificate must carry, when it differs from the dialled host.
    server_name_override: str = ""

    def __post_init__(self) -> None:
        if (self.cert_pem is None) != (self.key_pem is None):
            raise ValueError("a client certificate needs its private key, and a key needs its certificate")

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3  # gRPC caps this at 5
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    backoff_multiplier: float = 2.0


@dataclass(frozen=True)
class ChannelConfig:
    credentials: ClientCredentials | None = None  # None: plaintext
    retry: RetryPolicy = RetryPolicy()
    default_deadline_s: float | None = DEFAULT_DEADLINE_S
    max_message_bytes: int = MAX_MESSAGE_BYTES
    traced: bool = True


def service_config(idempotent: Sequence[str], retry: RetryPolicy) -> str:
    """gRPC service config JSON retrying `idempotent` RPCs ("pkg.Service" or "pkg.Service/Method")."""
    names = []
    for rpc in idempotent:
        service, _, method = rpc.partition("/")
        names.append({"service": service, "method": method} if method else {"service": service})
    if not names:
        return json.dumps({"methodConfig": []})
    policy = {
        "maxAttempts": retry.max_attempts,
        "initialBackoff": f"{retry.initial_backoff_s}s",
        "maxBackoff": f"{retry.max_backoff_s}s",
        "backoffMultiplier": retry.backoff_multiplier,
        "retryableStatusCodes": [code.name for code in RETRYABLE_CODES],
    }
    return json.dumps({"methodConfig": [{"name": names, "retryPolicy": policy}]})


def channel_options(config: ChannelConfig, idempotent: Sequence[str] = ()) -> list[tuple[str, object]]:
    options: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config(idempotent, config.retry)),
    ]
    if config.credentials is not None and config.credentials.server_name_override:
        options.append(("grpc.ssl_target_name_override", config.credentials.server_name_override))
    return options


def open_channel(address: str, config: ChannelConfig = ChannelConfig(),
                 idempotent: Sequence[str] = ()) -> grpc.Channel:
    """A blocking channel; close it with `close()` or use it as a context manager."""
    options = channel_options(config, idempotent)
    if config.credentials is None:
        channel = grpc.insecure_channel(address, options=options)
    else:
        channel = grpc.secure_channel(address, config.credentials.channel_credentials(), options=options)
    if config.traced:
        from opentelemetry.instrumentation.grpc import client_interceptor
        from opentelemetry.instrumentation.grpc.grpcext import intercept_channel

        channel = intercept_channel(channel, client_interceptor())
    if config.default_deadline_s is not None:
        # Outermost, so the tracing interceptor and the retries see the deadline.
        channel = grpc.intercept_channel(channel, _DefaultDeadline(config.default_deadline_s))
    return channel


def open_aio_channel(address: str, config: ChannelConfig = ChannelConfig(),
                     idempotent: Sequence[str] = ()) -> grpc.aio.Channel:
    """A grpc.aio channel; close it with `await close()` or use it as an async context manager."""
    options = channel_options(config, idempotent)
    interceptors: list = []
    if config.default_deadline_s is not None:
        interceptors.append(_AioDefaultDeadline(config.default_deadline_s))
    if config.traced:
        from opentelemetry.instrumentation.grpc import aio_client_interceptors

        interceptors.extend(aio_client_interceptors())
    if config.credentials is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, config.credentials.channel_credentials(), options=options,
                                   interceptors=interceptors)


@contextmanager
def rpc_errors_as(wrap: Callable[[grpc.RpcError], Exception]) -> Iterator[None]:
    """Raise a client's own error for any failed RPC inside the block (after gRPC's retries)."""
    try:
        yield
    except grpc.RpcError as error:
        raise wrap(error) from None


class _CallDetails(namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class _DefaultDeadline(grpc.UnaryUnaryClientInterceptor):
    """Streams are left alone: their lifetime is the caller's (a build's progress, a generation)."""

    def __init__(self, deadline_s: float) -> None:
        self._deadline_s = deadline_s

    def intercept_unary_unary(self, continuation, client_call_details, request):
        if client_call_details.timeout is None:
            client_call_details = _CallDetails(
                client_call_details.method, self._deadline_s, client_call_details.metadata,
                client_call_details.credentials, client_call_details.wait_for_ready,
                getattr(client_call_details, "compression", None))
        return continuation(client_call_details, request)


class _AioDefaultDeadline(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, deadline_s: float) -> None:
        self._deadline_s = deadline_s

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        if client_call_details.timeout is None:
            client_call_details = client_call_details._replace(timeout=self._deadline_s)
        return await continuation(client_call_details, request)
