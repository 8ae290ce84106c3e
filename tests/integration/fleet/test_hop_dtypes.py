"""Per-hop boundary dtypes on a loopback fleet: each stage loads an artifact whose recorded
contract names the hops around it, and the route serves through a bf16 hop then an fp32 hop."""

from __future__ import annotations

import json
import urllib.request

import pytest

from apps.fleet.compose import start_fleet
from apps.fleet.launcher import FleetOptions
from apps.fleet.route_wait import wait_for_route
from libs.artifacts.manifest import decode_manifest
from tests.integration.orchestrator.harness import tiny_checkpoint

pytestmark = pytest.mark.integration


def test_a_route_with_a_bf16_hop_then_an_fp32_hop_serves(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    options = FleetOptions(state_dir=tmp_path / ".fornax", stages=3, backend="numpy", boundary_dtype="fp32",
                           checkpoint=str(checkpoint), env={"FORNAX_HOP_BOUNDARY_DTYPES": "bf16,fp32"})
    state, launcher = start_fleet(options)
    try:
        wait_for_route(state, 300, lambda _: None)
        body = json.dumps({"model": "fornax", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}).encode()
        request = urllib.request.Request(f"{state.api}/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            reply = json.load(response)
    finally:
        launcher.stop_all()
    assert reply["usage"]["completion_tokens"] == 4
    contracts = []
    for index in range(3):
        (manifest_path,) = (tmp_path / ".fornax" / f"stage_worker_{index}" / "artifact_cache" / "artifacts").glob(
            "sha256-*/manifest.json")
        manifest = decode_manifest(manifest_path.read_bytes())
        contracts.append((manifest.boundary_input.dtype, manifest.boundary_output.dtype))
    assert contracts[0][1] == "ELEMENT_TYPE_BF16"
    assert contracts[1] == ("ELEMENT_TYPE_BF16", "ELEMENT_TYPE_FP32")
    assert contracts[2][0] == "ELEMENT_TYPE_FP32"
