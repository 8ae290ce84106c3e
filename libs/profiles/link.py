"""Measure a link with real FNX2 frames: a short-lived echo listener and the sender that times it.

The receiving worker opens a probe listener (`open_probe`): an FNX2 receiver with its own
binding (derived from a probe id), TLS and a peer policy admitting one named identity, on a
port of its own, so the serving data-plane port and its admission stay as they are. Its
handler echoes small frames and answers large ones with one token id per row.

The sending worker (`measure_link`) opens a channel to it, as the data plane does, and times
- the round trip of a 32 KiB activation frame and its echo (decode-shaped), and
- moving 16 MiB activation frames (prefill-shaped): bytes over the time from send to answer.
Each is repeated `runs` times into a `Figure`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from libs.fnx2.channel.listener import PeerPolicy
from libs.fnx2.channel.receiver import Fnx2Receiver, ReceiverConfig, StageOutput, StageWork, start_server
from libs.fnx2.channel.sender import Fnx2Client
from libs.fnx2.channel.session import SessionRules
from libs.fnx2.wire.control import ChannelBinding
from libs.fnx2.wire.leases import derive_execution_lease_id
from libs.fnx2.wire.messages import Batch, BatchDescriptor, Phase, SequenceSlice
from libs.fnx2.wire.tensor import DType, Tensor, TensorDescriptor, TensorKind
from libs.profiles.schema import LINK_RTT_BYTES, LINK_THROUGHPUT_BYTES, Figure

PROBE_STAGE = "link-probe"
PROBE_SOURCE = "link-probe-sender"
ECHO_LIMIT_BYTES = 64 * 1024
WIDTH = 2048  # bf16 activation width of every probe frame
LEASE_BUDGET_NS = 120 * 10**9
PREFILL_SEQUENCES = 16


def probe_binding(probe_id: str) -> ChannelBinding:
    """Both ends derive the probe channel's binding from the probe id alone."""
    uuid.UUID(probe_id)  # a probe id is a UUID; anything else is refused here
    digest = hashlib.sha256(f"fornax:link-probe:{probe_id}".encode()).hexdigest()
    manifest = hashlib.sha256(f"fornax:link-probe-manifest:{probe_id}".encode()).hexdigest()
    return ChannelBinding(probe_id, "sha256:" + digest, "sha256:" + manifest, PROBE_STAGE,
                          str(uuid.uuid5(uuid.NAMESPACE_URL, f"fornax:link-probe:{probe_id}")))


class EchoHandler:
    """Echo frames up to 64 KiB; answer larger ones with one int32 per row."""

    async def execute(self, work: StageWork) -> StageOutput:
        tensor = work.batch.tensor
        if tensor.descriptor.payload_bytes <= ECHO_LIMIT_BYTES:
            return StageOutput(tensor)
        ids = np.zeros(tensor.descriptor.rows, dtype=np.int32)
        return StageOutput(Tensor(TensorDescriptor(TensorKind.TOKEN_IDS, DType.INT32, ids.shape), ids))

    def forget(self, request_id: str, execution_lease_id: str) -> None:
        return None


@dataclass
class Probe:
    """An open probe listener; `close` ends it and every channel on it."""

    probe_id: str
    port: int
    receiver: Fnx2Receiver
    server: asyncio.AbstractServer

    async def close(self) -> None:
        self.server.close()
        await self.receiver.close()
        await self.server.wait_closed()


async def open_probe(probe_id: str, host: str, peer_policy: PeerPolicy | None, state: SessionRules,
                     ssl=None) -> Probe:
    """`state`: the session rules of the probe's own binding (`probe_binding(probe_id)`), from
    the worker that opens it."""
    receiver = Fnx2Receiver(ReceiverConfig(probe_binding(probe_id), peer_policy=peer_policy), EchoHandler(),
                            state)
    server = await start_server(receiver, host, 0, ssl=None if peer_policy is not None else ssl)
    return Probe(probe_id, server.sockets[0].getsockname()[1], receiver, server)


