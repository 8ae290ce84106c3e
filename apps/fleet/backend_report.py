"""`fornax status` lines on what each stage runs now and what is compiling, read from the
orchestrator's `/v1/models` (`fornax_backend`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from libs.service.fleet_state import FleetState


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
            "stage_conversions": execution.get("stage_conversions") or []}


def render_board(board: dict | None) -> list[str]:
    if board is None:
        return ["backend: no route is serving yet"]
    lines = []
    if board.get("phase"):
        running, wanted = board.get("running_backend") or "none", board.get("requested_backend")
        lines.append(f"backend: running {running}, requested {wanted} ({board.get('phase')})")
    else:
        wanted = None
    if board.get("failure"):
        lines.append(f"  NOT ON {str(wanted).upper()}: {board['failure']}")
    if board.get("stage_weights"):
        lines.append("weights: " + ", ".join(f"stage {i} {policy}" for i, policy in enumerate(board["stage_weights"]))
                     + " (each stage's verified manifest)")
    for index, conversions in enumerate(board.get("stage_conversions") or []):
        lines.extend(f"  stage {index} converted at build: {line}" for line in conversions)
    for stage in board.get("stages", []):
        graphs = ", ".join(f"{name} {state}" for name, state in stage.get("graphs", {}).items())
        lines.append(f"  stage {stage['index']}: {stage['backend']}; max graphs: {graphs}")
    for graph in board.get("graphs", []):
        if graph.get("compile_seconds") is not None:
            lines.append(f"  compiled {graph['graph']} in {graph['compile_seconds']:.1f} s "
                         f"(physical, this host, low priority)")
    return lines
