"""Authorization and audit for every RPC of a service: one server interceptor.

It sits inside the error interceptor, so a refusal is a FornaxError like any other and reaches
the caller as UNAUTHENTICATED or PERMISSION_DENIED with its stable reason. Refusals, and every
call of a mutating RPC whatever its outcome, are appended to the service's audit log.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Callable

import grpc
import structlog
from cryptography import x509

from libs.security.audit import ANONYMOUS, AuditEvent, AuditLog
from libs.security.authz import MUTATING, Access, Reason, RefusalKind, access_for, decide
from libs.security.certs import CertificateError, identity_of
from libs.security.identity import Identity
from libs.service.errors import FornaxError, PermissionDenied, Unauthenticated
from libs.service.tls_front import PeerIdentityUnknown, PeerTable

log = structlog.get_logger()


def peer_identity(context) -> Identity | None:
    """The fleet identity in the peer's verified certificate (gRPC core's TLS), or None."""
    pem = (context.auth_context() or {}).get("x509_pem_cert")
    if not pem:
        return None
    return identity_of(x509.load_pem_x509_certificate(pem[0]))


def _fronted_peer(context, peers: PeerTable) -> tuple[Identity | None, bool]:
    """(identity, came through the TLS front) for a call on a server behind the front."""
    auth = peers.lookup(context.peer() or "")
    if auth is None:
        return None, False  # a loopback connection the front did not open
    if auth.certificate_error is not None:
        raise auth.certificate_error
    return auth.identity, True


def _bearer(context) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer "):]
    return None


def _digest(request) -> str:
    serialize = getattr(request, "SerializeToString", None)
    data = serialize(deterministic=True) if serialize else b""
    return hashlib.sha256(data).hexdigest()


class AuthzInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, service_kind: str, audit: AuditLog | None, api_key: str | None = None,
                 enforce: bool = True, peers: PeerTable | None = None):
        self._service = service_kind
        self._audit = audit
        self._api_key = api_key
        # False on an explicitly insecure server: nobody can be identified, but mutating
        # actions are still audited (as anonymous).
        self._enforce = enforce
        # Set when the TLS front terminates TLS: identities come from its table, not gRPC's.
        self._peers = peers

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        if handler.unary_unary:
            return handler._replace(unary_unary=self._wrap_unary(handler.unary_unary, method))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._wrap_stream(handler.unary_stream, method))
        if handler.stream_unary:
            return handler._replace(stream_unary=self._wrap_unary(handler.stream_unary, method))
        return handler._replace(stream_stream=self._wrap_stream(handler.stream_stream, method))

    def _admit(self, method: str, request, context) -> Identity | None:
        """The caller's identity if it may call method; raises (and audits) otherwise."""
        if not self._enforce:
            return None
        try:
            if self._peers is None:
                identity, tls = peer_identity(context), True
            else:
                identity, tls = _fronted_peer(context, self._peers)
        except CertificateError as exc:
            self._record(method, None, request, f"UNAUTHENTICATED:{exc.reason}")
            raise Unauthenticated(str(exc), reason=exc.reason) from exc
        except PeerIdentityUnknown as exc:
            if access_for(method) is Access.OPEN:
                return None  # health and reflection need nobody
            reason = Reason.PEER_IDENTITY_UNKNOWN.value
            self._record(method, None, request, f"UNAUTHENTICATED:{reason}")
            raise Unauthenticated(str(exc), reason=reason) from exc
        bearer = _bearer(context)
        # The API key counts only over TLS: never on a loopback connection that bypassed the front.
        api_key_ok = bool(tls and self._api_key and bearer and hmac.compare_digest(bearer, self._api_key))
        refusal = decide(method, identity, api_key_ok)
        if refusal is None:
            return identity
        self._record(method, identity, request, f"{refusal.kind.value}:{refusal.reason.value}")
        error = Unauthenticated if refusal.kind is RefusalKind.UNAUTHENTICATED else PermissionDenied
        raise error(refusal.message, reason=refusal.reason.value)

    def _record(self, method: str, identity: Identity | None, request, result: str) -> None:
        log.info("rpc_audited", rpc=method, caller=str(identity or ANONYMOUS), result=result)
        if self._audit is None:
            return
        self._audit.append(AuditEvent(
            time=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            caller=str(identity) if identity else ANONYMOUS, rpc=method,
            args_sha256=_digest(request), result=result, service=self._service))

    def _outcome(self, method: str, identity, request, exc: BaseException | None) -> None:
        if method not in MUTATING:
            return
        if exc is None:
            result = "OK"
        elif isinstance(exc, FornaxError):
            result = f"{exc.code.name}:{exc.reason}"
        else:
            result = f"INTERNAL:{type(exc).__name__}"
        self._record(method, identity, request, result)

    def _wrap_unary(self, behavior: Callable, method: str) -> Callable:
        async def wrapped(request, context):
            identity = self._admit(method, request, context)
            try:
                response = await behavior(request, context)
            except BaseException as exc:
                self._outcome(method, identity, request, exc)
                raise
            self._outcome(method, identity, request, None)
            return response

        return wrapped

    def _wrap_stream(self, behavior: Callable, method: str) -> Callable:
        async def wrapped(request, context):
            identity = self._admit(method, request, context)
            try:
                async for item in behavior(request, context):
                    yield item
            except BaseException as exc:
                self._outcome(method, identity, request, exc)
                raise
            self._outcome(method, identity, request, None)

        return wrapped
