"""Model-layer errors. Each carries a stable UPPER_SNAKE reason code and the gRPC status
name the service layer maps it to."""

from __future__ import annotations


class ModelError(Exception):
    reason = "MODEL_ERROR"
    grpc_status = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(ModelError):
    reason = "MODEL_CONFIG"
    grpc_status = "INVALID_ARGUMENT"


class CheckpointError(ModelError):
    reason = "CHECKPOINT"
    grpc_status = "FAILED_PRECONDITION"


class BackendUnavailableError(ModelError):
    reason = "BACKEND_UNAVAILABLE"
    grpc_status = "UNAVAILABLE"


class KvLimitExceededError(ModelError):
    reason = "KV_LIMIT"
    grpc_status = "RESOURCE_EXHAUSTED"


class KvEpochError(ModelError):
    reason = "KV_EPOCH"
    grpc_status = "FAILED_PRECONDITION"


class UnknownSequenceError(ModelError):
    reason = "UNKNOWN_SEQUENCE"
    grpc_status = "NOT_FOUND"


class BatchError(ModelError):
    reason = "BAD_BATCH"
    grpc_status = "INVALID_ARGUMENT"
