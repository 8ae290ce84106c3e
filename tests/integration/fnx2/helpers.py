"""Factories for FNX2 channel tests: a binding, batches, a counting handler, a loopback pair."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field

import numpy as np

from libs.fnx2.channel.receiver import (
    Fnx2Receiver,
    ReceiverConfig,
    SequenceFailure,
    StageOutput,
    StageWork,
    start_server,
)
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.wire.control import ChannelBinding
from libs.fnx2.wire.leases import derive_execution_lease_id
from libs.fnx2.wire.messages import Batch, BatchDescriptor, Phase, SequenceSlice
from libs.fnx2.wire.tensor import Tensor
from services.stage_worker.leases import ReceiverLimits, ReceiverState

PLAN_ID = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
PLAN_HASH = "sha256:" + "b" * 64
MANIFEST_HASH = "sha256:" + "c" * 64
GENERATION = "99999999-9999-4999-8999-999999999999"
BINDING = ChannelBinding(PLAN_ID, PLAN_HASH, MANIFEST_HASH, "stage-1", GENERATION)
MINUTE_NS = 60 * 10**9


def lease_for(request_id: str, generation: str = GENERATION) -> str:
    return derive_execution_lease_id(generation, PLAN_ID, PLAN_HASH, request_id)


@dataclass(frozen=True)
class Seq:
    request_id: str
    rows: int = 1
    sequence_no: int = 0
    position: int = 0
    epoch: int = 0
    budget_ns: int = MINUTE_NS
    lease: str | None = None


def make_batch(phase: Phase, seqs: list[Seq], *, width: int = 4, seed: int = 0,
               plan_hash: str = PLAN_HASH) -> Batch:
    slices, cursor = [], 0
    for s in seqs:
        slices.append(SequenceSlice(s.request_id, s.sequence_no, cursor, s.rows, s.position, s.epoch,
                                    s.budget_ns, s.lease or lease_for(s.request_id), "t", "s"))
        cursor += s.rows
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((cursor, width)).astype(np.float32)
    descriptor = BatchDescriptor(str(uuid.uuid4()), 0, phase, cursor, tuple(slices))
    return Batch(PLAN_ID, plan_hash, MANIFEST_HASH, "stage-0", "stage-1", descriptor,
                 Tensor.from_array("activation", "fp32", values))


def new_request() -> str:
    return str(uuid.uuid4())


@dataclass
class DoublingHandler:
    """Output = 2 * input; records each executed request; can fail or block on demand."""

    executed: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    gate: asyncio.Event | None = None

    async def execute(self, work: StageWork) -> StageOutput:
        if self.gate is not None:
            await self.gate.wait()
        self.executed.extend(s.request_id for s in work.sequences)
        rows = [work.rows(s) * 2 for s in work.sequences if s.request_id not in self.fail]
        failures = tuple(SequenceFailure(r, "BACKEND", "injected") for r in self.fail
                         if any(s.request_id == r for s in work.sequences))
        tensor = Tensor.from_array("activation", "fp32", np.concatenate(rows)) if rows else None
        return StageOutput(tensor, failures)

    def forget(self, request_id: str, execution_lease_id: str) -> None:
        self.forgotten.append(request_id)


def stage_state(limits: ReceiverLimits | None = None, binding=BINDING) -> ReceiverState:
    """The stage's session rules, as a stage worker hands them to its receiver."""
    return ReceiverState(binding, limits or ReceiverLimits())


@contextlib.asynccontextmanager
async def loopback(handler, *, receiver_config: ReceiverConfig | None = None,
                   limits: ReceiverLimits | None = None,
                   sender_config: SenderConfig | None = None, clock=None,
                   server_ssl=None, client_ssl=None):
    config = receiver_config or ReceiverConfig(BINDING)
    receiver = Fnx2Receiver(config, handler, stage_state(limits, config.binding),
                            **({"clock": clock} if clock else {}))
    server = await start_server(receiver, ssl=server_ssl)
    port = server.sockets[0].getsockname()[1]
    client = await Fnx2Client.connect("127.0.0.1", port, sender_config or SenderConfig(BINDING),
                                      ssl=client_ssl,
                                      server_hostname="localhost" if client_ssl else None)
    try:
        yield client, receiver
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
