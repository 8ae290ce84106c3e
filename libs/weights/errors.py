"""Weight-format errors, each with a stable reason code."""

from __future__ import annotations

from libs.service.errors import FailedPrecondition, InvalidArgument


class UnknownWeightFormatError(InvalidArgument):
    default_reason = "WEIGHT_FORMAT_UNKNOWN"


class UnknownWeightPolicyError(InvalidArgument):
    default_reason = "WEIGHT_POLICY_UNKNOWN"


class WeightFormatUnsupportedError(FailedPrecondition):
    """A backend was asked to run a format it has no kernel for; nothing falls back."""

    default_reason = "WEIGHT_FORMAT_UNSUPPORTED"


class WeightBlockInvalidError(FailedPrecondition):
    """Stored blocks no quantizer writes: non-finite scales, or a byte size off the layout."""

    default_reason = "WEIGHT_BLOCK_INVALID"
