"""gRPC health checks (grpc.health.v1) against fleet members."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libs.service.channels import open_channel


def check_health(address: str, service: str = "", timeout_s: float = 2.0) -> str:
    """Health status name (SERVING, NOT_SERVING, ...) or UNREACHABLE."""
    with open_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            return "UNREACHABLE" if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else code.name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
