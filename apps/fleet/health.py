"""gRPC health checks (grpc.health.v1) against fleet members."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libs.service.channels import ChannelConfig, ClientCredentials, open_channel


def check_health(address: str, service: str = "", timeout_s: float = 2.0,
                 credentials: ClientCredentials | None = None) -> str:
    """Health status name (SERVING, NOT_SERVING, ...) or UNREACHABLE; mTLS when credentials are given."""
    with open_channel(address, ChannelConfig(credentials=credentials)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            return (
                "UNREACHABLE" if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else code.name
            )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
