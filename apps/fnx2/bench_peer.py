"""The receiving process of `fornax bench fnx2`: an FNX2, raw-socket or gRPC sink on loopback.

Run as `python -m apps.fnx2.bench_peer MODE [LOOP]` (LOOP: asyncio or uvloop; gRPC keeps
its own asyncio loop); it prints its port, then serves until its stdin closes. A separate
process, so sender and receiver each get their own core.
"""

from __future__ import annotations

import asyncio
import struct
import sys

import numpy as np

from libs.fnx2.channel.receiver import Fnx2Receiver, ReceiverConfig, StageOutput, StageWork, start_server
from libs.fnx2.wire.control import ChannelBinding
from libs.fnx2.wire.tensor import DType, Tensor, TensorDescriptor, TensorKind
from libs.service.channels import MAX_MESSAGE_BYTES
from services.stage_worker.leases import ReceiverLimits, ReceiverState

BENCH_BINDING = ChannelBinding(
    "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", "sha256:" + "b" * 64, "sha256:" + "c" * 64,
    "bench-stage", "99999999-9999-4999-8999-999999999999")
ACK = struct.Struct("!Q")
GRPC_METHOD = "/fornax.bench.v1.BytesSink/Stream"


class BenchHandler:
    """Decode frames echo their activation rows; prefill frames answer one token id per row."""

    async def execute(self, work: StageWork) -> StageOutput:
        tensor = work.batch.tensor
        if tensor.descriptor.rows <= 64:
            return StageOutput(tensor)
        ids = np.zeros(tensor.descriptor.rows, dtype=np.int32)
        return StageOutput(Tensor(TensorDescriptor(TensorKind.TOKEN_IDS, DType.INT32, ids.shape), ids))

    def forget(self, request_id: str, execution_lease_id: str) -> None:
        return None


class RawSink(asyncio.BufferedProtocol):
    """The raw-socket baseline: 8-byte length + body, received straight into a buffer
    allocated for that body (the same technique FNX2 uses), answered by an 8-byte reply
    (bodies up to 64 KiB are echoed, for the ping-pong)."""

    def __init__(self) -> None:
        self._head = bytearray(8)
        self._target = memoryview(self._head)
        self._filled = 0
        self._body = False

    def connection_made(self, transport) -> None:
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._target[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._filled < len(self._target):
            return
        if not self._body:
            (size,) = ACK.unpack(self._head)
            self._target, self._filled, self._body = np.empty(size, np.uint8).data, 0, True
            return
        size = len(self._target)
        reply = ACK.pack(size)
        self._transport.write(reply + self._target.tobytes() if size <= 64 * 1024 else reply)
        self._target, self._filled, self._body = memoryview(self._head), 0, False


async def _serve_grpc() -> tuple[object, int]:
    import grpc

    async def stream(request_iterator, context):
        async for message in request_iterator:
            yield ACK.pack(len(message))

    handler = grpc.method_handlers_generic_handler("fornax.bench.v1.BytesSink", {
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
    })
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def main(mode: str) -> None:
    if mode == "grpc":
        server, port = await _serve_grpc()
    else:
        if mode == "fnx2":
            limits = ReceiverLimits(frames=4, live_requests=4096, sequences=4096)
            receiver = Fnx2Receiver(ReceiverConfig(BENCH_BINDING), BenchHandler(),
                                    ReceiverState(BENCH_BINDING, limits))
            server = await start_server(receiver)
        else:
            server = await asyncio.get_running_loop().create_server(RawSink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    from libs.service.event_loop import EventLoopKind, run

    kind = EventLoopKind(sys.argv[2]) if len(sys.argv) > 2 else EventLoopKind.ASYNCIO
    run(main(sys.argv[1]), EventLoopKind.ASYNCIO if sys.argv[1] == "grpc" else kind)
