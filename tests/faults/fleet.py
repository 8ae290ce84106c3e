"""A live local fleet for fault tests, and the probes the tests assert with.

Every probe has a timeout, so a hung service fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc

from apps.fleet.compose import start_fleet
from apps.fleet.launcher import FleetOptions, Launcher
from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc
from libs.security.cli_credentials import operator_credentials
from libs.service.fleet_state import FleetState, write_fleet

ROUTE_READY_TIMEOUT_S = 120


@dataclass
class LiveFleet:
    state: FleetState
    launcher: Launcher

    @property
    def state_dir(self) -> Path:
        return self.launcher.options.state_dir

    def entry(self, name: str):
        return next(s for s in self.state.services if s.name == name)

    def pid(self, name: str) -> int:
        return self.entry(name).pid

    @property
    def health_url(self) -> str:
        return self.state.api.removesuffix("/v1") + "/health"

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.health_url, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def channel(self, name: str) -> grpc.Channel:
        """A gRPC channel to a service with the operator's client certificate (mTLS)."""
        credentials = operator_credentials(self.state_dir, env={})
        assert credentials is not None, "the fleet has no operator certificate"
        return grpc.secure_channel(self.entry(name).grpc, credentials.channel_credentials())

    def plan_status(self) -> pb.PlanStatus:
        with self.channel("orchestrator") as channel:
            reply = pb_grpc.OrchestratorServiceStub(channel).GetPlanStatus(
                pb.GetPlanStatusRequest(), timeout=5)
        return reply.current

    def metric(self, name: str) -> float:
        url = f"http://{self.entry('orchestrator').metrics}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    def log(self, name: str) -> str:
        return Path(self.entry(name).log).read_text(errors="replace")

    def wait_for(self, predicate, timeout_s: float, what: str, poll_s: float = 0.1):
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout_s} s: {what}")
            time.sleep(poll_s)


@contextlib.contextmanager
def live_fleet(root: Path, checkpoint: Path, env: dict[str, str] | None = None) -> Iterator[LiveFleet]:
    options = FleetOptions(state_dir=root / ".fornax", stages=2, backend="numpy",
                           boundary_dtype="fp32", checkpoint=str(checkpoint),
                           startup_timeout_s=120, grace_period_s=5.0, env=env or {},
                           # Under mTLS, as an operator runs it: probes read worker and route
                           # state with the operator's client certificate.
                           insecure=False)
    state, launcher = start_fleet(options)
    write_fleet(options.state_dir, state)  # what `fornax status` reads
    fleet = LiveFleet(state, launcher)
    try:
        fleet.wait_for(lambda: fleet.health()[0] == 200 if _reachable(fleet) else False,
                       ROUTE_READY_TIMEOUT_S, "the route is ready", poll_s=0.2)
        yield fleet
    finally:
        launcher.stop_all()


def _reachable(fleet: LiveFleet) -> bool:
    try:
        fleet.health()
        return True
    except (OSError, ValueError):
        return False


@dataclass
class StreamOutcome:
    status: int
    tokens: int  # SSE chunks that carried text or a finish
    error_code: str | None  # the error event's code, or the HTTP error's
    error_message: str
    finished_at: float  # monotonic time the stream ended
    text: str = ""
    finish_reason: str | None = None


async def stream_completion(session: aiohttp.ClientSession, api: str, prompt: list[int],
                            max_tokens: int, first_token: asyncio.Event | None = None) -> StreamOutcome:
    """One streaming /v1/completions call, read to its end however it ends."""
    # ignore_eos: a stream runs to max_tokens or its fault, never to an early greedy eos.
    body = {"model": "fornax", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True}
    tokens, code, message, text, finish = 0, None, "", [], None
    try:
        async with session.post(f"{api}/completions", json=body) as response:
            if response.status != 200:
                error = (await response.json())["error"]
                return StreamOutcome(response.status, 0, error["code"], error["message"],
                                     time.monotonic())
            async for line in response.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    code, message = event["error"]["code"], event["error"]["message"]
                else:
                    tokens += 1
                    for choice in event.get("choices", ()):
                        text.append(choice.get("text") or "")
                        finish = choice.get("finish_reason") or finish
                    if first_token is not None:
                        first_token.set()
            return StreamOutcome(200, tokens, code, message, time.monotonic(), "".join(text), finish)
    except (TimeoutError, aiohttp.ClientError) as exc:
        return StreamOutcome(0, tokens, "connection_lost", type(exc).__name__, time.monotonic())
