"""`fornax fuzz fnx2`: mutated frames against a live receiver over a real TCP socket.

The receiver is the library's own `Fnx2Receiver` on 127.0.0.1, with a doubling stage
handler. The fuzzing peer completes the hello like any sender, then sends one mutated
frame at a time and waits for its answer. Every frame a receiver reads is answered by
exactly one frame that is not a CREDIT (RESULT, ACK or ERROR), so the peer counts:

- a crash: the channel closed without a terminal ERROR, the receiver answered INTERNAL,
  or the receiver recorded an unexpected exception;
- a hang: no answer within the response timeout;
- max allocation: the largest receive buffer the receiver took for one frame body.

After a terminal ERROR (or a shutdown ACK) the peer reconnects and handshakes again.
Every other connection negotiates the `compact_meta` extension, so compact BATCH and
RESULT seeds reach the compact decoder there and its "not negotiated" refusal elsewhere.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import sys
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from apps.fnx2.fuzz import Mutator, Seed
from apps.fnx2.fuzz_receiver import BINDING, WIDTH
from libs.fnx2.wire.admission import EXT_INBAND_ADMISSION, Admission, OutputMode, Sampling, f32_bits
from libs.fnx2.wire.codec import PRELUDE_BYTES, Message, decode_frame, encode_frame, parse_prelude
from libs.fnx2.wire.control import (
    EXT_COMPACT_META,
    EXT_LEASE_SEQUENCE,
    Ack,
    AckHello,
    Cancel,
    Control,
    Credit,
    ErrorMessage,
    Release,
)
from libs.fnx2.wire.errors import TERMINAL_CODES, ErrorCode
from libs.fnx2.wire.leases import derive_execution_lease_id
from libs.fnx2.wire.messages import (
    Batch,
    BatchDescriptor,
    Phase,
    Result,
    SequenceResult,
    SequenceSlice,
    SequenceStatus,
    Timings,
)
from libs.fnx2.wire.tensor import DType, Tensor, TensorKind

MINUTE_NS = 60 * 10**9


@dataclass(frozen=True)
class FuzzConfig:
    frames: int = 100_000
    seed: int = 20261201
    response_timeout_s: float = 5.0
    peers: int = 1  # concurrent fuzzing connections
    receiver_module: str = "apps.fnx2.fuzz_receiver"  # run as `python -m` in its own process


@dataclass
class FuzzReport:
    frames: int = 0
    answered: int = 0
    crashes: int = 0
    hangs: int = 0
    reconnects: int = 0
    max_allocation_bytes: int = 0
    rss_growth_bytes: int = 0
    seconds: float = 0.0
    codes: collections.Counter = field(default_factory=collections.Counter)
    crash_samples: list[str] = field(default_factory=list)

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0

    @property
    def ok(self) -> bool:
        return self.crashes == 0 and self.hangs == 0 and self.answered == self.frames

    def to_json(self) -> dict:
        return {
            "frames": self.frames, "answered": self.answered, "crashes": self.crashes,
            "hangs": self.hangs, "reconnects": self.reconnects,
            "max_allocation_bytes": self.max_allocation_bytes,
            "rss_growth_bytes": self.rss_growth_bytes, "seconds": round(self.seconds, 3),
            "frames_per_s": round(self.frames_per_s, 1), "codes": dict(sorted(self.codes.items())),
            "crash_samples": self.crash_samples[:10], "ok": self.ok,
            "figure_class": "physical (measured on this host)",
        }


def seeds() -> list[Seed]:
    """One valid frame of every kind, bound to the fuzzed receiver."""
    request = "11111111-1111-4111-8111-111111111111"
    lease = derive_execution_lease_id(BINDING.plan_generation_id, BINDING.plan_id,
                                      BINDING.plan_hash, request)
    control = "dddddddd-dddd-4ddd-8ddd-dddddddddddd"
    prefill = _batch(Phase.PREFILL, request, lease, rows=3, sequence_no=0, position=0)
    decode = _batch(Phase.DECODE, request, lease, rows=1, sequence_no=1, position=3, epoch=1)
    messages: list[Message] = [prefill, decode, prefill, decode,
                Cancel(control, BINDING, request, lease),
                Release(control, BINDING, request, lease, None),
                Control("credit_refresh", control, BINDING),
                Control("extensions", control, BINDING, extensions=("multi_inflight", "timings")),
                Control("admit", control, BINDING, admission=Admission(
                    request, lease, 16, OutputMode.SAMPLED_TOKENS,
                    Sampling(temperature_f32=f32_bits(0.5), logit_bias=((7, f32_bits(-1.0)),)),
                    b"\x01", (1, 2, 3), ())),
                Credit(1, 2, 3, 4, 5, 6, 7),
                ErrorMessage("METADATA", "x", None),
                Ack("hello", control, AckHello(BINDING))]
    out = []
    for message in messages:
        encoded = encode_frame(message, 0)
        meta = decode_frame(encoded.to_bytes()).message.to_meta()
        out.append(Seed(message.KIND, meta, bytes(encoded.payload)))
    # Compact seeds, one with a lease_sequence column (negotiated with compact_meta).
    numbered = dataclasses.replace(prefill, batch=dataclasses.replace(
        prefill.batch, sequences=(prefill.batch.sequences[0]._replace(lease_sequence=1),)))
    for message in (prefill, decode, numbered, _result(decode), Credit(1, 2, 3, 4, 5, 6, 7, 8)):
        encoded = encode_frame(message, 0, compact_meta=True)
        metadata = encoded.header[PRELUDE_BYTES:]
        out.append(Seed(message.KIND, {}, bytes(encoded.payload), compact=metadata))
    return out


def _result(batch: Batch) -> Result:
    """The RESULT a receiver would send for a one-sequence batch (a receiver refuses it)."""
    item = batch.batch.sequences[0]
    answer = SequenceResult(item.request_id, item.execution_lease_id, item.request_sequence_no,
                            SequenceStatus.OK, 0, item.input_row_count, 0, item.input_row_count,
                            item.kv_epoch, item.kv_epoch + 1, None, None, Timings(1, 2, 3, 4))
    failed = SequenceResult("22222222-2222-4222-8222-222222222222", item.execution_lease_id, 0,
                            SequenceStatus.FAILED, 1, 1, None, 0, 0, 0, "FAILED", "x", Timings())
    return Result(batch.batch.batch_id, 0, batch.manifest_hash, (answer, failed), batch.tensor)


def _batch(phase: Phase, request: str, lease: str, *, rows: int, sequence_no: int,
           position: int, epoch: int = 0) -> Batch:
    item = SequenceSlice(request, sequence_no, 0, rows, position, epoch, MINUTE_NS, lease, "t", "s")
    descriptor = BatchDescriptor(str(uuid.UUID(int=rows, version=4)), 0, phase, rows, (item,))
    values = np.arange(rows * WIDTH, dtype=np.float32).reshape(rows, WIDTH)
    return Batch(BINDING.plan_id, BINDING.plan_hash, BINDING.manifest_hash, "stage-0", "stage-1",
                 descriptor, Tensor.from_array(TensorKind.ACTIVATION, DType.FP32, values))


class _Peer:
    """The fuzzing sender: one connection at a time, hello answered, frames numbered."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.port, self.timeout_s = port, timeout_s
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.next_out = 0
        self.connections = 0

    async def connect(self) -> None:
        await self.close()
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        hello = await self.read()
        if not (isinstance(hello, Control) and hello.control == "hello"):
            raise RuntimeError(f"expected the receiver's hello, got {hello!r}")
        self.next_out = 0
        self.send(encode_frame(Ack("hello", hello.control_id, AckHello(BINDING)), 0).to_bytes())
        self.next_out = 1
        credit = await self.read()
        if not isinstance(credit, Credit):
            raise RuntimeError(f"expected the first CREDIT, got {credit!r}")
        self.connections += 1
        if self.connections % 2 == 0:
            await self._negotiate_compact()

    async def _negotiate_compact(self) -> None:
        offer = Control("extensions", "eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee", BINDING,
                        extensions=(EXT_COMPACT_META, EXT_LEASE_SEQUENCE, EXT_INBAND_ADMISSION))
        self.send(encode_frame(offer, self.next_out).to_bytes())
        self.next_out += 1
        ack, credit = await self.read(), await self.read()
        if not (isinstance(ack, Ack) and isinstance(credit, Credit)):
            raise RuntimeError(f"expected the extensions ACK and a CREDIT, got {ack!r}, {credit!r}")

    def send(self, data: bytes) -> None:
        if self.writer is None:
            raise RuntimeError("send before connect")
        self.writer.write(data)

    async def read(self):
        head = await self.reader.readexactly(PRELUDE_BYTES)
        prelude = parse_prelude(head)
        body = await self.reader.readexactly(prelude.body_bytes)
        return decode_frame(head + body).message

    async def answer(self):
        """The next frame that is not a CREDIT; None when the channel closed."""
        async with asyncio.timeout(self.timeout_s):
            while True:
                try:
                    message = await self.read()
                except (asyncio.IncompleteReadError, ConnectionError):
                    return None
                if not isinstance(message, Credit):
                    return message

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except (ConnectionError, OSError):
                pass
            self.writer = self.reader = None


