"""On `tiny`, the in-process staged run (`libs.model.parity.run_ours`) passes each boundary
through its hop's dtype, as a fleet's hop does: with a bf16 hop, the last stage's figures are
exactly those of a hand-run route whose second stage receives the first stage's output rounded
to bf16; the boundary recorded is the first stage's own output, unrounded."""

from __future__ import annotations

import numpy as np
import pytest

from libs.fnx2 import bf16_to_float32, float32_to_bf16
from libs.model.config import load_config
from libs.model.executor import StageBatch
from libs.model.parity import ParityRequest, build_executor, plan_sequences, run_ours, split_layers, step_slices

STEPS = 4


@pytest.fixture(scope="module")
def setup(tiny_checkpoint):
    cfg = load_config(tiny_checkpoint)
    return tiny_checkpoint, cfg, split_layers(cfg.num_hidden_layers, 2), plan_sequences(cfg, STEPS, seed=0)


def _request(checkpoint, hops: tuple[str, ...]) -> ParityRequest:
    return ParityRequest(checkpoint, 2, "numpy", decode_steps=STEPS, hop_dtypes=hops)


def _by_hand(checkpoint, cfg, ranges, plans) -> dict[str, np.ndarray]:
    """Both stages live, stage 1 fed bf16_to_float32(float32_to_bf16(stage 0's hidden))."""
    request = _request(checkpoint, ())
    first, second = build_executor(request, cfg, ranges, 0), build_executor(request, cfg, ranges, 1)
    logits: dict[str, list[np.ndarray]] = {}
    for step in range(STEPS + 1):
        entries = step_slices(plans, step)
        slices = tuple(e[1] for e in entries)
        hidden = first.execute(StageBatch(slices, token_ids=np.concatenate([e[2] for e in entries]),
                                          all_logits=True)).hidden
        out = second.execute(StageBatch(slices, hidden=bf16_to_float32(float32_to_bf16(hidden)), all_logits=True))
        bounds = np.cumsum([0] + [s.input_row_count for s in slices])
        for s, a, b in zip(slices, bounds[:-1], bounds[1:], strict=True):
            logits.setdefault(s.request_id, []).append(out.logits[a:b])
    return {k: np.concatenate(v) for k, v in logits.items()}


def _joined(store: dict[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate(v) for k, v in store.items()}


def test_a_bf16_hop_run_equals_the_bf16_converted_route(setup):
    checkpoint, cfg, ranges, plans = setup
    bf16, _ = run_ours(_request(checkpoint, ("bf16",)), cfg, ranges, plans)
    fp32, _ = run_ours(_request(checkpoint, ("fp32",)), cfg, ranges, plans)
    expected = _by_hand(checkpoint, cfg, ranges, plans)
    got = _joined(bf16.logits)
    assert got.keys() == expected.keys()
    for rid, rows in expected.items():
        assert np.array_equal(got[rid], rows), rid
    # The hop did round: the fp32 hop's logits differ; stage 0's own output is the same in both.
    assert any(not np.array_equal(got[rid], rows) for rid, rows in _joined(fp32.logits).items())
    for rid, rows in _joined(fp32.boundary[0]).items():
        assert np.array_equal(_joined(bf16.boundary[0])[rid], rows)


def test_fp32_hops_change_nothing(setup):
    checkpoint, cfg, ranges, plans = setup
    fp32, _ = run_ours(_request(checkpoint, ("fp32",)), cfg, ranges, plans)
    default, _ = run_ours(_request(checkpoint, ()), cfg, ranges, plans)
    for rid, rows in _joined(default.logits).items():
        assert np.array_equal(_joined(fp32.logits)[rid], rows)
