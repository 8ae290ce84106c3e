"""Client helpers for other services and the CLI: domain values in, domain values out.

    with RegistryClient(address) as registry:
        record = registry.put_record(content, blob)
        outcome = registry.resolve_records([expectation(record.record_id, "model", "sha256:<hex>")])
        for item in outcome.resolutions:   # one per expectation, in order
            item.ok, item.reason_code, item.detail
        require_resolved(outcome)          # or: raise EvidenceUnresolved naming each failure

`AsyncRegistryClient` has the same methods for grpc.aio services. Every registry RPC is
idempotent (puts carry a request id, generated once per call and resent by gRPC on retry), so
the channel retries UNAVAILABLE and RESOURCE_EXHAUSTED with backoff; any error left after that
becomes a `RegistryCallFailed` carrying the server's status code, reason and field.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2, status_pb2

from fornax.common.v1 import common_pb2
from fornax.evidence_registry.v1 import evidence_registry_pb2 as pb
from fornax.evidence_registry.v1 import evidence_registry_pb2_grpc as pb_grpc
from libs.service.channels import ChannelConfig, open_aio_channel, open_channel, rpc_errors_as
from libs.service.errors import FailedPrecondition, FornaxError
from services.evidence_registry import convert
from services.evidence_registry.domain import (
    EvidenceClass,
    Expectation,
    Record,
    RecordContent,
    RecordStatus,
    RecordType,
    ResolveOutcome,
)
from services.evidence_registry.errors import InvalidField
from services.evidence_registry.validation import parse_sha256

FLEET_ENTRY_NAME = "evidence_registry"
REGISTRY_SERVICE = pb.DESCRIPTOR.services_by_name["EvidenceRegistryService"].full_name


@dataclass(frozen=True)
class ClientOptions:
    timeout_s: float = 10.0  # per call, across gRPC's retries
    channel: ChannelConfig = ChannelConfig()


class RegistryCallFailed(FornaxError):
    """A registry RPC failed; keeps the registry's status code, reason and field."""

    def __init__(self, rpc: str, error: grpc.RpcError) -> None:
        code = error.code()
        reason, field = _error_info(error)
        if code is grpc.StatusCode.UNAVAILABLE:
            reason = "REGISTRY_UNAVAILABLE"
        super().__init__(f"evidence registry {rpc}: {error.details()}",
                         reason=reason or f"REGISTRY_{code.name}", field=field)
        self.code = code


class EvidenceUnresolved(FailedPrecondition):
    """Deployment evidence did not resolve; the message names every failing record and reason."""

    def __init__(self, outcome: ResolveOutcome) -> None:
        super().__init__("evidence did not resolve: " + "; ".join(describe_failures(outcome)),
                         reason="EVIDENCE_UNRESOLVED")
        self.outcome = outcome


def expectation(record_id: str, record_type: str | RecordType, sha256: str = "") -> Expectation:
    """An expectation from plain values: a type name ("model", ...) and an optional "sha256:<hex>"."""
    if not isinstance(record_type, RecordType):
        try:
            record_type = RecordType(record_type)
        except ValueError:
            raise InvalidField("type", "UNKNOWN_RECORD_TYPE",
                               f"{record_type!r} is not one of {[t.value for t in RecordType]}") from None
    return Expectation(record_id, record_type, parse_sha256("sha256", sha256, required=False))


def describe_failures(outcome: ResolveOutcome) -> list[str]:
    return [f"{r.record_id} {r.reason.value if r.reason else 'UNRESOLVED'} ({r.detail})" for r in outcome.failures]


def require_resolved(outcome: ResolveOutcome) -> ResolveOutcome:
    if not outcome.all_ok:
        raise EvidenceUnresolved(outcome)
    return outcome


def _error_info(error: grpc.RpcError) -> tuple[str | None, str | None]:
    for key, value in error.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                return info.reason or None, info.metadata.get("field")
    return None, None


def _put_request(content: RecordContent, blob: bytes, record_id: str, request_id: str | None) -> pb.PutRecordRequest:
    request = pb.PutRecordRequest(request_id=request_id or uuid.uuid4().hex, blob=blob)
    convert.content_to_proto(content, request.record)
    request.record.record_id = record_id
    return request


def _list_request(type: RecordType | None, evidence_class: EvidenceClass | None,
                  status: RecordStatus | None, page_size: int, page_token: str) -> pb.ListRecordsRequest:
    return pb.ListRecordsRequest(
        type=convert.RECORD_TYPES_PB[type] if type else pb.RECORD_TYPE_UNSPECIFIED,
        evidence_class=convert.CLASSES_PB[evidence_class] if evidence_class else common_pb2.EVIDENCE_CLASS_UNSPECIFIED,
        status=convert.STATUSES_PB[status] if status else pb.RECORD_STATUS_UNSPECIFIED,
        page_size=page_size, page_token=page_token,
    )


def _failed(rpc: str):
    return rpc_errors_as(lambda error: RegistryCallFailed(rpc, error))


def _revoke_request(record_id: str, reason: str, request_id: str | None) -> pb.RevokeRecordRequest:
    return pb.RevokeRecordRequest(record_id=record_id, reason=reason, request_id=request_id or uuid.uuid4().hex)


