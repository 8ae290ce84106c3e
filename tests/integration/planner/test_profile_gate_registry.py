"""The deployment gate against a real registry holding signed physical profile records."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import replace

import pytest

from apps.bench.planner import ALL_OPERATIONS, synthetic_config
from apps.cli.main import main
from libs.profiles.schema import LABEL_PASSED, LABEL_ROUTE_KEY, to_json
from services.evidence_registry.client import RegistryClient
from services.evidence_registry.domain import RecordType, ValidityWindow
from services.planner import domain as d
from services.planner.inventory import Target
from services.planner.model import describe_checkpoint
from services.planner.planner import DeploymentRefused, plan_with_records
from services.planner.profile_source import fetch_profile_records
from services.planner.registry import RegistryResolver
from tests.integration.evidence_registry.harness import signed, start_registry
from tests.unit.evidence_registry.factories import PHYSICAL_PROVENANCE, physical
from tests.unit.planner.factories import full_mesh, node, tiny_model
from tests.unit.planner.profile_factories import calibration, link_profile, link_record, stage_profile, stage_record

pytestmark = pytest.mark.integration

MODEL = tiny_model(layers=12)
TARGET = Target(context_tokens=512, concurrency=4, min_stages=2, max_stages=2, prefill_tokens=64)
DEPLOY = replace(TARGET, mode="deployment")
INVENTORY = full_mesh(node("a"), node("b"))
HOUR_NS = 3600 * 10**9


def _put(client: RegistryClient, data, record, *, type=RecordType.MEASUREMENT, until_ns: int = 0) -> str:
    now = time.time_ns()
    content = physical(type, labels=tuple(sorted(record.labels)), subject=record.record_id,
                       validity=ValidityWindow(now - HOUR_NS, until_ns or now + HOUR_NS),
                       provenance=dataclasses.replace(PHYSICAL_PROVENANCE, model_snapshot=MODEL.model_snapshot,
                                                      command="fornax profile"))
    return client.put_record(signed(data, content, record.blob), record.blob).record_id


def _now_profiles():
    now = time.time_ns()
    a = stage_profile("a", MODEL.model_snapshot, layer_s=1e-3, measured=now - HOUR_NS)
    b = stage_profile("b", MODEL.model_snapshot, layer_s=3e-3, measured=now - HOUR_NS)
    return stage_record(a), stage_record(b), link_record(link_profile("a", "b", measured=now - HOUR_NS))


def test_deployment_gate_on_signed_registry_records(tmp_path):
    data = tmp_path / "data"
    proc, address = start_registry(data, tmp_path / "run")
    try:
        resolver = RegistryResolver(address)
        with RegistryClient(address) as client:
            ids = [_put(client, data, r) for r in _now_profiles()]
            records = fetch_profile_records(address)
            assert sorted(r.record_id for r in records) == sorted(ids)
            explored = plan_with_records(MODEL, INVENTORY, TARGET, resolver, records).plan
            assert set(explored.evidence_ids) == set(ids) and explored.declared_terms == 0
            assert [s.host for s in explored.stages] == ["a", "b"]
            assert explored.stages[1].layer_end - explored.stages[1].layer_start < 6

            with pytest.raises(DeploymentRefused) as before:
                plan_with_records(MODEL, INVENTORY, DEPLOY, resolver, records)
            assert before.value.reason == d.MISSING_CALIBRATION and explored.route_key in before.value.message

            passing = calibration(explored.route_key)
            cal_blob = to_json(dataclasses.replace(passing, measured_unix_ns=time.time_ns()))
            cal = dataclasses.replace(stage_record(stage_profile("x", "s")), record_id="c", record_type="calibration",
                                      blob=cal_blob, labels=((LABEL_PASSED, "true"),
                                                             (LABEL_ROUTE_KEY, explored.route_key)))
            cal_id = _put(client, data, cal, type=RecordType.CALIBRATION)
            deployed = plan_with_records(MODEL, INVENTORY, DEPLOY, resolver, fetch_profile_records(address)).plan
            assert deployed.mode == "deployment" and deployed.calibration_id == cal_id
            assert deployed.route_key == explored.route_key

            # A newer profile of b whose registry window has closed: refused, naming that record.
            _, b, _ = _now_profiles()
            stale = dataclasses.replace(b, blob=to_json(dataclasses.replace(
                stage_profile("b", MODEL.model_snapshot, layer_s=3e-3, measured=time.time_ns()))))
            stale_id = _put(client, data, stale, until_ns=time.time_ns() + 10**9)
            time.sleep(1.2)
            with pytest.raises(DeploymentRefused) as expired:
                plan_with_records(MODEL, INVENTORY, DEPLOY, resolver, fetch_profile_records(address))
            assert expired.value.reason == d.PROFILE_EXPIRED and stale_id in expired.value.message

            client.revoke_record(stale_id, "superseded")
            client.revoke_record(ids[1], "host b replaced")
            with pytest.raises(DeploymentRefused) as gone:
                plan_with_records(MODEL, INVENTORY, DEPLOY, resolver, fetch_profile_records(address))
            assert gone.value.reason == d.MISSING_PROFILE and "host b" in gone.value.message
    finally:
        proc.stop()


def _inventory_yaml(path) -> str:
    path.write_text(
        "nodes:\n" + "".join(
            f"  - {{name: {n}, host: {n}, backend: max, memory: 64GiB, compute: 100TFLOP/s, "
            f"memory_bandwidth: 1TB/s, dtypes: [bf16, fp32], operations: [{', '.join(ALL_OPERATIONS)}]}}\n"
            for n in ("a", "b"))
        + "links:\n  - {between: [a, b], bandwidth: 10Gbit/s, latency: 10us}\n"
        + "target: {context_tokens: 512, concurrency: 4, min_stages: 2, max_stages: 2, prefill_tokens: 64}\n")
    return str(path)


def test_plan_explain_prints_each_term_with_its_evidence(tmp_path, capsys):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(synthetic_config(12, 8, 2, hidden=256, moe_intermediate=128,
                                                                        vocab=1024)))
    snapshot = describe_checkpoint(checkpoint).model_snapshot
    inventory = _inventory_yaml(tmp_path / "inventory.yaml")
    data = tmp_path / "data"
    proc, address = start_registry(data, tmp_path / "run")
    try:
        now = time.time_ns()
        with RegistryClient(address) as client:
            a_id = _put(client, data, stage_record(stage_profile("a", snapshot, measured=now - HOUR_NS)))
            b_id = _put(client, data, stage_record(stage_profile("b", snapshot, layer_s=3e-3, measured=now - HOUR_NS)))
        argv = ["plan", "--checkpoint", str(checkpoint), "--inventory", inventory, "--profiles", "--registry",
                address, "--state-dir", str(tmp_path / "no-fleet"), "--explain"]
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert f"physical (prediction from layer profiles; measurement records {a_id})" in out
        assert f"physical (prediction from layer profiles; measurement records {b_id})" in out
        for term in ("compute", "pack", "wire", "unpack", "memory"):
            assert f"  {term} " in out
        assert "declared, exploratory" in out  # no link profile yet: the wire term is declared
        assert "decode_tokens_per_s" in out and "(prediction)" in out
        assert " on a@a (max)" in out and " on b@b (max)" in out

        assert main([*argv[:-1], "--mode", "deployment"]) == 2
        err = capsys.readouterr().err
        assert "error MISSING_PROFILE" in err and ("link a->b" in err or "link b->a" in err)
        assert "MISSING_CALIBRATION route " in err
    finally:
        proc.stop()
