"""`fornax qualify` takes fleets whose hops are bf16, all or some (it used to refuse any hop
that was not fp32), and every parity check states which gates applied and why."""

from __future__ import annotations

from pathlib import Path

from apps.qualify.gate import BoundaryParity
from apps.qualify.reference import RouteWeights
from apps.qualify.run import QualifyConfig, QualifyError, _parity_checks, prepare_spec
from libs.common.kinds import DType

REPO = Path(__file__).resolve().parents[3]
HOST = "  - {{name: {}, backend: numpy, device: cpu, cpu_cores: 0.5, memory_limit: 1GiB, link: {{rate: 1Gbit/s}}}}\n"
MIXED = """version: 1
control_host: a
boundary_dtype: bf16
hops: [{boundary_dtype: fp32}, {boundary_dtype: bf16}]
hosts:
""" + "".join(HOST.format(n) for n in "abc")


def _spec(path: Path):
    spec, _ = prepare_spec(QualifyConfig(fleet_file=path, checkpoint=Path("unused")))
    return spec


def test_the_lite_fleets_bf16_hops_are_taken():
    assert _spec(REPO / "fleets" / "lite-three-hosts.yaml").hop_dtypes == (DType.BF16, DType.BF16)


def test_per_hop_dtypes_are_taken(tmp_path):
    (tmp_path / "mixed.yaml").write_text(MIXED)
    assert _spec(tmp_path / "mixed.yaml").hop_dtypes == (DType.FP32, DType.BF16)


def test_a_refusal_carries_its_reason_code():
    err = QualifyError("hops of int32 carry no activations", "HOP_DTYPE_UNSUPPORTED")
    assert err.reason == "HOP_DTYPE_UNSUPPORTED" and str(err).endswith("[HOP_DTYPE_UNSUPPORTED]")
    assert QualifyError("no fleet").reason == "" and str(QualifyError("no fleet")) == "no fleet"


def test_the_parity_checks_open_with_the_gates_that_applied():
    gates = RouteWeights("fp32", ("numpy", "numpy"), (DType.BF16,)).describe_gates()
    boundaries = [BoundaryParity("stage 0 [0,1) hidden after layer 0", 3e-3, 1e-4, gated=False),
                  BoundaryParity("final logits", 0.0, 0.05, "top-1 disagreement")]
    inner, final = _parity_checks(boundaries, gates)
    assert inner.passed and final.passed
    assert inner.detail.startswith("top-1 gates:") and "hop 0>1 carries bf16" in inner.detail
    assert "stated, not gated" in inner.detail and final.detail.startswith(gates)