def _ends_channel(message) -> bool:
    if isinstance(message, ErrorMessage):
        return message.code in TERMINAL_CODES or message.code == ErrorCode.INTERNAL
    return isinstance(message, Ack) and message.operation == "shutdown"


async def run_fuzz(config: FuzzConfig) -> FuzzReport:
    """Fuzz a receiver in its own process with `config.peers` connections at a time."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", config.receiver_module, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None  # both are pipes
    report = FuzzReport()
    try:
        port = int((await process.stdout.readline()).decode())
        rss_before = _rss_kib(process.pid, "VmRSS")
        base, started = seeds(), time.perf_counter()
        shares = [config.frames // config.peers + (i < config.frames % config.peers)
                  for i in range(config.peers)]
        await asyncio.gather(*(_fuzz_peer(port, config, config.seed + i, share, base, report)
                               for i, share in enumerate(shares)))
        report.seconds = time.perf_counter() - started
        report.rss_growth_bytes = max(0, _rss_kib(process.pid, "VmHWM") - rss_before) * 1024
    finally:
        process.stdin.close()
        stats = json.loads((await process.stdout.readline()).decode() or "{}")
        await process.wait()
    # A receiver that died early reported nothing: that is a crash too.
    report.crashes += stats.get("unexpected_errors", 1)
    report.max_allocation_bytes = stats.get("largest_body_bytes", 0)
    return report


def _rss_kib(pid: int, field_name: str) -> int:
    """VmRSS (now) or VmHWM (peak) of a process, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


