"""`fornax status` lines on what each stage runs now and what is compiling, read from the
orchestrator's `/v1/models` (`fornax_backend`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from libs.service.fleet_state import FleetState

EACH_HOSTS_OWN = "each host's own backend"  # a fleet file's route requests no one backend
SERVING_REQUESTED = "serving_requested_backend"  # services.orchestrator.route.coldstart.UpgradePhase, by value


def fetch_board(state: FleetState) -> dict | None:
    if not state.api:
        return None
    request = urllib.request.Request(f"{state.api}/models")
    if state.api_key:
        request.add_header("Authorization", f"Bearer {state.api_key}")
    try:
        with urllib.request.urlopen(request, timeout=5, context=state.api_ssl_context()) as response:
            listing = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    data = listing.get("data") or [{}]
    board = data[0].get("fornax_backend")
    execution = (data[0].get("fornax") or {}).get("execution") or {}
    weights = execution.get("stage_weights")
    if board is None and not weights:
        return None
    return {**(board or {}), "stage_weights": weights or [],
            "stage_conversions": execution.get("stage_conversions") or [],
            "stage_max_activations": execution.get("stage_max_activations") or []}


def render_board(board: dict | None) -> list[str]:
    if board is None:
        return ["backend: no route is serving yet"]
    lines = []
    if board.get("phase"):
        running, wanted = board.get("running_backend") or "none", board.get("requested_backend")
        if wanted is None and board.get("phase") == SERVING_REQUESTED:  # a fleet file: one backend per host
            lines.append(f"backend: each stage runs its own host's backend ({board.get('phase')})")
        else:
            lines.append(f"backend: running {running}, requested {wanted or EACH_HOSTS_OWN} ({board.get('phase')})")
    else:
        wanted = None
    if board.get("failure"):
        lines.append(f"  NOT ON {(wanted or EACH_HOSTS_OWN).upper()}: {board['failure']}")
    if board.get("stage_weights"):
        lines.append(weights_line(board["stage_weights"], board.get("stage_max_activations") or []))
    for index, conversions in enumerate(board.get("stage_conversions") or []):
        lines.extend(f"  stage {index} converted at build: {line}" for line in conversions)
    lines += render_choice(board.get("choice"))
    for stage in board.get("stages", []):
        graphs = ", ".join(f"{name} {state}" for name, state in stage.get("graphs", {}).items())
        lines.append(f"  stage {stage['index']}: {stage['backend']}; max graphs: {graphs}")
    for graph in board.get("graphs", []):
        if graph.get("compile_seconds") is not None:
            lines.append(f"  compiled {graph['graph']} in {graph['compile_seconds']:.1f} s "
                         f"(physical, this host, low priority)")
    return lines


def weights_line(weights: list[str], activations: list[str]) -> str:
    """Each stage's weight format, and beside it the block-format activations its MAX stage runs."""
    def stage(index: int, policy: str) -> str:
        mode = activations[index] if index < len(activations) else ""
        return f"stage {index} {policy}" + (f" (max activations {mode})" if mode else "")

    return ("weights: " + ", ".join(stage(i, policy) for i, policy in enumerate(weights))
            + " (each stage's verified manifest)")


def render_choice(choice: dict | None) -> list[str]:
    """Why the route runs the backend it runs, with each stage's measured decode steps."""
    if not choice:
        return []
    lines = [f"  backend choice ({choice['policy']}): {choice['reason']}"]
    candidate = choice["candidate"]
    for stage in choice.get("stages", []):
        on = stage["measured_on"]
        figures = "; ".join(
            f"{f['rows']} row{'s' if f['rows'] != 1 else ''} numpy {f['numpy_ms_per_step']:.3f} ms, "
            f"{candidate} {f[f'{candidate}_ms_per_step']:.3f} ms ({f[f'{candidate}_speed_vs_numpy']:.2f}x)"
            for f in stage["figures"])
        builds = ", ".join(on["builds"].values())
        lines.append(f"  stage {stage['index']} layers {stage['layers'][0]}-{stage['layers'][1] - 1} decode step: "
                     f"{figures} (physical: median of runs on {on['host']}, {on['cpu_model']}, cpuset "
                     f"{on['cpuset'] or 'all'}, {builds}, {on['command']})")
    return lines
