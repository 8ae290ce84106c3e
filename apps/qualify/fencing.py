"""Reconnect fencing: a stage worker is killed mid-decode (its data-plane connections drop) and
restarted; the orchestrator reloads the route as a new plan generation and replays.

Passes when every stream still equals the reference (nothing duplicated or lost), the route
runs under a new generation, and the reloaded first stage answers frames of the old
generation and the old lease with their FNX2 codes: a control frame bound to the old
generation gets STALE_PLAN, and a release of an old-generation lease is refused (the lease is
unknown to the new generation: tombstoned, nothing freed).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from apps.qualify.gate import Check
from apps.qualify.probes import Generator, StageHealth
from apps.qualify.scenarios import FIRST_TOKEN_TIMEOUT_S, Workload, _until, reference_mismatch
from libs.fnx2.channel.sender import SenderConfig
from libs.fnx2.wire.control import ChannelBinding
from libs.fnx2.wire.errors import Fnx2Error
from libs.fnx2.wire.leases import derive_execution_lease_id
from libs.security.fnx2_tls import Fnx2Tls
from libs.security.tls import TlsPaths


@dataclass(frozen=True)
class FirstStage:
    """How to reach stage 0's data plane now: address, manifest, and its certificate identity."""

    data_plane_address: str
    manifest_hash: str
    identity: str


async def probe_old_generation(first: FirstStage, old: StageHealth, new: StageHealth, tls_paths: TlsPaths,
                               old_request_id: str) -> tuple[str, str]:
    """(code for an old-generation control frame, outcome of releasing an old lease) on a fresh
    channel bound to the new generation."""
    binding = ChannelBinding(new.plan_id, new.plan_hash, first.manifest_hash, "stage-0", new.plan_generation_id)
    stale = ChannelBinding(old.plan_id, old.plan_hash, first.manifest_hash, "stage-0", old.plan_generation_id)
    host, _, port = first.data_plane_address.rpartition(":")
    client = await Fnx2Tls(tls_paths).connect(host, int(port), SenderConfig(binding, keepalive_s=None),
                                              first.identity)
    try:
        old_lease = derive_execution_lease_id(old.plan_generation_id, old.plan_id, old.plan_hash, old_request_id)
        client.config = SenderConfig(stale, keepalive_s=None)  # frames bound to the old generation
        try:
            await asyncio.wait_for(client.release(old_request_id, old_lease), 10)
            stale_code = "accepted"
        except Fnx2Error as exc:
            stale_code = exc.code.value
        client.config = SenderConfig(binding, keepalive_s=None)
        ack = await asyncio.wait_for(client.release(old_request_id, old_lease), 10)
        lease_outcome = "released" if ack.released else "refused (unknown to this generation, tombstoned)"
    finally:
        await client.close()
    return stale_code, lease_outcome


async def reconnect_fencing(gen: Generator, work: Workload, run: int, pid_of: Callable[[], int],
                            health0: Callable[[], StageHealth], restarted: Callable[[int], bool],
                            first_stage: Callable[[], FirstStage], tls_paths: TlsPaths,
                            recovery_timeout_s: float) -> Check:
    counts: dict[str, int] = {}

    def track(out) -> None:
        counts[out.request_id] = len(out.token_ids)

    ids = [f"qualify-r{run}-fence-{i}" for i in range(len(work.prompts))]
    tasks = [asyncio.create_task(gen.generate(r, p, work.decode_tokens, progress=track))
             for r, p in zip(ids, work.prompts, strict=True)]
    await _until(lambda: all(counts.get(r, 0) >= 2 for r in ids) or any(t.done() for t in tasks),
                 FIRST_TOKEN_TIMEOUT_S, "two tokens of every stream")
    old = await asyncio.to_thread(health0)
    victim = pid_of()
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    outs = await asyncio.gather(*tasks)
    problems = [m for i, o in enumerate(outs)
                if (m := (f"{o.request_id}: ended {o.code} {o.error}" if o.code else
                          reference_mismatch(o, work.reference[i][: work.decode_tokens], complete=True)))]
    try:
        await _until(lambda: restarted(victim), recovery_timeout_s, "the killed worker is restarted")
    except TimeoutError as exc:
        return Check("reconnect_fencing", False, "; ".join([*problems, str(exc)]))
    recovered = time.monotonic() - killed_at
    new = await asyncio.to_thread(health0)
    if new.plan_generation_id == old.plan_generation_id:
        problems.append(f"the route still runs generation {old.plan_generation_id} after the restart")
    stale_code, lease_outcome = await probe_old_generation(await asyncio.to_thread(first_stage), old, new, tls_paths,
                                                           outs[0].wire_id)
    if stale_code != "STALE_PLAN":
        problems.append(f"a control frame of the old generation got {stale_code}, not STALE_PLAN")
    if lease_outcome == "released":
        problems.append("a lease of the old generation was released by the new one")
    return Check("reconnect_fencing", not problems, "; ".join(problems) or
                 f"killed stage worker pid {victim} mid-decode; {len(outs)} streams replayed with no token "
                 f"duplicated or lost; new generation {new.plan_generation_id[:8]} (was "
                 f"{old.plan_generation_id[:8]}), back in {recovered:.2f} s (physical); old-generation control "
                 f"frame: {stale_code}; old lease release: {lease_outcome}")
