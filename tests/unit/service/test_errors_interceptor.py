"""The single interceptor maps FornaxError to status + reason, anything else to INTERNAL."""

from __future__ import annotations

import asyncio
import errno

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from libs.service.errors import FornaxError, InvalidArgument, ResourceExhausted, describe_failure
from libs.service.interceptors import ErrorInterceptor, reason_of

METHOD = "/test.v1.TestService/Do"


def _raising(exc: Exception):
    async def handler(request: bytes, context) -> bytes:
        raise exc

    return grpc.method_handlers_generic_handler(
        "test.v1.TestService", {"Do": grpc.unary_unary_rpc_method_handler(handler)}
    )


async def _call(exc: Exception) -> grpc.aio.AioRpcError:
    server = grpc.aio.server(interceptors=[ErrorInterceptor("test")])
    server.add_generic_rpc_handlers((_raising(exc),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(METHOD)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(b"", timeout=10)
            return caught.value
    finally:
        await server.stop(None)


def _error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    proto = rpc_status.from_call(error)
    info = error_details_pb2.ErrorInfo()
    assert proto is not None and proto.details[0].Unpack(info)
    return info


def test_fornax_error_keeps_code_reason_and_field():
    error = asyncio.run(_call(InvalidArgument("top_k must be >= 0", reason="BAD_TOP_K", field="top_k")))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_k must be >= 0" in error.details()
    info = _error_info(error)
    assert (info.reason, info.domain, info.metadata["field"]) == ("BAD_TOP_K", "fornax", "top_k")
    assert reason_of(error) == "BAD_TOP_K"


def test_default_reason_comes_from_the_class():
    error = asyncio.run(_call(ResourceExhausted("queue full")))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason_of(error) == "CAPACITY"


def test_unexpected_exception_becomes_internal_without_leaking_details():
    error = asyncio.run(_call(KeyError("secret-internal-key")))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert reason_of(error) == "INTERNAL"
    assert "secret-internal-key" not in error.details()


def test_a_full_disk_is_resource_exhausted_with_its_own_reason():
    error = asyncio.run(_call(OSError(errno.ENOSPC, "No space left on device")))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason_of(error) == "DISK_FULL"
    assert "disk is full (No space left on device)" in error.details() and "Do:" in error.details()
    other = asyncio.run(_call(OSError(errno.EACCES, "Permission denied")))
    assert other.code() == grpc.StatusCode.INTERNAL and reason_of(other) == "INTERNAL"


def test_reason_codes_must_be_upper_snake():
    with pytest.raises(ValueError):
        FornaxError("x", reason="not upper")


def test_a_failure_reads_as_one_line_whatever_raised_it():
    assert describe_failure(InvalidArgument("bad top_k", reason="BAD_TOP_K")) == "BAD_TOP_K: bad top_k"
    remote = asyncio.run(_call(OSError(errno.ENOSPC, "No space left on device")))
    line = describe_failure(remote)
    assert line.startswith("RESOURCE_EXHAUSTED: DISK_FULL: Do: the service's disk is full")
    assert "AioRpcError" not in line and "\n" not in line
    assert describe_failure(KeyError("k")) == "KeyError: 'k'"