class RegistryClient:
    """Blocking client; one channel, closed by `close()` or the context manager."""

    def __init__(self, address: str, options: ClientOptions = ClientOptions()) -> None:
        self.address = address
        self._options = options
        self._channel = open_channel(address, options.channel, idempotent=(REGISTRY_SERVICE,))
        self._stub = pb_grpc.EvidenceRegistryServiceStub(self._channel)

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def put_record(self, content: RecordContent, blob: bytes, *, record_id: str = "",
                   request_id: str | None = None) -> Record:
        request = _put_request(content, blob, record_id, request_id)
        with _failed("PutRecord"):
            response = self._stub.PutRecord(request, timeout=self._options.timeout_s)
        return convert.record_from_proto(response.record)

    def get_record(self, record_id: str, include_blob: bool = False) -> tuple[Record, bytes | None]:
        request = pb.GetRecordRequest(record_id=record_id, include_blob=include_blob)
        with _failed("GetRecord"):
            response = self._stub.GetRecord(request, timeout=self._options.timeout_s)
        return convert.record_from_proto(response.record), (response.blob if include_blob else None)

    def list_records(self, type: RecordType | None = None, evidence_class: EvidenceClass | None = None,
                     status: RecordStatus | None = None, page_size: int = 0,
                     page_token: str = "") -> tuple[tuple[Record, ...], str]:
        request = _list_request(type, evidence_class, status, page_size, page_token)
        with _failed("ListRecords"):
            response = self._stub.ListRecords(request, timeout=self._options.timeout_s)
        return convert.list_page_from_proto(response)

    def iter_records(self, **filters) -> Iterator[Record]:
        token = ""
        while True:
            records, token = self.list_records(page_token=token, **filters)
            yield from records
            if not token:
                return

    def revoke_record(self, record_id: str, reason: str, request_id: str | None = None) -> Record:
        request = _revoke_request(record_id, reason, request_id)
        with _failed("RevokeRecord"):
            response = self._stub.RevokeRecord(request, timeout=self._options.timeout_s)
        return convert.record_from_proto(response.record)

    def resolve_records(self, expectations: Iterable[Expectation], at_unix_ns: int = 0) -> ResolveOutcome:
        request = convert.expectations_to_proto(tuple(expectations), at_unix_ns)
        with _failed("ResolveRecords"):
            response = self._stub.ResolveRecords(request, timeout=self._options.timeout_s)
        return convert.resolve_outcome_from_proto(response)


class AsyncRegistryClient:
    """grpc.aio client with the same methods as `RegistryClient` (awaitable)."""

    def __init__(self, address: str, options: ClientOptions = ClientOptions()) -> None:
        self.address = address
        self._options = options
        self._channel = open_aio_channel(address, options.channel, idempotent=(REGISTRY_SERVICE,))
        self._stub = pb_grpc.EvidenceRegistryServiceStub(self._channel)

    async def __aenter__(self) -> AsyncRegistryClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def put_record(self, content: RecordContent, blob: bytes, *, record_id: str = "",
                         request_id: str | None = None) -> Record:
        request = _put_request(content, blob, record_id, request_id)
        with _failed("PutRecord"):
            response = await self._stub.PutRecord(request, timeout=self._options.timeout_s)
        return convert.record_from_proto(response.record)

    async def get_record(self, record_id: str, include_blob: bool = False) -> tuple[Record, bytes | None]:
        request = pb.GetRecordRequest(record_id=record_id, include_blob=include_blob)
        with _failed("GetRecord"):
            response = await self._stub.GetRecord(request, timeout=self._options.timeout_s)
        return convert.record_from_proto(response.record), (response.blob if include_blob else None)

    async def revoke_record(self, record_id: str, reason: str, request_id: str | None = None) -> Record:
        request = _revoke_request(record_id, reason, request_id)
        with _failed("RevokeRecord"):
            response = await self._stub.RevokeRecord(request, timeout=self._options.timeout_s)
        return convert.record_from_proto(response.record)

    async def resolve_records(self, expectations: Iterable[Expectation], at_unix_ns: int = 0) -> ResolveOutcome:
        request = convert.expectations_to_proto(tuple(expectations), at_unix_ns)
        with _failed("ResolveRecords"):
            response = await self._stub.ResolveRecords(request, timeout=self._options.timeout_s)
        return convert.resolve_outcome_from_proto(response)


def put_record(address: str, content: RecordContent, blob: bytes, *, record_id: str = "",
               request_id: str | None = None) -> Record:
    """One-shot put (opens and closes a channel)."""
    with RegistryClient(address) as client:
        return client.put_record(content, blob, record_id=record_id, request_id=request_id)


def resolve_records(address: str, expectations: Iterable[Expectation], at_unix_ns: int = 0) -> ResolveOutcome:
    """One-shot resolve (opens and closes a channel)."""
    with RegistryClient(address) as client:
        return client.resolve_records(expectations, at_unix_ns)


async def resolve_records_async(address: str, expectations: Iterable[Expectation],
                                at_unix_ns: int = 0) -> ResolveOutcome:
    async with AsyncRegistryClient(address) as client:
        return await client.resolve_records(expectations, at_unix_ns)


def address_from_fleet(state_dir: str = ".fornax") -> str | None:
    """The registry's gRPC address from a local fleet's fleet.json, or None if there is none."""
    from libs.service.fleet_state import read_fleet

    state = read_fleet(state_dir)
    if state is None:
        return None
    try:
        return state.entry(FLEET_ENTRY_NAME).grpc
    except KeyError:
        return None
