"""`fornax plan` and `fornax bench planner`.

`fornax plan` plans an inventory file (`--inventory`), a fleet file's hosts before they run
(`--fleet`, with the profiles stored under `--state-dir` when there are any), or the running
fleet of `--state-dir`. It exits 0 with a feasible plan, 3 when the answer is infeasible (a
normal answer, printed with its reasons) and 2 on an error.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apps.fleet.plan_inventory import FleetInventory, FleetWeights, InventoryFigure

EXIT_INFEASIBLE = 3
EXIT_ERROR = 2
GIB = float(2**30)


def register(commands, benches) -> None:
    p = commands.add_parser("plan", help="place a checkpoint's layers on an inventory of nodes")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (config.json), or a deepseek2 .gguf file")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--inventory", help="inventory YAML (see services/planner/examples); without it or --fleet "
                                            "the running fleet of --state-dir is planned from its workers and its "
                                            "registry's profiles")
    source.add_argument("--fleet", help="fleet file (see fleets/): plan its stage hosts from their declared limits, "
                                        "with the profiles stored under --state-dir when there are any")
    p.add_argument("--mode", choices=("exploratory", "deployment"), help="overrides the file's target.mode")
    p.add_argument("--registry", help="evidence registry address for deployment mode (default: the local fleet's)")
    p.add_argument("--profiles", action="store_true",
                   help="with --inventory: plan from the registry's newest stage/link profiles and calibrations")
    p.add_argument("--explain", action="store_true",
                   help="print each stage's terms (compute, pack, wire, unpack, memory) with their evidence")
    p.add_argument("--replan", action="store_true",
                   help="running fleet: propose a placement from the freshest profiles and print how it differs "
                        "from the installed one")
    p.add_argument("--state-dir", default=".fornax",
                   help="the running fleet (fleet.json, operator certificate); with --fleet, where its stored "
                        "profiles are (hosts/<control host>/evidence_registry)")
    p.add_argument("--stages", type=int, help="running fleet or --fleet: stages (default: the installed route's, "
                                              "else every worker or stage host)")
    p.add_argument("--context-tokens", type=int, default=2048,
                   help="running fleet or --fleet: target context per sequence")
    p.add_argument("--concurrency", type=int, default=32,
                   help="running fleet or --fleet: target concurrent sequences")
    p.add_argument("--boundary-dtype", default=None, choices=("bf16", "fp16", "fp32"),
                   help="running fleet: boundary tensor dtype (default bf16); --fleet: every hop the file does not "
                        "set")
    p.add_argument("--weights", choices=("fp32", "bf16", "q8_0", "q4_k_m"),
                   help="weight policy the stages hold: weight bytes per layer are the policy's formats (default: "
                        "the checkpoint's dtype, as stored; with --fleet, each host's `weights:`, else fp32). With "
                        "--fleet it overrides the file's `weights:` on every host")
    p.add_argument("--max-activations", choices=("int8", "float32"), default=None,
                   help="with --fleet: the block-format activations of every max host whose `max_activations:` "
                        "the file does not set (default int8, as `fornax up`); a stage profile timed in the other "
                        "mode stands aside")
    p.add_argument("--routes", default="1",
                   help="with --inventory or --fleet: replica routes the hosts form: N (the best layout of exactly N "
                        "routes) or auto (the count predicted fastest at the target concurrency; fewer routes when "
                        "within the measured spread); default 1, a single route")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run_plan)
    b = benches.add_parser("planner", help="planner speed and brute-force agreement")
    b.add_argument("--json", action="store_true")
    b.add_argument("--instances", type=int, default=200, help="random instances for brute-force agreement")
    b.set_defaults(func=run_bench)


def _resolver(args, mode: str, state_dir: str = ".fornax"):
    if mode != "deployment":
        return None
    from libs.security.cli_credentials import cli_channel
    from services.evidence_registry.client import ClientOptions, address_from_fleet
    from services.planner.registry import RegistryResolver

    address = args.registry or address_from_fleet(state_dir)
    return RegistryResolver(address, ClientOptions(channel=cli_channel(state_dir))) if address else None


@dataclass(frozen=True)
class FleetPlanning:
    """What `--fleet` planned from, for the output: the file, its inventory's figures (each host's
    measured runtime reserve in place of the declared one where a stored profile gives it), the
    weight policy and the stored profile records found (host or "a->b" hop -> record id)."""

    path: str
    file_sha256: str
    built: FleetInventory
    weights: FleetWeights
    measured: dict[str, str]
    figures: tuple[InventoryFigure, ...] = ()  # the inventory's figures as planned; () = built.figures

    @property
    def planned_figures(self) -> tuple[InventoryFigure, ...]:
        return self.figures or self.built.figures

    def lines(self) -> list[str]:
        from apps.fleet.plan_inventory import figure_lines

        modes = ", ".join(f"{host} {mode}" for host, mode in self.activations.items())
        shown = [f"max activations: {modes} (a stage profile timed in the other mode stands aside)"] if modes else []
        return [f"fleet {self.path} (sha256 {self.file_sha256[:16]}): weights {self.weights.policy} from "
                f"{self.weights.source}", *shown, *figure_lines(self.planned_figures, self.measured)]

    @property
    def activations(self) -> dict[str, str]:
        """Max host -> the block-format activations it runs (and its profile must have timed)."""
        return {n.name: n.max_activations for n in self.built.inventory.nodes if n.max_activations}

    def as_json(self) -> dict[str, Any]:
        figures = [{**asdict(f), "prediction": f.is_prediction} for f in self.planned_figures]
        return {"file": self.path, "file_sha256": self.file_sha256, "weights": asdict(self.weights),
                "max_activations": self.activations, "figures": figures, "stored_profiles": self.measured}


def measured_subjects(records) -> dict[str, str]:
    """Host or "a->b" hop -> the stored stage or link profile record that measured it."""
    from libs.profiles import schema

    out: dict[str, str] = {}
    for r in records:
        kind = r.label(schema.LABEL_PROFILE)
        if r.record_type == "measurement" and kind == "stage" and r.label(schema.LABEL_HOST):
            out[r.label(schema.LABEL_HOST)] = r.record_id
        elif r.record_type == "measurement" and kind == "link" and r.label(schema.LABEL_FROM_HOST):
            out[f"{r.label(schema.LABEL_FROM_HOST)}->{r.label(schema.LABEL_TO_HOST)}"] = r.record_id
    return out


def _plan_fleet_file(args):
    """(model, result, FleetPlanning) for the stage hosts of a fleet file, from their declared
    limits, and from the profiles stored under --state-dir when it holds any stage profile."""
    import time
    from pathlib import Path

    from apps.bench.stored_profiles import NoStoredProfiles, stored_records
    from apps.fleet.plan_inventory import (
        fleet_reserves,
        fleet_target,
        fleet_weights,
        inventory_from_fleet,
        with_reserves,
    )
    from apps.fleet.spec import FleetFileError, load_fleet_spec
    from libs.common.kinds import DType
    from libs.service.errors import FailedPrecondition, InvalidArgument
    from services.planner.model import describe_checkpoint
    from services.planner.planner import resolved_book

    try:
        spec = load_fleet_spec(args.fleet, DType(args.boundary_dtype) if args.boundary_dtype else None)
    except FleetFileError as exc:
        raise InvalidArgument(f"fleet file {args.fleet}: {exc}", reason="FLEET_FILE_INVALID", field="fleet") from exc
    built = inventory_from_fleet(spec, getattr(args, "max_activations", None) or "")
    weights = fleet_weights(spec, args.weights)
    model = describe_checkpoint(args.checkpoint, weights.policy)
    if weights.mixed:  # each host's stage holds its own formats: no one policy's formats to require
        model = replace(model, weights_policy="")
    mode = args.mode or "exploratory"
    target = fleet_target(spec, context_tokens=args.context_tokens, concurrency=args.concurrency,
                          stages=args.stages, mode=mode)
    try:
        records = stored_records(Path(args.state_dir), spec.control_host) or []
    except NoStoredProfiles as exc:
        raise FailedPrecondition(str(exc), reason="PROFILE_STORE_DAMAGED") from exc
    measured = measured_subjects(records)
    resolver = _resolver(args, mode, args.state_dir)
    hosts = {h.name for h in spec.stage_hosts}
    from_profiles = any(subject in hosts for subject in measured)
    book = resolved_book(resolver, records) if from_profiles else None
    figures = built.figures
    if book is not None:
        reserves = fleet_reserves(built, book, model.model_snapshot, model.weights_policy, time.time_ns())
        figures = with_reserves(built.figures, reserves)
    result = _plan_inventory(model, built.inventory, target, route_count(args.routes), resolver, book)
    return model, result, FleetPlanning(args.fleet, spec.file_sha256, built, weights, measured, figures)


def _plan_inventory(model, inventory, target, routes: int | None, resolver, book):
    """`routes` replica routes (1: a single route), from the profile book when there is one."""
    from services.planner.planner import plan, plan_routes, plan_with_book

    if routes != 1:
        return plan_routes(model, inventory, target, routes, resolver, book)
    if book is not None:
        return plan_with_book(model, inventory, target, resolver, book)
    return plan(model, inventory, target, resolver)


def _plan_inventory_file(args, model):
    from services.planner.inventory import load_inventory_file
    from services.planner.planner import plan, plan_with_records

    loaded = load_inventory_file(args.inventory, mode=args.mode)
    routes = route_count(args.routes)
    if not args.profiles and routes != 1:
        from services.planner.planner import plan_routes

        resolver = _resolver(args, loaded.target.mode)
        return plan_routes(model, loaded.inventory, loaded.target, routes, resolver), None
    if not args.profiles:
        return plan(model, loaded.inventory, loaded.target, _resolver(args, loaded.target.mode)), None
    from libs.security.cli_credentials import cli_channel
    from libs.service.errors import FailedPrecondition
    from services.evidence_registry.client import ClientOptions, address_from_fleet
    from services.planner.profile_source import fetch_profile_records
    from services.planner.registry import RegistryResolver

    address = args.registry or address_from_fleet(args.state_dir)
    if not address:
        raise FailedPrecondition("--profiles needs an evidence registry (--registry, or a running fleet)",
                                 reason="NO_EVIDENCE_REGISTRY")
    options = ClientOptions(channel=cli_channel(args.state_dir))
    records = fetch_profile_records(address, options)
    resolver = RegistryResolver(address, options)
    if routes != 1:
        from services.planner.planner import plan_routes, resolved_book

        book = resolved_book(resolver, records)
        return plan_routes(model, loaded.inventory, loaded.target, routes, resolver, book), None
    return plan_with_records(model, loaded.inventory, loaded.target, resolver, records), None


def _plan_running_fleet(args, model):
    """(result, installed stages or None) for the running fleet of --state-dir."""
    from apps.cli.planner_fleet_view import installed_stages, read_view
    from libs.common.kinds import DType
    from libs.security.cli_credentials import cli_channel
    from services.evidence_registry.client import ClientOptions
    from services.planner.inventory import Target
    from services.planner.planner import plan_with_records, predict_placement, resolved_book
    from services.planner.registry import RegistryResolver

    channel = cli_channel(args.state_dir)
    view = read_view(args.state_dir, channel)
    installed = installed_stages(view, channel) if args.replan else None
    stages = args.stages or (len(installed) if installed else len(view.workers))
    target = Target(context_tokens=args.context_tokens, concurrency=args.concurrency, min_stages=stages,
                    max_stages=stages, boundary_dtype=DType(args.boundary_dtype or "bf16"),
                    mode=args.mode or "exploratory")
    resolver = RegistryResolver(view.registry, ClientOptions(channel=channel))
    result = plan_with_records(model, view.inventory, target, resolver, view.records)
    if installed is None:
        return result, None
    placement = [(s.node, s.layer_start, s.layer_end) for s in installed]
    current = predict_placement(model, view.inventory, replace(target, mode="exploratory"),
                                resolved_book(resolver, view.records), placement)
    return result, (installed, current)


def run_plan(args) -> int:
    import grpc

    from libs.model.errors import ModelError
    from libs.service.errors import FornaxError
    from services.planner.model import describe_checkpoint

    problem = _option_problem(args)
    if problem:
        print(f"error BAD_OPTIONS: {problem}", file=sys.stderr)
        return EXIT_ERROR
    fleet: FleetPlanning | None = None
    try:
        if args.fleet:
            model, result, fleet = _plan_fleet_file(args)
            installed = None
        else:
            model = describe_checkpoint(args.checkpoint, args.weights)
            planned = _plan_inventory_file(args, model) if args.inventory else _plan_running_fleet(args, model)
            result, installed = planned
    except (FornaxError, ModelError) as exc:
        print(f"error {exc.reason}: {exc.message}" + (f" (field {exc.field})" if getattr(exc, "field", None) else ""),
              file=sys.stderr)
        return EXIT_ERROR
    except grpc.RpcError as exc:
        print(f"error FLEET_UNREACHABLE: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        _print_json(model, result, fleet)
    else:
        _print_text(args, model, result, installed, fleet)
    return 0 if result.feasible else EXIT_INFEASIBLE


def _print_json(model, result, fleet: FleetPlanning | None) -> None:
    body = asdict(result)
    body["model"] = model_summary(model)
    if fleet is not None:
        body["fleet"] = fleet.as_json()
    if result.plan is not None:
        body["plan"]["label"] = result.plan.label
    print(json.dumps(body, indent=2, sort_keys=True))


def _print_text(args, model, result, installed, fleet: FleetPlanning | None) -> None:
    from services.planner.explain import diff_lines, explain_lines, route_lines

    summary = model_summary(model)
    print(f"model {summary['model_snapshot']}: {summary['layers']} layers, "
          f"{summary['weight_bytes'] / GIB:.2f} GiB {summary['weights']}, {summary['routed_experts']} routed "
          f"experts top-{summary['experts_per_token']} + {summary['shared_experts']} shared; a decode token reads "
          f"{summary['active_weight_bytes_per_token'] / GIB:.3f} GiB of layer weights")
    if fleet is not None:
        print("\n".join(fleet.lines()))
    if result.route_choice is not None:
        print("\n".join(route_lines(result)))
    if (args.explain or args.replan) and result.plan is not None:
        routes = result.routes if len(result.routes) > 1 else ()
        for i, route in enumerate(routes):
            print(f"route {i} of {len(routes)} ({route.concurrency} sequences):")
            print("\n".join(explain_lines(route.plan)))
        if not routes:
            print("\n".join(explain_lines(result.plan)))
        policy = (None if fleet.weights.mixed else fleet.weights.policy) if fleet else args.weights
        if policy:
            print("\n".join(_format_lines(args.checkpoint, policy, result.plan)))
        print("\n".join(format_result(result, stages=False)))
    else:
        print("\n".join(format_result(result)))
    if installed is not None and result.plan is not None:
        print("\n".join(diff_lines(installed[0], result.plan, installed[1])))


def route_count(text: str) -> int | None:
    """`--routes`: None for auto, else the count (validated by `_option_problem`)."""
    return None if text == "auto" else int(text)


def _option_problem(args) -> str | None:
    if args.routes != "auto" and not (args.routes.isdigit() and int(args.routes) >= 1):
        return f"--routes takes auto or a count >= 1, got {args.routes!r}"
    if args.routes != "1" and not (args.inventory or args.fleet):
        return "--routes plans replica routes on --inventory or --fleet hosts; the running fleet has one route"
    if args.replan and (args.inventory or args.fleet):
        return "--replan compares with the running fleet's installed route; drop --inventory and --fleet"
    if args.profiles and args.fleet:
        return "--fleet reads the profiles stored under --state-dir itself; drop --profiles"
    return None


def _format_lines(checkpoint: str, policy: str, plan) -> list[str]:
    from libs.model.config import load_config
    from services.planner.policy_bytes import format_lines

    return format_lines(load_config(checkpoint), policy,
                        [(s.stage_index, s.node, s.layer_start, s.layer_end, str(s.backend)) for s in plan.stages])


def model_summary(model) -> dict[str, Any]:
    active = sum(x.active_weight_bytes_per_token(model.expert_bytes, model.experts_per_token) for x in model.layers)
    return {
        "model_snapshot": model.model_snapshot, "layers": model.num_layers, "weight_bytes": model.total_weight_bytes,
        "weight_dtype": model.weight_dtype, "routed_experts": model.routed_experts,
        "weights": model.weights_policy or f"{model.weight_dtype} (as stored)",
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
    return rows + [_stage_runs(result.plan.stages)]


def _stage_runs(stages) -> str:
    """What each stage runs: its backend and build, and a MAX stage's block-format activations."""
    return "runs: " + "; ".join(
        f"stage {s.stage_index} {s.backend}" + (f" {s.build}" if s.build else "")
        + (f" ({s.max_activations} activations)" if s.max_activations else "") for s in stages)


def format_result(result, stages: bool = True) -> list[str]:
    lines: list[str] = []
    if result.plan is not None and stages:
        p = result.plan
        lines += [f"plan {p.plan_id}  {p.plan_hash}", f"mode {p.label}", f"method {p.method}",
                  "decode cost per microbatch (predictions):"]
        lines += _stage_rows(result)
        lines.append("predictions (computed from physical measurements; not measurements of this plan):"
                     if p.from_profiles and not p.declared_terms else "predictions (cost model, not measurements):")
        lines += [f"  {x.name:<28} {x.value:.6g} {x.unit}" for x in p.predictions]
    elif result.plan is None:
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

    from apps.bench.planner import run_bench as bench
    from libs.service.host import cpu_name

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
