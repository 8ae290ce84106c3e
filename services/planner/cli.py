"""`fornax plan` and `fornax bench planner`.

`fornax plan` exits 0 with a feasible plan, 3 when the answer is infeasible (a normal answer,
printed with its reasons) and 2 on an error.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

EXIT_INFEASIBLE = 3
EXIT_ERROR = 2
GIB = float(2**30)


def register(commands, benches) -> None:
    p = commands.add_parser("plan", help="place a checkpoint's layers on an inventory of nodes")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (config.json)")
    p.add_argument("--inventory", required=True, help="inventory YAML (see services/planner/examples)")
    p.add_argument("--mode", choices=("exploratory", "deployment"), help="overrides the file's target.mode")
    p.add_argument("--registry", help="evidence registry address for deployment mode (default: the local fleet's)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run_plan)
    b = benches.add_parser("planner", help="planner speed and brute-force agreement")
    b.add_argument("--json", action="store_true")
    b.add_argument("--instances", type=int, default=200, help="random instances for brute-force agreement")
    b.set_defaults(func=run_bench)


def _resolver(args, mode: str):
    if mode != "deployment":
        return None
    from libs.security.cli_credentials import cli_channel
    from services.evidence_registry.client import ClientOptions, address_from_fleet
    from services.planner.registry import RegistryResolver

    address = args.registry or address_from_fleet()
    return RegistryResolver(address, ClientOptions(channel=cli_channel())) if address else None


def run_plan(args) -> int:
    from libs.model.errors import ModelError
    from libs.service.errors import FornaxError
    from services.planner.inventory import load_inventory_file
    from services.planner.model import describe_checkpoint
    from services.planner.planner import plan

    try:
        model = describe_checkpoint(args.checkpoint)
        loaded = load_inventory_file(args.inventory, mode=args.mode)
        result = plan(model, loaded.inventory, loaded.target, _resolver(args, loaded.target.mode))
    except (FornaxError, ModelError) as exc:
        print(f"error {exc.reason}: {exc.message}" + (f" (field {exc.field})" if getattr(exc, "field", None) else ""),
              file=sys.stderr)
        return EXIT_ERROR
    summary = model_summary(model)
    if args.json:
        body = asdict(result)
        body["model"] = summary
        if result.plan is not None:
            body["plan"]["label"] = result.plan.label
        print(json.dumps(body, indent=2, sort_keys=True))
    else:
        print(f"model {summary['model_snapshot']}: {summary['layers']} layers, "
              f"{summary['weight_bytes'] / GIB:.2f} GiB {summary['weight_dtype']}, {summary['routed_experts']} routed "
              f"experts top-{summary['experts_per_token']} + {summary['shared_experts']} shared; a decode token reads "
              f"{summary['active_weight_bytes_per_token'] / GIB:.3f} GiB of layer weights")
        print("\n".join(format_result(result)))
    return 0 if result.feasible else EXIT_INFEASIBLE


def model_summary(model) -> dict[str, Any]:
    active = sum(x.active_weight_bytes_per_token(model.expert_bytes, model.experts_per_token) for x in model.layers)
    return {
        "model_snapshot": model.model_snapshot, "layers": model.num_layers, "weight_bytes": model.total_weight_bytes,
        "weight_dtype": model.weight_dtype, "routed_experts": model.routed_experts,
        "experts_per_token": model.experts_per_token, "shared_experts": model.shared_experts,
        "active_weight_bytes_per_token": active,
    }


def _stage_rows(result) -> list[str]:
    head = (f"{'stage':>5} {'node':<14} {'layers':<11} {'mem GiB':>8} {'node GiB':>8} "
            f"{'compute_ms':>10} {'pack_us':>8} {'wire_us':>8} {'unpack_us':>9} {'queue_ms':>8} {'wait_ms':>8}")
    rows = [head]
    for s in result.plan.stages:
        c = s.decode
        rows.append(
            f"{s.stage_index:>5} {s.node:<14} {f'[{s.layer_start}, {s.layer_end})':<11} "
            f"{s.memory_bytes / GIB:>8.2f} {s.node_memory_bytes / GIB:>8.2f} {c.compute_s * 1e3:>10.3f} "
            f"{c.pack_s * 1e6:>8.2f} {c.wire_s * 1e6:>8.2f} {c.unpack_s * 1e6:>9.2f} {c.queue_s * 1e3:>8.3f} "
            f"{c.exposed_wait_s * 1e3:>8.3f}")
    return rows


def format_result(result) -> list[str]:
    lines: list[str] = []
    if result.plan is not None:
        p = result.plan
        lines += [f"plan {p.plan_id}  {p.plan_hash}", f"mode {p.label}", f"method {p.method}",
                  "decode cost per microbatch (predictions):"]
        lines += _stage_rows(result)
        lines.append("predictions (cost model, not measurements):")
        lines += [f"  {x.name:<28} {x.value:.6g} {x.unit}" for x in p.predictions]
    else:
        lines.append(f"infeasible [{result.infeasibility_reason}]: {result.infeasibility}")
        if result.shortfall_bytes:
            lines.append(f"shortfall {result.shortfall_bytes / GIB:.3f} GiB ({result.shortfall_bytes:.0f} bytes)")
    for f in result.evidence_failures:
        lines.append(f"evidence {f.record_id or '-'} ({f.subject}): {f.reason} {f.detail}")
    if result.rejections:
        lines.append("rejected:")
        lines += [f"  {r.subject:<24} {r.reason:<22} {r.detail}" for r in result.rejections]
    return lines


TARGETS = {"plan_6x48_s": ("<", 0.05), "plan_64x128_s": ("<", 2.0), "brute_force_agreement": ("==", 1.0)}


def run_bench(args) -> int:
    import os
    import platform

    import numpy

    from libs.service.host import cpu_name
    from services.planner.bench import run_bench as bench

    figures = bench(instances=args.instances)
    evidence = {
        "class": "physical",
        "what": "wall-clock time of the planner itself (best of 3) on this host; no model is executed",
        "hardware": f"{cpu_name() or platform.machine()}, {os.cpu_count()} cpus",
        "build": f"python {platform.python_version()}, numpy {numpy.__version__}",
        "command": "fornax bench planner" + (" --json" if args.json else ""),
    }
    met = {k: (figures[k] < v if op == "<" else figures[k] == v) for k, (op, v) in TARGETS.items()}
    if args.json:
        print(json.dumps({**figures, "targets_met": met, "evidence": evidence}, indent=2, sort_keys=True))
    else:
        for key, value in figures.items():
            target = (
                f"  (target {TARGETS[key][0]} {TARGETS[key][1]}: {'met' if met[key] else 'MISSED'})"
                if key in met
                else ""
            )
            print(f"{key:<34} {value:.6g}{target}")
        print(f"evidence: {evidence['class']}; {evidence['what']}; {evidence['hardware']}; {evidence['build']}")
    return 0 if all(met.values()) else 1
