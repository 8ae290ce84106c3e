"""`fornax bench coldstart`: a cold `fornax up` with empty caches, measured from the outside.

Runs `fornax up --backend max` in a fresh temporary HOME and compile cache dir, sends a steady
trickle of greedy streaming completions from the moment `/health` answers, and follows
`/v1/models` until the route runs the requested backend (or settles short of it). Every figure
is a physical measurement of this host, under whatever else the host is running.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from libs.service.host import cpu_name

FIGURE_CLASS = "physical (wall seconds on this host, measured from outside the fleet)"
FAILED_PHASES = ("compile_failed", "switch_failed", "install_failed", "measure_failed")
# Settled on a backend: MAX, or numpy because MAX measured slower at the route's load.
FINAL_PHASES = ("serving_requested_backend", "serving_reference_measured_faster")


@dataclass(frozen=True)
class ColdstartOptions:
    stages: int = 2
    max_tokens: int = 8
    trickle_interval_s: float = 0.5
    timeout_s: float = 1800.0
    keep_dir: bool = False


@dataclass
class Trickle:
    """Requests sent at a steady pace; each outcome is (started_s, first_token_s, text, ok)."""

    base: str
    max_tokens: int
    outcomes: list[tuple[float, float | None, str, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def one(self, t0: float) -> None:
        body = json.dumps({"model": "fornax", "prompt": [1, 17, 42, 99, 7], "max_tokens": self.max_tokens,
                           "temperature": 0, "stream": True}).encode()
        request = urllib.request.Request(f"{self.base}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        started, first, text, ok = time.monotonic() - t0, None, "", False
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                for raw in response:
                    line = raw.decode().strip()
                    if line == "data: [DONE]":
                        break
                    if not line.startswith("data: "):
                        continue
                    chunk = json.loads(line[6:])
                    choice = (chunk.get("choices") or [{}])[0]
                    if choice.get("text") and first is None:
                        first = time.monotonic() - t0
                    text += choice.get("text") or ""
                    ok = ok or choice.get("finish_reason") in ("length", "stop")
        except (urllib.error.URLError, OSError, ValueError):
            ok = False
        self.outcomes.append((started, first, text, ok))

    def run(self, t0: float, interval_s: float) -> None:
        threads = []
        while not self.stop.is_set():
            thread = threading.Thread(target=self.one, args=(t0,), daemon=True)
            thread.start()
            threads.append(thread)
            self.stop.wait(interval_s)
        for thread in threads:
            thread.join(timeout=600)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}
    except (urllib.error.URLError, OSError, ValueError):
        return 0, {}


def _board(base: str) -> dict:
    _, listing = _get_json(f"{base}/v1/models")
    data = listing.get("data") or [{}]
    return data[0].get("fornax_backend") or {}


def _isolated_env(root: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(root / "home"), "XDG_CACHE_HOME": str(root / "home" / ".cache"),
           "FORNAX_COMPILE_CACHE_DIR": str(root / "max-cache"), "MODULAR_TELEMETRY_ENABLED": "0"}
    env.pop("MODULAR_MAX_CACHE_DIR", None)
    (root / "home").mkdir(parents=True, exist_ok=True)
    return env


def run(options: ColdstartOptions, command: str) -> dict:
    root = Path(tempfile.mkdtemp(prefix="fornax-coldstart-"))
    env = _isolated_env(root)
    checkpoint = root / "model"
    subprocess.run([sys.executable, "-m", "apps.cli.main", "model", "make-test-checkpoint", "--preset", "tiny",
                    "--out", str(checkpoint)], env=env, check=True, capture_output=True)
    port, state_dir = _free_port(), root / "state"
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    up = subprocess.Popen([sys.executable, "-m", "apps.cli.main", "up", "--state-dir", str(state_dir),
                           "--checkpoint", str(checkpoint), "--stages", str(options.stages), "--backend", "max",
                           "--boundary-dtype", "fp32", "--http-port", str(port)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trickle = Trickle(base, options.max_tokens)
    try:
        result = _follow(base, t0, options, trickle)
    finally:
        trickle.stop.set()
        up.wait(timeout=60)
        subprocess.run([sys.executable, "-m", "apps.cli.main", "down", "--state-dir", str(state_dir)],
                       env=env, capture_output=True)
    report = _report(result, trickle, options, command, root)
    if not options.keep_dir:
        shutil.rmtree(root, ignore_errors=True)
    return report


def _follow(base: str, t0: float, options: ColdstartOptions, trickle: Trickle) -> dict:
    deadline = t0 + options.timeout_s
    while _get_json(f"{base}/health")[0] != 200:
        if time.monotonic() > deadline:
            return {"board": {}, "final_s": None}
        time.sleep(0.2)
    ready_s = time.monotonic() - t0
    sender = threading.Thread(target=trickle.run, args=(t0, options.trickle_interval_s), daemon=True)
    sender.start()
    board, final_s = {}, None
    while time.monotonic() < deadline:
        board = _board(base)
        if board.get("phase") in FINAL_PHASES:
            final_s = time.monotonic() - t0
            break
        if board.get("phase") in FAILED_PHASES:
            break
        time.sleep(0.5)
    time.sleep(3 * options.trickle_interval_s)  # a few requests on the final route too
    trickle.stop.set()
    sender.join()
    return {"board": board, "final_s": final_s, "ready_s": ready_s}


def _report(result: dict, trickle: Trickle, options: ColdstartOptions, command: str, root: Path) -> dict:
    outcomes = sorted(trickle.outcomes)
    firsts = [first for _, first, _, ok in outcomes if first is not None]
    board = result.get("board", {})
    return {
        "figure_class": FIGURE_CLASS,
        "host": f"{cpu_name()}; {os.cpu_count()} CPUs; {platform.platform()}; shared and loaded by other work",
        "command": command,
        "model": "tiny preset, 2 stages, fp32 boundaries, greedy",
        "seconds_to_route_ready": result.get("ready_s"),
        "seconds_to_first_token": min(firsts) if firsts else None,
        "seconds_to_final_backend": result.get("final_s"),
        "final_backend": board.get("running_backend"),
        "phase": board.get("phase"),
        "failure": board.get("failure", ""),
        "backend_choice": board.get("choice"),
        "compile_seconds_per_graph": {g["graph"]: g.get("compile_seconds") for g in board.get("graphs", [])},
        "requests_sent": len(outcomes),
        "requests_lost_during_switch": sum(1 for *_, ok in outcomes if not ok),
        "distinct_outputs": len({text for _, _, text, ok in outcomes if ok}),
        "temporary_dir": str(root),
    }
