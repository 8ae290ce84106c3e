"""Errors raised by the text layer, each with a stable UPPER_SNAKE reason."""

from __future__ import annotations

from libs.service.errors import FailedPrecondition, InvalidArgument


class TokenizerHashMismatch(FailedPrecondition):
    default_reason = "TOKENIZER_HASH"


class TemplateHashMismatch(FailedPrecondition):
    default_reason = "TEMPLATE_HASH"


class UnsupportedTokenizer(FailedPrecondition):
    default_reason = "UNSUPPORTED_TOKENIZER"


class TemplateError(InvalidArgument):
    default_reason = "TEMPLATE"
