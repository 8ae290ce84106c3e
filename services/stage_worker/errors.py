"""Model-layer errors as service errors: same reason code, the matching gRPC status."""

from __future__ import annotations

from libs.model.errors import ModelError
from libs.service import errors as service_errors

_BY_STATUS = {
    "INVALID_ARGUMENT": service_errors.InvalidArgument,
    "FAILED_PRECONDITION": service_errors.FailedPrecondition,
    "NOT_FOUND": service_errors.NotFound,
    "RESOURCE_EXHAUSTED": service_errors.ResourceExhausted,
    "UNAVAILABLE": service_errors.Unavailable,
}


def model_error(exc: ModelError) -> service_errors.FornaxError:
    kind = _BY_STATUS.get(exc.grpc_status, service_errors.Internal)
    return kind(exc.message, reason=exc.reason)
