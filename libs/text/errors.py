"""Errors raised by the text layer, each with a stable UPPER_SNAKE reason."""

from __future__ import annotations


class TextError(Exception):
    """Base class: `reason` is stable and machine-readable, the message says what and why."""

    reason = "TEXT"


class TokenizerHashMismatch(TextError):
    reason = "TOKENIZER_HASH"


class TemplateHashMismatch(TextError):
    reason = "TEMPLATE_HASH"


class UnsupportedTokenizer(TextError):
    reason = "UNSUPPORTED_TOKENIZER"


class TemplateError(TextError):
    reason = "TEMPLATE"


class TokenIdOutOfRange(TextError):
    reason = "TOKEN_ID_RANGE"
