"""Model-layer errors: service-hierarchy subclasses with stable UPPER_SNAKE reasons."""

from __future__ import annotations

from libs.service.errors import (
    FailedPrecondition,
    FornaxError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)


class ModelError(FornaxError):
    default_reason = "MODEL_ERROR"


class ConfigError(ModelError, InvalidArgument):
    default_reason = "MODEL_CONFIG"


class CheckpointError(ModelError, FailedPrecondition):
    default_reason = "CHECKPOINT"


class BackendUnavailableError(ModelError, Unavailable):
    default_reason = "BACKEND_UNAVAILABLE"


class KvLimitExceededError(ModelError, ResourceExhausted):
    default_reason = "KV_LIMIT"


class KvEpochError(ModelError, FailedPrecondition):
    """A slice's (sequence_no, position, kv_epoch) does not follow the lease's state."""

    default_reason = "STALE_KV"


class UnknownSequenceError(ModelError, NotFound):
    default_reason = "UNKNOWN_LEASE"


class ReleasedSequenceError(ModelError, FailedPrecondition):
    default_reason = "RELEASED"


class BatchError(ModelError, InvalidArgument):
    default_reason = "BAD_BATCH"


class MojoKernelsError(ModelError, FailedPrecondition):
    """The Mojo custom-op package cannot be built or is not whole."""

    default_reason = "MOJO_KERNELS"
