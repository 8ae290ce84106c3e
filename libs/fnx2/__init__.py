"""FNX2: the binary data plane between stage workers (wire-compatible with FNX2 2.0).

Two layers: `libs.fnx2.wire` is the pure wire format (codec, compact metadata, typed
messages, tensors, lease-id derivation, the golden check; no asyncio, no sockets), and
`libs.fnx2.channel` the asyncio channels built on it (receiver, sender, framed stream,
zero-copy transport, listener limits). The stage's lease and KV epoch rules are not here:
the stage worker implements `SessionRules` (`services.stage_worker.leases`) and hands it in.

Receiving side (a stage worker):

    state = ReceiverState(binding, ReceiverLimits(frames=4))   # services.stage_worker.leases
    receiver = Fnx2Receiver(ReceiverConfig(binding, source_stage="stage-0",
                                           input_kind=TensorKind.ACTIVATION,
                                           input_dtype=DType.BF16, input_width=2048),
                            handler, state)
    server = await start_server(receiver, host, port, ssl=ssl_ctx_or_None)
    # same fast path in your own server:
    #     loop.create_server(receiver.protocol, host, port,
    #                        **server_options(config.listener, config.peer_policy))
    # or, for asyncio streams you already hold (slower: readexactly copies each body once):
    #     await serve_channel(reader, writer, receiver)

  `handler` implements `StageHandler`:
    async def execute(self, work: StageWork) -> StageOutput
        `work.batch` is the validated, typed `Batch`; `work.sequences` are only the
        sequences to execute (replays, rejected, cancelled and expired ones are handled by
        the library); `work.rows(slice)` / `work.inputs` give read-only numpy views
        (bf16 as uint16 bits: `bf16_to_float32`, `float32_to_bf16`). Return
        `StageOutput(Tensor.from_array(kind, dtype, rows), failures=(SequenceFailure(...),))`
        with the output rows of the non-failed sequences in `work.sequences` order.
    def forget(self, request_id, execution_lease_id) -> None
        drop that request's KV (called on release and on deadline expiry).
  The library runs the hello, credits (7 dimensions, receiver-authoritative), KV epochs,
  leases, exact replay / SEQUENCE_CONFLICT, tombstones, deadlines (budget -> local
  monotonic deadline), cancel, release, credit_refresh, shutdown, and real timings.
  `receiver.state` (the `SessionRules` handed in) is shared by all channels of the stage.
  Before a peer is trusted (`ReceiverConfig.listener`, `ListenerLimits`): handshake and
  idle timeouts, a connection cap, and bodies no larger than a small preamble until the
  hello ACK binds the channel (then no larger than the payload credit granted). With
  `ReceiverConfig.peer_policy = PeerPolicy(ssl_ctx_requiring_client_certs,
  allowed_peer_identities={"stage-0"})` the hello goes only to a peer whose certificate
  SAN/CN passes; others get one ERROR `PEER_REFUSED`. Leases past their deadline expire
  on a timer (`handler.forget` is called) with no message needed.

Sending side (the orchestrator, or a stage forwarding to the next hop):

    client = await Fnx2Client.connect(host, port, SenderConfig(binding_of_next_stage), ssl=...)
    result = await client.submit(batch)        # Batch -> Result, checked against the batch
    await client.cancel(request_id, lease_id); await client.release(request_id, lease_id, epoch)
    await client.credit_refresh(); await client.shutdown()

  Several `submit` calls may run concurrently when the receiver granted more than one
  frame (negotiated extension `multi_inflight`); the client keeps each source Batch until
  its RESULT (`client.unacknowledged()`). Build batch slices with
  `derive_execution_lease_id(...)` and `budget_from_deadline(local_deadline_ns, now_ns)`.
  Set `Batch.traceparent` to a W3C traceparent; it travels when `traceparent` was
  negotiated. Errors are `Fnx2Error` (`.code`: ErrorCode, `.terminal`); an ERROR frame from
  the peer is `RemoteError`.

Pure pieces: `encode_frame` / `decode_frame` (codec), `check_golden` (golden vector).
Extensions beyond 2.0 (`multi_inflight`, `traceparent`, `timings`, `compact_output`,
`sample_logprobs`, `lease_sequence`) are offered by the sender after the plain 2.0
handshake; a plain 2.0 peer declines with one recoverable ERROR.

Fencing ended leases: with `lease_sequence` negotiated, each slice carries
`SequenceSlice.lease_sequence`, the lease's place in its plan generation's opening order
(the orchestrator numbers them); the receiver fences every ended lease for the whole
generation with a watermark (the stage worker's `leases/lease_watermark.py`): memory for skipped numbers and a bounded
window of recent end reasons, never a tombstone per lease, so no run of requests in one
generation is ever refused. Its ACK of the extension offer carries `lease_sequence_next`
(`Fnx2Client.lease_sequence_next`): one above every number it has seen in the generation,
where a new sender's numbering starts so that it is never fenced by an earlier one's.
Without it (plain 2.0 peers) an ended lease gets a tombstone
kept for `ReceiverLimits.tombstone_ttl_ns` (the stage worker's `leases/tombstones.py`).
"""

from libs.fnx2.channel.listener import ListenerLimits, PeerIdentity, PeerPolicy, server_options
from libs.fnx2.channel.receiver import (
    Fnx2Receiver,
    ReceiverConfig,
    SequenceFailure,
    StageHandler,
    StageOutput,
    StageWork,
    serve_channel,
    start_server,
)
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.channel.session import SessionRules
from libs.fnx2.wire.codec import CodecLimits, ExpectedBinding, Frame, decode_frame, encode_frame
from libs.fnx2.wire.control import ChannelBinding, Credit
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error, RemoteError
from libs.fnx2.wire.golden import check_golden
from libs.fnx2.wire.leases import budget_from_deadline, derive_execution_lease_id
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
from libs.fnx2.wire.tensor import (
    DType,
    Tensor,
    TensorKind,
    bf16_to_float32,
    boundary_payload,
    float32_to_bf16,
    through_hop,
)

__all__ = [
    "Batch", "BatchDescriptor", "ChannelBinding", "CodecLimits", "Credit", "DType", "ErrorCode",
    "ExpectedBinding", "Fnx2Client", "Fnx2Error", "Fnx2Receiver", "Frame", "ListenerLimits",
    "PeerIdentity", "PeerPolicy", "Phase",
    "ReceiverConfig", "RemoteError", "Result",
    "SenderConfig", "SequenceFailure", "SessionRules", "SequenceResult", "SequenceSlice", "SequenceStatus",
    "StageHandler", "StageOutput", "StageWork", "Tensor", "TensorKind", "Timings",
    "bf16_to_float32", "boundary_payload", "budget_from_deadline", "check_golden", "decode_frame",
    "derive_execution_lease_id", "encode_frame", "float32_to_bf16", "serve_channel",
    "server_options", "start_server", "through_hop",
]
