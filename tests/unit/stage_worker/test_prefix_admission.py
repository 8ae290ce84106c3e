"""A stage keys prefix blocks only by hashes it computes from the tokens it is sent: any chain
that differs (forged, truncated, repeated, reordered) is refused with PREFIX_CHAIN."""

import random

import pytest

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.model.kv_blocks import KV_BLOCK_TOKENS as B
from libs.model.kv_blocks import prefix_chain
from libs.service.errors import InvalidArgument
from services.stage_worker.convert import admission_from_pb, publish_chain_from_pb


def request(salt=b"s", tokens=(), hashes=None, reserve=4096):
    tokens = list(tokens)
    hashes = prefix_chain(salt, tokens) if hashes is None else hashes
    return pb.AdmitSequenceRequest(target_request_id="r", execution_lease_id="l", reserve_tokens=reserve,
                                   prefix_salt=salt, prefix_token_ids=tokens, prefix_block_hashes=hashes)


def test_an_honest_chain_is_the_stages_own_and_the_reservation_is_whole_blocks():
    tokens = list(range(2 * B + 3))
    admission = admission_from_pb(request(tokens=tokens, reserve=3 * B + 1), block_bytes=100)
    assert admission.prefix_chain == tuple(prefix_chain(b"s", tokens))
    assert admission.reserve_bytes == 4 * 100
    assert admission_from_pb(request(salt=b"", hashes=[]), 100).prefix_chain == ()


def test_a_release_hashes_the_tokens_to_publish_with_the_admissions_salt_only():
    admission = admission_from_pb(request(salt=b"tenant-a", tokens=range(B)), 100)
    assert admission.prefix_salt == b"tenant-a"
    release = pb.ReleaseRequestRequest(target_request_id="r", publish_token_ids=range(3 * B))
    assert publish_chain_from_pb(release, admission.prefix_salt) == tuple(prefix_chain(b"tenant-a", range(3 * B)))
    assert publish_chain_from_pb(pb.ReleaseRequestRequest(target_request_id="r"), b"tenant-a") == ()
    with pytest.raises(InvalidArgument) as err:  # a lease admitted without a salt publishes nothing
        publish_chain_from_pb(release, admission_from_pb(request(salt=b"", hashes=[]), 100).prefix_salt)
    assert err.value.reason == "PREFIX_CHAIN"


def test_forged_chains_are_refused_fuzz():
    rng = random.Random(7)
    honest = [rng.randrange(0, 1000) for _ in range(8 * B)]
    other = [rng.randrange(0, 1000) for _ in range(8 * B)]
    for _ in range(300):
        n = rng.randrange(0, 8 * B + 1)
        tokens = honest[:n]
        good = prefix_chain(b"s", tokens)
        forged_options = [
            prefix_chain(b"s", other[:n]),                     # another prompt's chain
            prefix_chain(b"other-tenant", tokens),            # another tenant's chain
            good[:-1] if good else [b"\x00" * 32],            # truncated (or invented)
            good + [rng.randbytes(32)],                       # one too many
            [good[0]] * len(good) if len(good) > 1 else [rng.randbytes(32)],  # repeated
            [rng.randbytes(rng.randrange(0, 40)) for _ in good] or [b""],     # random bytes
        ]
        forged = rng.choice(forged_options)
        if forged == good:
            continue
        with pytest.raises(InvalidArgument) as err:
            admission_from_pb(request(tokens=tokens, hashes=forged), 100)
        assert err.value.reason == "PREFIX_CHAIN"


def test_hashes_without_a_salt_and_more_tokens_than_reserved_are_refused():
    with pytest.raises(InvalidArgument) as err:
        admission_from_pb(request(salt=b"", tokens=range(B), hashes=[b"x" * 32]), 100)
    assert err.value.reason == "PREFIX_CHAIN"
    with pytest.raises(InvalidArgument) as err:
        admission_from_pb(request(tokens=range(2 * B), reserve=B), 100)
    assert err.value.reason == "PREFIX_CHAIN"


def test_fornax_status_shows_a_loaded_stages_kv_in_blocks():
    from apps.fleet.route_status import RouteReport, kv_summary

    reply = pb.GetHealthResponse(kv_block_tokens=B, kv_blocks_total=64, kv_blocks_free=60, kv_blocks_cached=3,
                                 prefix_hit_blocks=6, prefix_missed_blocks=2, kv_evicted_blocks=1)
    text = kv_summary(reply)
    assert text == f"60/64 blocks free of {B} tokens (3 cached, 1 evicted), prefix hit rate 75.0% (6/8 blocks)"
    assert kv_summary(pb.GetHealthResponse()) == ""  # nothing loaded: no KV line
    report = RouteReport("SERVING", "", {"stage_worker_0": "READY"}, stage_kv={"stage_worker_0": text})
    assert report.render().splitlines()[-1] == f"kv: stage_worker_0 {text}"
