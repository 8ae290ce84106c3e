"""Deployment mode end to end: a real evidence-registry process, the planner service over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from dataclasses import replace

from apps.bench.planner import ALL_OPERATIONS, synthetic_config, synthetic_model
from apps.cli.main import main
from fornax.planner.v1 import planner_pb2 as pb
from services.evidence_registry.client import RegistryClient
from services.evidence_registry.domain import EvidenceClass, RecordContent, RecordType, ValidityWindow
from services.planner import convert
from services.planner.inventory import EvidenceRef, Inventory, Target
from tests.integration.evidence_registry.harness import running_registry
from tests.integration.planner.test_planner_service import with_planner
from tests.unit.planner.factories import full_mesh, node

HOUR_NS = 3600 * 10**9


def _put(client: RegistryClient, kind: RecordType, blob: bytes, subject: str, validity=ValidityWindow()):
    content = RecordContent(type=kind, evidence_class=EvidenceClass.REFERENCE, subject=subject, validity=validity)
    return client.put_record(content, blob)


def _request(inventory: Inventory) -> pb.CreatePlanRequest:
    request = pb.CreatePlanRequest(request_id="deploy-1", target=convert.target_to_proto(
        Target(mode="deployment", min_stages=2, max_stages=2, context_tokens=1024, concurrency=4)))
    request.model.CopyFrom(convert.model_to_proto(synthetic_model(6, experts=8, top_k=2, hidden=512, vocab=2048)))
    convert.inventory_to_request(inventory, request)
    return request


def _inventory(model_ref, cap_a, cap_b, route) -> Inventory:
    base = full_mesh(node("a", evidence=(cap_a,)), node("b", evidence=(cap_b,)))
    link = replace(base.links[0], evidence=(route,))
    return Inventory(nodes=base.nodes, links=(link,), model_evidence=(model_ref,))


def _cli_plan(tmp_path, address, model_id, cap_a, cap_b, route) -> tuple[int, str]:
    """`fornax plan` in deployment mode against the registry; returns (exit code, stdout)."""
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir(exist_ok=True)
    (checkpoint / "config.json").write_text(json.dumps(synthetic_config(6, experts=8, top_k=2, hidden=512, vocab=2048)))
    ops = "[" + ", ".join(ALL_OPERATIONS) + "]"
    node = "{{name: {n}, backend: max, memory: 64GiB, compute: 100TFLOP/s, memory_bandwidth: 1TB/s, " \
           "dtypes: [bf16], operations: " + ops + ", evidence: [{{record_id: {r}, type: capability}}]}}"
    inventory = tmp_path / "deploy.yaml"
    inventory.write_text("\n".join([
        f"model_evidence: [{{record_id: {model_id}, type: model}}]",
        "nodes:", "  - " + node.format(n="a", r=cap_a), "  - " + node.format(n="b", r=cap_b),
        f"links: [{{between: [a, b], bandwidth: 10Gbit/s, evidence: [{{record_id: {route}, type: route}}]}}]",
        "target: {mode: deployment, min_stages: 2, max_stages: 2, context_tokens: 1024, concurrency: 4}",
    ]))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["plan", "--checkpoint", str(checkpoint), "--inventory", str(inventory), "--registry", address])
    return rc, out.getvalue()


def test_deployment_mode_through_the_registry(tmp_path):
    now = time.time_ns()
    with running_registry(tmp_path) as address:
        with RegistryClient(address) as client:
            model = _put(client, RecordType.MODEL, b"model facts", "model")
            cap_a = _put(client, RecordType.CAPABILITY, b"node a capabilities", "a")
            cap_b = _put(client, RecordType.CAPABILITY, b"node b capabilities", "b")
            route = _put(client, RecordType.ROUTE, b"route a<->b", "a->b")
            expired = _put(client, RecordType.CAPABILITY, b"old node b", "b",
                           ValidityWindow(now - 2 * HOUR_NS, now - HOUR_NS))
            revoked = _put(client, RecordType.CAPABILITY, b"revoked node b", "b")
            client.revoke_record(revoked.record_id, "figures were wrong")

        def ref(record, kind, sha=""):
            return EvidenceRef(record.record_id, kind, sha)

        good = _inventory(ref(model, "model", "sha256:" + model.blob.sha256_hex), ref(cap_a, "capability"),
                          ref(cap_b, "capability"), ref(route, "route"))
        bad = _inventory(ref(model, "capability"), ref(cap_a, "capability", "sha256:" + "0" * 64),
                         ref(revoked, "capability"), ref(expired, "route"))
        expired_only = _inventory(ref(model, "model"), ref(cap_a, "capability"), ref(expired, "capability"),
                                  ref(route, "route"))

        async def scenario(stub):
            return [await stub.CreatePlan(_request(inv), timeout=60) for inv in (good, bad, expired_only)]

        ok, failing, stale = asyncio.run(with_planner(scenario, registry_addr=address))
        cli_ok = _cli_plan(tmp_path, address, model.record_id, cap_a.record_id, cap_b.record_id, route.record_id)
        cli_revoked = _cli_plan(tmp_path, address, model.record_id, cap_a.record_id, revoked.record_id, route.record_id)

    assert cli_ok[0] == 0 and "deployment: every referenced evidence record resolved" in cli_ok[1]
    assert cli_revoked[0] == 3 and f"evidence {revoked.record_id} (b): REVOKED" in cli_revoked[1]

    assert ok.feasible and ok.plan.mode == pb.PLAN_MODE_DEPLOYMENT and ok.plan.label.startswith("deployment")
    assert not ok.evidence_failures

    assert not failing.feasible and not failing.HasField("plan")
    assert failing.infeasibility_reason == "EVIDENCE_UNRESOLVED"
    reasons = {(f.record_id, f.subject): f.reason for f in failing.evidence_failures}
    assert reasons == {
        (model.record_id, "model"): "WRONG_TYPE",
        (cap_a.record_id, "a"): "HASH_MISMATCH",
        (revoked.record_id, "b"): "REVOKED",
        (expired.record_id, "a->b"): "WRONG_TYPE",
        ("", "model"): "MISSING_EVIDENCE",  # no reference of type model remains
    }
    assert [(f.record_id, f.reason) for f in stale.evidence_failures] == [(expired.record_id, "EXPIRED")]