async def _fuzz_peer(port: int, config: FuzzConfig, seed: int, frames: int, base: list[Seed],
                     report: FuzzReport) -> None:
    peer, mutator = _Peer(port, config.response_timeout_s), Mutator(np.random.default_rng(seed))
    try:
        await peer.connect()
        for index in range(frames):
            await _one(peer, mutator, base[index % len(base)], report)
    finally:
        await peer.close()


async def _one(peer: _Peer, mutator: Mutator, seed: Seed, report: FuzzReport) -> None:
    data = mutator.mutate(seed, peer.next_out)
    peer.next_out += 1
    report.frames += 1
    peer.send(data)
    try:
        message = await peer.answer()
    except TimeoutError:
        report.hangs += 1
        report.crash_samples.append(f"hang after {data[:PRELUDE_BYTES + 160]!r}")
        await peer.connect()
        report.reconnects += 1
        return
    if message is None:
        report.crashes += 1
        report.crash_samples.append(f"closed without ERROR after {data[:PRELUDE_BYTES + 160]!r}")
    else:
        report.answered += 1
        report.codes[message.code if isinstance(message, ErrorMessage)
                     else type(message).__name__.upper()] += 1
        if isinstance(message, ErrorMessage) and message.code == ErrorCode.INTERNAL:
            report.crashes += 1
            report.crash_samples.append(f"INTERNAL {message.message} after {data[:200]!r}")
    if message is None or _ends_channel(message):
        await peer.connect()
        report.reconnects += 1
