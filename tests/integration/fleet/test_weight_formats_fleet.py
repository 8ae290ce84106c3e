"""One route, two weight formats: a loopback fleet whose first worker holds q4_k_m and whose
second holds bf16 (FORNAX_WORKER_WEIGHTS, as a fleet file's per-host `weights:` sets it). Each
stage's artifact records its own policy, /v1/models shows both, and the greedy text through the
`openai` client equals transformers run on the same mixed weights."""

from __future__ import annotations

import openai
import pytest

from apps.fleet.compose import start_fleet
from apps.fleet.launcher import FleetOptions
from apps.fleet.route_wait import wait_for_route
from libs.artifacts.manifest import decode_manifest
from libs.text.context import TextContext
from tests.integration.orchestrator.harness import tiny_checkpoint
from tests.support.dequantized_reference import reference_greedy_of_stages

pytestmark = pytest.mark.integration
PROMPTS = [[5, 17, 42], [9, 8, 7, 6]]
NEW_TOKENS = 8


def test_a_route_mixing_q4_k_m_and_bf16_stages_serves_its_own_reference(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    options = FleetOptions(state_dir=tmp_path / ".fornax", stages=2, backend="numpy", boundary_dtype="fp32",
                           checkpoint=str(checkpoint), env={"FORNAX_WORKER_WEIGHTS": "q4_k_m,bf16"})
    state, launcher = start_fleet(options)
    try:
        wait_for_route(state, 300, lambda _: None)
        api = openai.OpenAI(base_url=state.api, api_key="none", max_retries=0)
        model = api.models.list().data[0]
        served = [api.completions.create(model=model.id, prompt=p, max_tokens=NEW_TOKENS, temperature=0)
                  for p in PROMPTS]
    finally:
        launcher.stop_all()
    stages = []
    for index in range(2):
        (path,) = (tmp_path / ".fornax" / f"stage_worker_{index}" / "artifact_cache" / "artifacts").glob(
            "sha256-*/manifest.json")
        manifest = decode_manifest(path.read_bytes())
        formats = {t.weight_format.format for t in manifest.tensors}
        stages.append((manifest.stage_index, manifest.layers.layer_start, manifest.layers.layer_end,
                       manifest.weights_policy, formats))
    stages.sort()
    assert [s[3] for s in stages] == ["q4_k_m", "bf16"]
    assert stages[0][4] & {"q5_0", "q8_0"} and stages[1][4] == {"bf16", "fp32"}
    assert model.model_extra["fornax"]["execution"]["stage_weights"] == ["q4_k_m", "bf16"]
    expected = reference_greedy_of_stages(checkpoint, [(a, b, p) for _, a, b, p, _ in stages], PROMPTS, NEW_TOKENS)
    tokenizer = TextContext.from_checkpoint(checkpoint).tokenizer
    assert [c.choices[0].text for c in served] == [tokenizer.decode(e) for e in expected]