def rows_for(frame_bytes: int) -> int:
    """Rows of a WIDTH-wide bf16 frame of (about) frame_bytes."""
    return max(1, frame_bytes // (WIDTH * 2))


def probe_batch(binding: ChannelBinding, phase: Phase, rows_per_seq: int, requests: list[str], step: int) -> Batch:
    """Step `step` of every request (sequence `step`, KV epoch `step`), finite bf16 values."""
    position = 0 if phase is Phase.PREFILL else rows_per_seq + step - 1
    b = binding
    slices = tuple(
        SequenceSlice(r, step, i * rows_per_seq, rows_per_seq, position, step, LEASE_BUDGET_NS,
                      derive_execution_lease_id(b.plan_generation_id, b.plan_id, b.plan_hash, r), "probe", "probe")
        for i, r in enumerate(requests))
    rows = len(requests) * rows_per_seq
    values = np.full((rows, WIDTH), 0x3F80, dtype=np.uint16)  # 1.0 in bf16
    descriptor = BatchDescriptor(str(uuid.uuid4()), step, phase, rows, slices)
    return Batch(b.plan_id, b.plan_hash, b.manifest_hash, PROBE_SOURCE, b.stage_id, descriptor,
                 Tensor.from_array("activation", "bf16", values))


@dataclass(frozen=True)
class LinkSamples:
    rtt_s: list[float]
    throughput_bytes_per_s: list[float]

    def figures(self) -> tuple[Figure, Figure]:
        return Figure.of(self.rtt_s, "s"), Figure.of(self.throughput_bytes_per_s, "B/s")


async def _checked(client: Fnx2Client, batch: Batch) -> None:
    result = await client.submit(batch)
    bad = [item for item in result.results if item.status.value != "ok"]
    if bad:
        raise RuntimeError(f"the probe refused a frame: {bad[0].status.value}")


async def measure_link(client: Fnx2Client, binding: ChannelBinding, runs: int, rtt_iters: int = 20,
                       rtt_bytes: int = LINK_RTT_BYTES, throughput_bytes: int = LINK_THROUGHPUT_BYTES,
                       clock: Callable[[], float] = time.perf_counter) -> LinkSamples:
    """`runs` samples of each: the median round trip over `rtt_iters` 32 KiB frames, and the rate
    of one `throughput_bytes` frame from send to answer (after one untimed warm-up of each)."""
    if runs < 1 or rtt_iters < 1:
        raise ValueError("runs and rtt_iters must be at least 1")
    # Decode-shaped: one row per sequence, as many sequences as the frame has rows.
    requests = [str(uuid.uuid4()) for _ in range(rows_for(rtt_bytes))]
    await _checked(client, probe_batch(binding, Phase.PREFILL, 1, requests, 0))
    step = 1
    rtts: list[float] = []
    for _ in range(runs):
        times = []
        for _ in range(rtt_iters):
            batch = probe_batch(binding, Phase.DECODE, 1, requests, step)
            step += 1
            times.append(await _timed(clock, _checked(client, batch)))
        rtts.append(float(np.median(times)))
    # Prefill-shaped: PREFILL_SEQUENCES prompts sharing the frame's rows.
    per_seq = max(1, rows_for(throughput_bytes) // PREFILL_SEQUENCES)

    def big() -> Batch:
        return probe_batch(binding, Phase.PREFILL, per_seq, [str(uuid.uuid4()) for _ in range(PREFILL_SEQUENCES)], 0)

    await _checked(client, big())
    rates = []
    for _ in range(runs):
        batch = big()
        elapsed = await _timed(clock, _checked(client, batch))
        rates.append(batch.tensor.descriptor.payload_bytes / elapsed)
    return LinkSamples(rtts, rates)


async def _timed(clock: Callable[[], float], work: Awaitable[None]) -> float:
    start = clock()
    await work
    return max(clock() - start, 1e-9)
