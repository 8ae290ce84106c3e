"""The live receiver of `fornax fuzz fnx2`, in its own process.

Run as `python -m apps.fnx2.fuzz_receiver [--handshake-timeout-s S] [--idle-timeout-s S]
[--max-connections N]`: it prints its TCP port, serves until its
stdin closes, then prints one JSON line of what it saw (unexpected exceptions, the
largest body buffer it took) and exits. A separate process, so the fuzzing peer and
the receiver each get a core and the receiver's memory is measured alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import numpy as np
import structlog

from libs.fnx2.channel.listener import ListenerLimits
from libs.fnx2.channel.receiver import (
    Fnx2Receiver,
    ReceiverConfig,
    StageOutput,
    StageWork,
    start_server,
)
from libs.fnx2.wire.admission import AckAdmit, Admission
from libs.fnx2.wire.control import ChannelBinding
from libs.fnx2.wire.tensor import DType, Tensor, TensorKind
from services.stage_worker.leases import ReceiverLimits, ReceiverState

BINDING = ChannelBinding("aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", "sha256:" + "b" * 64,
                         "sha256:" + "c" * 64, "stage-1", "99999999-9999-4999-8999-999999999999")
WIDTH = 4
# A 1 MiB payload credit bounds what a bound peer may make the receiver allocate per
# frame; the report's max_allocation_bytes checks it.
PAYLOAD_CREDIT_BYTES = 1 << 20


class DoublingHandler:
    async def execute(self, work: StageWork) -> StageOutput:
        rows = [work.rows(s).astype(np.float32) * 2 for s in work.sequences]
        return StageOutput(Tensor.from_array(TensorKind.ACTIVATION, DType.FP32, np.concatenate(rows)))

    def forget(self, request_id: str, execution_lease_id: str) -> None:
        return None

    # In-band lease control (inband_admission), so fuzzed admit frames reach the parser and
    # the receiver's admission path; a single stage, nothing forwarded.
    async def admit(self, admission: Admission) -> AckAdmit:
        return AckAdmit(admission.request_id, admission.execution_lease_id, True, (0,))

    async def cancel(self, request_id: str, execution_lease_id: str) -> tuple[int, ...]:
        return (0,)

    async def release(self, request_id: str, execution_lease_id: str) -> tuple[int, ...]:
        return (0,)


def build_receiver(listener: ListenerLimits | None = None) -> Fnx2Receiver:
    limits = ReceiverLimits(frames=2, live_requests=64, sequences=64,
                            payload_bytes=PAYLOAD_CREDIT_BYTES)
    return Fnx2Receiver(ReceiverConfig(BINDING, source_stage="stage-0",
                                       input_kind=TensorKind.ACTIVATION, input_dtype=DType.FP32,
                                       input_width=WIDTH, listener=listener or ListenerLimits()),
                        DoublingHandler(), ReceiverState(BINDING, limits))


def _listener(argv: list[str]) -> ListenerLimits:
    parser = argparse.ArgumentParser(prog="python -m apps.fnx2.fuzz_receiver")
    defaults = ListenerLimits()
    parser.add_argument("--handshake-timeout-s", type=float, default=defaults.handshake_timeout_s)
    parser.add_argument("--idle-timeout-s", type=float, default=defaults.idle_timeout_s)
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections)
    args = parser.parse_args(argv)
    return ListenerLimits(handshake_timeout_s=args.handshake_timeout_s,
                          idle_timeout_s=args.idle_timeout_s, max_connections=args.max_connections)


async def main(argv: list[str]) -> None:
    # stdout carries the port and the final figures; log lines go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    receiver = build_receiver(_listener(argv))
    server = await start_server(receiver)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    server.close()
    await receiver.close()
    print(json.dumps({"unexpected_errors": receiver.unexpected_errors,
                      "largest_body_bytes": receiver.largest_body_bytes}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
