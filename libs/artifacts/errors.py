"""Errors raised while reading safetensors files or verifying a stage artifact.

Each class has its own stable UPPER_SNAKE reason; callers match on `reason`, never on text.
Damaged bytes map to DATA_LOSS; an intact artifact built for something else (another plan,
another manifest) maps to FAILED_PRECONDITION.
"""

from __future__ import annotations

from libs.service.errors import DataLoss, FailedPrecondition


class SafetensorsHeaderError(DataLoss):
    default_reason = "SAFETENSORS_HEADER_INVALID"


class SafetensorsTruncatedError(DataLoss):
    default_reason = "SAFETENSORS_TRUNCATED"


class ManifestMissingError(FailedPrecondition):
    default_reason = "ARTIFACT_MANIFEST_MISSING"


class ManifestInvalidError(DataLoss):
    default_reason = "ARTIFACT_MANIFEST_INVALID"


class ManifestHashMismatchError(FailedPrecondition):
    default_reason = "ARTIFACT_MANIFEST_HASH_MISMATCH"


class PlanMismatchError(FailedPrecondition):
    default_reason = "ARTIFACT_PLAN_MISMATCH"


class ArtifactFileMissingError(DataLoss):
    default_reason = "ARTIFACT_FILE_MISSING"


class ArtifactTruncatedError(DataLoss):
    default_reason = "ARTIFACT_TRUNCATED"


class ArtifactSizeMismatchError(DataLoss):
    default_reason = "ARTIFACT_SIZE_MISMATCH"


class ArtifactChecksumMismatchError(DataLoss):
    default_reason = "ARTIFACT_CHECKSUM_MISMATCH"


class ArtifactLayoutMismatchError(DataLoss):
    default_reason = "ARTIFACT_LAYOUT_MISMATCH"


ARTIFACT_ERRORS = (
    SafetensorsHeaderError, SafetensorsTruncatedError, ManifestMissingError, ManifestInvalidError,
    ManifestHashMismatchError, PlanMismatchError, ArtifactFileMissingError, ArtifactTruncatedError,
    ArtifactSizeMismatchError, ArtifactChecksumMismatchError, ArtifactLayoutMismatchError,
)
