"""Wait for the orchestrator to install and warm its route, relaying install progress.

Progress comes from the services' own logs: the orchestrator's `install_progress` events and
the stage workers' first-run compile lines.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from libs.service.fleet_state import FleetState


class RouteFailed(RuntimeError):
    """The orchestrator reported that installing the route failed."""


class _LogFollower:
    def __init__(self, path: str, start: int = 0):
        self._path = Path(path)
        self._offset = start  # earlier fleets' lines in the same log are not this one's progress

    def new_lines(self) -> list[str]:
        try:
            with open(self._path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return []
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        return data[:complete].decode("utf-8", errors="replace").splitlines()


def _progress_of(line: str) -> tuple[str | None, str | None]:
    """(progress message, failure message) found in one log line."""
    try:
        event = json.loads(line)
    except ValueError:
        return (line.strip(), None) if "max:" in line else (None, None)
    if not isinstance(event, dict):
        return None, None
    if event.get("event") in ("install_progress", "compile_progress"):
        return str(event.get("message", "")), None
    if event.get("event") == "route_install_failed":
        return None, f"{event.get('reason', 'INSTALL_FAILED')}: {event.get('error') or _last_line(event)}"
    return None, None


def _last_line(event: dict) -> str:
    """The exception's last line, for a failure logged with a traceback and no error text."""
    lines = [line for line in str(event.get("exception", "")).splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def health_url(state: FleetState) -> str:
    base = (state.api or "").removesuffix("/v1")
    return f"{base}/health"


def _healthy(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_for_route(state: FleetState, timeout_s: float, report: Callable[[str], None]) -> None:
    """Block until /health answers 200; raise RouteFailed or TimeoutError otherwise."""
    if not state.api:
        raise RouteFailed("the orchestrator serves no HTTP API")
    followers = [_LogFollower(s.log, s.log_start) for s in state.services if s.kind in ("orchestrator", "stage_worker")]
    url = health_url(state)
    context = state.api_ssl_context()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for follower in followers:
            for line in follower.new_lines():
                message, failure = _progress_of(line)
                if failure:
                    raise RouteFailed(failure)
                if message:
                    report(message)
        if _healthy(url, context):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the route was not ready within {timeout_s:.0f} s ({url})")
