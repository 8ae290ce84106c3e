"""Prefix-cache salts decide who shares KV blocks; the route reuses whole blocks every stage holds."""

import pytest

from libs.model.kv_blocks import KV_BLOCK_TOKENS as B
from libs.service.errors import InvalidArgument
from services.orchestrator.engine.prefix_salt import PrefixPolicy, cache_salt_of, prefix_salt, tenant_of
from services.orchestrator.route.stage_chain import reusable_tokens


def salt(policy, tenant="t1", cache=None, model="sha256:m", tokenizer="tok"):
    return prefix_salt(policy, model, tokenizer, tenant, cache)


def test_tenant_policy_separates_credentials_and_global_does_not():
    alice, bob = tenant_of("Bearer alice"), tenant_of("Bearer bob")
    assert alice != bob and "alice" not in alice  # the token itself never appears
    assert salt(PrefixPolicy.TENANT, alice) != salt(PrefixPolicy.TENANT, bob)
    assert salt(PrefixPolicy.GLOBAL, alice) == salt(PrefixPolicy.GLOBAL, bob)
    assert salt(PrefixPolicy.OFF) is None
    assert tenant_of(None) == tenant_of("") == "anonymous"


def test_model_tokenizer_and_cache_salt_all_change_the_salt():
    base = salt(PrefixPolicy.GLOBAL)
    assert len({base, salt(PrefixPolicy.GLOBAL, model="sha256:other"),
                salt(PrefixPolicy.GLOBAL, tokenizer="other"),
                salt(PrefixPolicy.GLOBAL, cache="mine")}) == 4
    assert salt(PrefixPolicy.TENANT, cache="x") != salt(PrefixPolicy.TENANT, cache="y")


def test_cache_salt_and_policy_are_validated():
    assert cache_salt_of({}) is None and cache_salt_of({"cache_salt": "s"}) == "s"
    for bad in ("", 7, "x" * 257):
        with pytest.raises(InvalidArgument) as err:
            cache_salt_of({"cache_salt": bad})
        assert err.value.reason == "INVALID_CACHE_SALT"
    with pytest.raises(InvalidArgument) as err:
        PrefixPolicy.parse("sometimes")
    assert err.value.reason == "INVALID_PREFIX_CACHE"


def test_reuse_is_the_minimum_over_stages_in_whole_blocks_and_leaves_a_row_to_prefill():
    assert reusable_tokens([3 * B, 2 * B], 10 * B) == 2 * B
    assert reusable_tokens([3 * B, 3 * B], 3 * B) == 2 * B  # the last prompt token is recomputed
    assert reusable_tokens([3 * B, 3 * B], 3 * B + 1) == 3 * B
    assert reusable_tokens([B + 5], 10 * B) == B
    assert reusable_tokens([], 10 * B) == 0 and reusable_tokens([0, 4 * B], 10 * B) == 0
