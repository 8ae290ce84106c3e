"""`fornax bench serve --fleet FILE --weights POLICY`: one run on the tiny checkpoint through two
memory-limited netns hosts. The host that declares `weights:` keeps it and the other takes the
flag; every host's peak memory is reported against its limit with no OOM kill; each stream
produces exactly the asked-for tokens. With FORNAX_LLAMA_SERVER and FORNAX_LLAMA_CPP_DIR set the
same run adds `--peer llama.cpp` on the tiny GGUF (skipped part otherwise). Asserts the report's
facts, never a speed.

Needs root and namespaces (CI is root); skipped elsewhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration.fleet.netns_routes import NETNS_ONLY, fornax

pytestmark = [*NETNS_ONLY, pytest.mark.slow]

FLEET = """version: 1
control_host: alpha
boundary_dtype: fp32
hosts:
  - {name: alpha, backend: numpy, cpu_cores: 1, memory_limit: 3GiB, link: {rate: 1Gbit/s}}
  - {name: beta, backend: numpy, cpu_cores: 0.5, memory_limit: 2GiB, weights: bf16, link: {rate: 1Gbit/s}}
"""
LLAMA_CPP = os.environ.get("FORNAX_LLAMA_CPP_DIR")
LLAMA_SERVER = os.environ.get("FORNAX_LLAMA_SERVER")


def _peer_args(tmp_path: Path, checkpoint: Path) -> list[str]:
    if not (LLAMA_CPP and LLAMA_SERVER):
        return []
    from apps.bench.gguf_convert import convert

    gguf = convert(Path(LLAMA_CPP), checkpoint, tmp_path / "tiny-f32.gguf")
    return ["--peer", "llama.cpp", "--llama-server", LLAMA_SERVER, "--gguf", str(gguf)]


def test_a_fleet_bench_builds_each_host_in_its_policy_and_reports_memory_against_the_limits(tmp_path, checkpoint):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    peer = _peer_args(tmp_path, checkpoint)
    run = fornax("bench", "serve", "--fleet", str(fleet), "--checkpoint", str(checkpoint), "--weights", "q8_0",
                 "--concurrency", "1,2", "--max-tokens", "4", "--prompt-tokens", "8", *peer, "--json",
                 cwd=tmp_path, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    prov = report["provenance"]
    assert prov["weights"] == {"alpha": {"policy": "q8_0", "from": "--weights q8_0"},
                               "beta": {"policy": "bf16", "from": "the fleet file's weights:"}}
    assert prov["served_stage_weights"] == ["q8_0", "bf16"]
    assert prov["hardware"] and prov["model_snapshot"].startswith("sha256:") and "--weights q8_0" in prov["command"]
    assert report["levels"]["c2"]["output_tokens"] == 8  # ignore_eos: exactly max_tokens per stream
    for stage in report["levels"]["c1"]["stages"].values():
        assert 0 < stage["compute_fraction"] and 0 <= stage["exposed_wait_fraction"] <= 1
    for host, limit in (("alpha", 3 * 2**30), ("beta", 2 * 2**30)):
        memory = report["hosts_memory"][host]
        assert memory["memory_limit_bytes"] == limit and memory["oom_kills"] == 0, memory
        assert memory["rss_samples"] > 0 and memory["stage_worker_anon_rss_peak_bytes"] > 0
        ratios = report["peak_rss_vs_limit"][host]
        assert 0 < ratios["cgroup_peak"] <= 1 and 0 < ratios["stage_worker_anon_rss_peak"] < 1
        if memory["cgroup_peak_source"].startswith("cgroup v1"):  # load and warm-up, read before the reset
            assert memory["cgroup_peak_before_window_bytes"] > 0
    if peer:
        assert set(report["llama_cpp"]) == {"c1", "c2"} and report["vs_llama_cpp_c2"] > 0
        assert report["greedy_vs_llama_cpp"]["c2"]["streams"] == 2
        assert "llama-server" in report["peer_provenance"] and "whole box" in report["peer_provenance"]
