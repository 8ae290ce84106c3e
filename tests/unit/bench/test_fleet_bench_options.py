"""`fornax bench serve --fleet`: what it refuses before anything starts, each host's weight policy,
when the float32 agreement reference is skipped, and the report assembled from recorded figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.bench import cli
from apps.bench.fleet_serve import (
    FleetBenchOptions,
    FleetBenchRefused,
    check_options,
    fleet_report,
    host_weights,
    reference_refusal,
)
from apps.cli.main import main
from apps.fleet.spec import parse_fleet_spec

REPO = Path(__file__).resolve().parents[3]
GIB = 2**30


def _spec(alpha_weights: str | None = None):
    def host(name: str, weights: str | None) -> dict:
        return {"name": name, "backend": "numpy", "cpu_cores": 0.5, "memory_limit": "1GiB",
                "link": {"rate": "1Gbit/s"}, **({"weights": weights} if weights else {})}

    raw = {"version": 1, "control_host": "alpha", "hosts": [host("alpha", alpha_weights), host("beta", None)]}
    return parse_fleet_spec(raw, "0" * 64)


def test_a_host_keeps_its_own_weights_and_the_others_take_the_flag():
    options = FleetBenchOptions("f.yaml", _spec(alpha_weights="q8_0"), "ckpt", weights="q4_k_m")
    assert host_weights(options) == {"alpha": {"policy": "q8_0", "from": "the fleet file's weights:"},
                                     "beta": {"policy": "q4_k_m", "from": "--weights q4_k_m"}}
    assert host_weights(FleetBenchOptions("f.yaml", _spec(), "ckpt"))["beta"]["policy"] == "fp32"


def test_an_unknown_policy_and_a_gguf_checkpoint_are_refused(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    check_options(FleetBenchOptions("f.yaml", _spec(), str(tmp_path / "ckpt"), weights="q4_k_m"))  # accepted
    with pytest.raises(FleetBenchRefused) as caught:
        check_options(FleetBenchOptions("f.yaml", _spec(), str(tmp_path / "ckpt"), weights="q3_k"))
    assert caught.value.reason == "UNKNOWN_WEIGHT_POLICY"
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(FleetBenchRefused) as caught:
        check_options(FleetBenchOptions("f.yaml", _spec(), str(gguf)))
    assert caught.value.reason == "FLEET_BENCH_NEEDS_CHECKPOINT_DIR"


def test_the_float32_reference_is_skipped_with_the_bytes_when_it_does_not_fit():
    assert reference_refusal(GIB, 2 * GIB) is None
    lite = reference_refusal(63 * GIB, 12 * GIB)  # DeepSeek-V2-Lite in float32 on a 24 GiB box
    assert lite.startswith("REFERENCE_DOES_NOT_FIT") and "78.8 GiB" in lite and "12.0 GiB" in lite


def test_the_report_carries_levels_memory_ratios_and_the_peer():
    levels = {"c1": {"output_tokens_per_s": 2.0, "pipeline": {"pipeline_efficiency": 0.5}},
              "c4": {"output_tokens_per_s": 6.0, "pipeline": None}}
    memory = {"alpha": {"peak_rss_vs_limit": {"cgroup_peak": 0.8}}, "beta": {"peak_rss_vs_limit": None}}
    report = fleet_report(levels, {"top1_agreement": 1.0}, memory, {"vs_llama_cpp_c1": 0.5}, {"command": "x"})
    assert report["pipeline_efficiency_c1"] == 0.5 and "pipeline_efficiency_c4" not in report
    assert report["peak_rss_vs_limit"] == {"alpha": {"cgroup_peak": 0.8}, "beta": None}
    assert report["hosts_memory"] is memory and report["vs_llama_cpp_c1"] == 0.5
    assert "llama_cpp" not in fleet_report(levels, {}, {}, {}, {})


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(cli, "_quiet_logs", lambda: None)  # keep structlog off the captured stderr


FLEET = str(REPO / "fleets" / "two-unlike-hosts.yaml")


@pytest.mark.parametrize("argv,reason", [
    (["--peer", "llama.cpp"], "PEER_ARGS_MISSING"),
    (["--llama-server", "x"], "PEER_ARGS_WITHOUT_PEER"),
    (["--peer", "llama.cpp", "--llama-server", "/nonexistent/llama-server", "--gguf", "x.gguf"],
     "PEER_BINARY_MISSING"),
    (["--peer", "llama.cpp", "--compare-routes"], "PEER_WITH_COMPARE_ROUTES"),
])
def test_the_fleet_bench_refuses_peer_options_before_anything_starts(argv, reason, quiet, capsys):
    assert main(["bench", "serve", "--fleet", FLEET, "--checkpoint", "unused", *argv]) == 2
    assert reason in capsys.readouterr().err


def test_the_fleet_bench_refuses_a_gguf_checkpoint_before_a_fleet_starts(tmp_path, quiet, capsys):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    assert main(["bench", "serve", "--fleet", FLEET, "--checkpoint", str(gguf), "--weights", "q4_k_m"]) == 2
    assert "FLEET_BENCH_NEEDS_CHECKPOINT_DIR" in capsys.readouterr().err
