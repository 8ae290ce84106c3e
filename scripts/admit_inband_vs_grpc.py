"""Physical A/B: what opening leases in band on FNX2 saves against the gRPC fan-out it replaced.

On one route of stage-worker processes on this host (the `tiny` or a given checkpoint, numpy),
each round measures, interleaved and at each concurrency:
- `inband`: the route's admit (one FNX2 CONTROL admit to stage 0, applied and forwarded by
  each stage, one ACK), then its in-band release;
- `grpc`: the same admissions as the orchestrator used to make them, one `AdmitSequence` call
  per stage awaited together, then one `ReleaseRequest` per stage;
- `ttft_*`: admission plus a 16-token prefill through the route, i.e. the time to the first
  sampled token as the route sees it (no HTTP, no tokenizer), for each way of admitting.
Medians and 95th percentiles in ms over every request of every round. Plain TCP without TLS for
both control and data plane, so TLS cost is left out of both sides. Run with the repository's
venv from its root:

    nice -n 19 .venv/bin/python scripts/admit_inband_vs_grpc.py [--stages 2] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "libs" / "api")]

import numpy as np  # noqa: E402

from fornax.stage_worker.v1 import stage_worker_pb2 as pb  # noqa: E402
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc  # noqa: E402
from libs.fnx2.wire.messages import Phase, SequenceStatus  # noqa: E402
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint  # noqa: E402
from libs.model.config import load_config  # noqa: E402
from libs.model.sampling import SamplingParams  # noqa: E402
from libs.service.channels import open_aio_channel  # noqa: E402
from libs.service.host import cpu_name  # noqa: E402
from services.orchestrator.route.stage_chain import Route, RoutePlan, inband_admission, route_slice  # noqa: E402
from services.stage_worker.convert import admission_pb_from_inband  # noqa: E402
from tests.support.stages import load_pipeline, start_workers  # noqa: E402

RESERVE_TOKENS, PROMPT_TOKENS, BUDGET_NS = 64, 16, 30_000_000_000


class GrpcLeases:
    """The gRPC fan-out: one call per stage, awaited together, as admission used to be."""

    def __init__(self, plan: RoutePlan) -> None:
        self.plan = plan
        self.channels = [open_aio_channel(s.control_address) for s in plan.stages]
        self.stubs = [pb_grpc.StageWorkerServiceStub(c) for c in self.channels]

    async def admit(self, request_id: str) -> None:
        request = admission_pb_from_inband(inband_admission(self.plan, request_id, RESERVE_TOKENS, SamplingParams()))
        request.plan_generation_id = self.plan.plan_generation_id
        await asyncio.gather(*(stub.AdmitSequence(request, timeout=10) for stub in self.stubs))

    async def release(self, request_id: str) -> None:
        request = pb.ReleaseRequestRequest(target_request_id=request_id,
                                           plan_generation_id=self.plan.plan_generation_id)
        await asyncio.gather(*(stub.ReleaseRequest(request, timeout=10) for stub in self.stubs))

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


async def timed(coro) -> float:  # noqa: ANN001
    started = time.perf_counter()
    await coro
    return (time.perf_counter() - started) * 1000


async def prefill(route: Route, plan: RoutePlan, request_id: str) -> None:
    tokens = np.arange(3, 3 + PROMPT_TOKENS, dtype=np.int32)
    ((result, _),) = await route.run(Phase.PREFILL, [route_slice(plan, request_id, 0, 0, 0, PROMPT_TOKENS,
                                                                 BUDGET_NS)], tokens)
    if result.status is not SequenceStatus.OK:
        raise RuntimeError(f"prefill failed: {result.error_code} {result.error_message}")


async def one_round(route: Route, grpc_leases: GrpcLeases, plan: RoutePlan, concurrency: int,
                    samples: dict[str, list[float]]) -> None:
    async def inband(rid: str, with_prefill: bool) -> float:
        ms = await timed(route.admit(rid, RESERVE_TOKENS, SamplingParams()))
        if with_prefill:
            ms += await timed(prefill(route, plan, rid))
        await route.release(rid)
        return ms

    async def fanout(rid: str, with_prefill: bool) -> float:
        ms = await timed(grpc_leases.admit(rid))
        if with_prefill:
            ms += await timed(prefill(route, plan, rid))
        await grpc_leases.release(rid)
        return ms

    for name, run, with_prefill in (("inband_admit", inband, False), ("grpc_admit", fanout, False),
                                    ("ttft_inband", inband, True), ("ttft_grpc", fanout, True)):
        ids = [str(uuid.uuid4()) for _ in range(concurrency)]
        samples[name] += await asyncio.gather(*(run(rid, with_prefill) for rid in ids))


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": round(statistics.median(ordered), 3),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3), "n": len(ordered)}


async def measure(plan: RoutePlan, concurrencies: list[int], rounds: int) -> dict[str, dict]:
    route, grpc_leases = Route(plan), GrpcLeases(plan)
    await route.open()
    try:
        report: dict[str, dict] = {}
        for c in concurrencies:
            samples: dict[str, list[float]] = {k: [] for k in ("inband_admit", "grpc_admit", "ttft_inband",
                                                                 "ttft_grpc")}
            await one_round(route, grpc_leases, plan, c, {k: [] for k in samples})  # warm, untimed
            for _ in range(rounds):
                await one_round(route, grpc_leases, plan, c, samples)
            figures = {k: summary(v) for k, v in samples.items()}
            figures["grpc_vs_inband_admit_p50"] = round(
                figures["grpc_admit"]["p50_ms"] / figures["inband_admit"]["p50_ms"], 3)
            figures["ttft_removed_p50_ms"] = round(
                figures["ttft_grpc"]["p50_ms"] - figures["ttft_inband"]["p50_ms"], 3)
            report[f"c{c}"] = figures
        health = await route.health()
        if any(h.live_sequences for h in health):
            raise RuntimeError("leases left on the stages after the run")
        return report
    finally:
        await route.close()
        await grpc_leases.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="checkpoint dir (default: a generated tiny one)")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--concurrency", default="1,32")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="admit-ab-") as tmp:
        checkpoint = Path(args.checkpoint) if args.checkpoint else write_checkpoint(
            CheckpointRequest("tiny", Path(tmp) / "ckpt", seed=3)).out_dir
        fleet = start_workers(args.stages, Path(tmp) / "workers")
        try:
            plan = load_pipeline(fleet, checkpoint, load_config(checkpoint).num_hidden_layers)
            report = asyncio.run(measure(plan, [int(c) for c in args.concurrency.split(",")], args.rounds))
        finally:
            fleet.stop()
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                         text=True).stdout.strip()
    print(json.dumps({
        "evidence_class": "physical", "label": "one run on this host; ratios within the run",
        "hardware": f"{cpu_name()}, stage workers as processes on one host, plain TCP",
        "build": sha, "model": str(checkpoint) if args.checkpoint else "tiny preset seed 3 (generated)",
        "stages": args.stages, "rounds": args.rounds,
        "command": " ".join(["scripts/admit_inband_vs_grpc.py", *sys.argv[1:]]), **report,
    }, indent=1))


if __name__ == "__main__":
    main()
