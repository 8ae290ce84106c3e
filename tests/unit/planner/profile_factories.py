"""Builders of stage/link profiles, calibrations and their registry-shaped records for planner tests."""

from __future__ import annotations

from libs.profiles.schema import (
    LABEL_FROM_HOST,
    LABEL_HOST,
    LABEL_PASSED,
    LABEL_PROFILE,
    LABEL_ROUTE_KEY,
    LABEL_TO_HOST,
    Calibration,
    Figure,
    HostFacts,
    LayerKindProfile,
    LinkProfile,
    ResidentSample,
    RuntimeResident,
    StageCalibration,
    StageProfile,
    to_json,
)
from services.planner.profiles import ProfileRecordInput

NOW = 1_800_000_000 * 10**9
DAY_S = 86_400
MIB = 2**20


def fig(value: float, unit: str = "s") -> Figure:
    return Figure(value, value * 0.98, value * 1.02, 3, unit)


def kind(name: str, decode_s_at_1: float, *, resident: int = 4 * MIB, kv: int = 1024) -> LayerKindProfile:
    """Decode grows with rows (1, 8, 32); prefill per token falls a little with S (16, 128, 512)."""
    decode = {1: fig(decode_s_at_1), 8: fig(decode_s_at_1 * 2), 32: fig(decode_s_at_1 * 5)}
    prefill = {16: fig(decode_s_at_1 / 4), 128: fig(decode_s_at_1 / 5), 512: fig(decode_s_at_1 / 6)}
    return LayerKindProfile(name, prefill, decode, resident, 0 if name in ("embed", "head") else kv)


def stage_profile(host: str, snapshot: str, *, backend: str = "max", layer_s: float = 1e-3,
                  kinds=("dense", "moe", "embed", "head"), measured: int = NOW - 3600 * 10**9,
                  valid_for_s: int = DAY_S, step_s: float | None = None,
                  reserve: int | None = 300 * MIB) -> StageProfile:
    """`step_s`: the step overhead at 1 row (doubling at 8, x5 at 32); None: a tenth of `layer_s`;
    0: a profile that predates the step overhead (no figures). `reserve`: the measured runtime
    reserve; None: a profile that predates it."""
    edge = layer_s / 10
    made = tuple(kind(k, edge if k in ("embed", "head") else layer_s) for k in kinds)
    step_1 = layer_s / 10 if step_s is None else step_s
    step = {1: fig(step_1), 8: fig(step_1 * 2), 32: fig(step_1 * 5)} if step_1 else {}
    return StageProfile(HostFacts(host, "Test CPU", 1.0, "0", 8 << 30), f"spiffe://fornax/stage/{host}", backend,
                        f"{backend} test-build", "cpu", snapshot, "bf16", 4096, 1, made,
                        "fornax profile --fleet test.yaml", measured, valid_for_s, step,
                        runtime_resident=None if reserve is None else runtime_resident(reserve))


def runtime_resident(reserve: int) -> RuntimeResident:
    """Two samples whose larger runtime figure (resident less weight pages and KV) is `reserve`."""
    load = ResidentSample("after load of layers [0, 3)", reserve // 2 + 64 * MIB, reserve // 4, 64 * MIB, 0, 0)
    steps = ResidentSample("after the profiled steps of layers [0, 3)", reserve + 112 * MIB, reserve // 2, 64 * MIB,
                           16 * MIB, 32 * MIB)
    return RuntimeResident((load, steps))


def link_profile(a: str, b: str, *, rtt_s: float = 1e-4, bytes_per_s: float = 1e9,
                 measured: int = NOW - 3600 * 10**9, valid_for_s: int = DAY_S) -> LinkProfile:
    return LinkProfile(a, b, fig(rtt_s), fig(bytes_per_s, "B/s"), "fnx2+tls", "fornax profile --fleet test.yaml",
                       measured, valid_for_s)


def calibration(key: str, *, passed: bool = True) -> Calibration:
    stage = StageCalibration(0, "a", 0, 1, 0.01, fig(0.0101))
    measured = fig(0.0102 if passed else 0.05)
    return Calibration(key, "sha256:p", (), (stage,), 0.01, measured, 0.25, 3, (), "fornax qualify --runs 3",
                       NOW - 60 * 10**9, DAY_S)


def stage_record(profile: StageProfile, record_id: str = "") -> ProfileRecordInput:
    return ProfileRecordInput(record_id or f"stage-{profile.host.host}", "measurement", to_json(profile),
                              ((LABEL_PROFILE, "stage"), (LABEL_HOST, profile.host.host)))


def link_record(profile: LinkProfile, record_id: str = "") -> ProfileRecordInput:
    return ProfileRecordInput(record_id or f"link-{profile.from_host}-{profile.to_host}", "measurement",
                              to_json(profile), ((LABEL_PROFILE, "link"), (LABEL_FROM_HOST, profile.from_host),
                                                 (LABEL_TO_HOST, profile.to_host)))


def calibration_record(c: Calibration, record_id: str = "calibration-1") -> ProfileRecordInput:
    return ProfileRecordInput(record_id, "calibration", to_json(c),
                              ((LABEL_ROUTE_KEY, c.route_key), (LABEL_PASSED, "true" if c.passed else "false")))
