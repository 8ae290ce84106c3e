"""Checkpoint and build errors of the artifact builder, each with its own stable reason."""

from __future__ import annotations

from libs.service.errors import FailedPrecondition, Internal, InvalidArgument, NotFound


class CheckpointNotFoundError(NotFound):
    default_reason = "CHECKPOINT_NOT_FOUND"


class CheckpointConfigError(FailedPrecondition):
    default_reason = "CHECKPOINT_CONFIG_INVALID"


class CheckpointFileMissingError(FailedPrecondition):
    """tokenizer.json, the chat template or the weights are absent."""

    default_reason = "CHECKPOINT_FILE_MISSING"


class ShardMissingError(FailedPrecondition):
    """A numbered shard series ("-00002-of-00003") has a gap on disk."""

    default_reason = "CHECKPOINT_SHARD_MISSING"


class IndexMissingFileError(FailedPrecondition):
    """The weight index maps a tensor to a file that does not exist."""

    default_reason = "CHECKPOINT_INDEX_MISSING_FILE"


class IndexInvalidError(FailedPrecondition):
    """The weight index is malformed or disagrees with the shard headers."""

    default_reason = "CHECKPOINT_INDEX_INVALID"


class ShardInvalidError(FailedPrecondition):
    """A shard's safetensors header is malformed, truncated or duplicates a tensor."""

    default_reason = "CHECKPOINT_SHARD_INVALID"


class CheckpointChangedError(FailedPrecondition):
    """A shard changed on disk between inspection and the end of a build."""

    default_reason = "CHECKPOINT_CHANGED"


class TensorLayoutError(FailedPrecondition):
    """The tensors disagree with the architecture the config implies.

    The reason names the first problem kind: CHECKPOINT_TENSOR_MISSING, _UNEXPECTED,
    _WRONG_SHAPE or _WRONG_DTYPE.
    """

    default_reason = "CHECKPOINT_TENSOR_LAYOUT"


class PlanInvalidError(InvalidArgument):
    default_reason = "PLAN_INVALID"


class OutputDirError(FailedPrecondition):
    default_reason = "ARTIFACT_OUTPUT_DIR"


class UnionMismatchError(Internal):
    """The stages do not add up to the checkpoint plus the declared tied copy."""

    default_reason = "ARTIFACT_UNION_MISMATCH"
