"""Prefix-cache salts: which requests may share KV blocks.

A stage reuses a block only for a request whose salt (with the prompt's tokens) hashes to the
block's prefix hash, so the salt decides who shares. It always names the model snapshot and
the tokenizer (KV of one model is meaningless to another). Under `tenant`, the default, it
also names the caller's credential (a hash of its bearer token, or its absence), so one
tenant can never observe another's prompts through a cache hit's shorter time to first
token. A request's own `cache_salt` is added under both `tenant` and `global`. `off` sends
no salt: no request reuses or publishes a prefix.
"""

from __future__ import annotations

import enum
import hashlib

from libs.service.errors import InvalidArgument

MAX_CACHE_SALT_CHARS = 256


class PrefixPolicy(enum.Enum):
    OFF = "off"
    TENANT = "tenant"
    GLOBAL = "global"

    @classmethod
    def parse(cls, text: str) -> PrefixPolicy:
        try:
            return cls(text)
        except ValueError:
            raise InvalidArgument(f"prefix cache policy {text!r} is not one of off, tenant, global",
                                  reason="INVALID_PREFIX_CACHE", field="prefix_cache") from None


def tenant_of(authorization: str | None) -> str:
    """The tenant a request's credential names: a hash of its bearer token, never the token."""
    if not authorization:
        return "anonymous"
    return "key:" + hashlib.sha256(authorization.encode()).hexdigest()


def cache_salt_of(body: dict) -> str | None:
    value = body.get("cache_salt")
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_CACHE_SALT_CHARS:
        raise InvalidArgument(f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT_CHARS} "
                              "characters", reason="INVALID_CACHE_SALT", field="cache_salt")
    return value


def prefix_salt(policy: PrefixPolicy, model_snapshot: str, tokenizer_sha256: str, tenant: str,
                cache_salt: str | None = None) -> bytes | None:
    """The salt a request's prefix chain is hashed with; None when the policy is off."""
    if policy is PrefixPolicy.OFF:
        return None
    parts = ["fornax.prefix-salt.v1", model_snapshot, tokenizer_sha256,
             tenant if policy is PrefixPolicy.TENANT else "*", cache_salt or ""]
    return hashlib.sha256("\x00".join(parts).encode()).digest()
