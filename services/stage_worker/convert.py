"""Protobuf <-> stage-worker domain values. Protobuf stops here."""

from __future__ import annotations

from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.common.kinds import Backend, DType
from libs.common.proto import backend_from_pb, dtype_from_pb
from libs.fnx2.wire.admission import Admission, OutputMode, f32_value
from libs.model.kv_blocks import KV_BLOCK_TOKENS, blocks_for, prefix_chain
from libs.model.kv_store import KV_DTYPES
from libs.model.sampling import SamplingParams
from libs.service.errors import InvalidArgument
from libs.structured.spec import GrammarSpec
from services.stage_worker.lifecycle import StageState
from services.stage_worker.phase_totals import Phase, PhaseTotals
from services.stage_worker.runtime import (
    HealthSnapshot,
    LoadSpec,
    PlanBinding,
    SequenceAdmission,
    check_max_activations,
)
from services.stage_worker.service_times import ServiceTimes

STATE_TO_PB = {
    StageState.UNLOADED: pb.STAGE_STATE_UNLOADED,
    StageState.LOADING: pb.STAGE_STATE_LOADING,
    StageState.READY: pb.STAGE_STATE_READY,
    StageState.EXECUTING: pb.STAGE_STATE_EXECUTING,
    StageState.DRAINING: pb.STAGE_STATE_DRAINING,
    StageState.FAILED: pb.STAGE_STATE_FAILED,
}


def _required(value: str, field: str) -> str:
    if not value:
        raise InvalidArgument(f"{field} is required", field=field)
    return value


def _input_dtype(spec: pb.StageSpec) -> DType | None:
    """The hop into the stage; unspecified = the same dtype as the hop out of it."""
    if spec.input_boundary_dtype == common_pb2.ELEMENT_TYPE_UNSPECIFIED:
        return None
    return dtype_from_pb(spec.input_boundary_dtype, "spec.input_boundary_dtype")


def load_spec_from_pb(request: pb.LoadStageRequest) -> LoadSpec:
    if not request.HasField("spec"):
        raise InvalidArgument("spec is required", field="spec")
    spec = request.spec
    backend = backend_from_pb(spec.backend, "spec.backend")
    boundary_dtype = dtype_from_pb(spec.boundary_dtype, "spec.boundary_dtype")
    if spec.output_mode == pb.OUTPUT_MODE_UNSPECIFIED and spec.stage_index == spec.stage_count - 1:
        raise InvalidArgument("the final stage needs an output_mode", field="spec.output_mode")
    if spec.device not in ("cpu", "gpu"):
        raise InvalidArgument("device must be 'cpu' or 'gpu'", field="spec.device")
    plan = spec.plan
    return LoadSpec(
        stage_index=spec.stage_index,
        stage_count=spec.stage_count,
        layer_start=spec.layer_range.layer_start,
        layer_end=spec.layer_range.layer_end_exclusive,
        plan=PlanBinding(
            plan_id=_required(plan.plan_id, "spec.plan.plan_id"),
            plan_hash=_required(plan.plan_hash, "spec.plan.plan_hash"),
            plan_generation_id=_required(plan.plan_generation_id, "spec.plan.plan_generation_id"),
        ),
        backend=backend,
        boundary_dtype=boundary_dtype,
        input_boundary_dtype=_input_dtype(spec),
        device=spec.device,
        checkpoint_dir=spec.checkpoint_dir or None,
        artifact_dir=spec.artifact_dir or None,
        artifact_source=spec.artifact_source_address or None,
        manifest_hash=spec.manifest_hash or None,
        next_hop=spec.next_hop_address or None,
        next_hop_manifest_hash=spec.next_hop_manifest_hash or None,
        kv_limit_bytes=spec.kv_limit_bytes,
        return_logits=spec.output_mode == pb.OUTPUT_MODE_LOGITS,
        previous_hop_identity=spec.previous_hop_identity or None,
        next_hop_identity=spec.next_hop_identity or None,
        kv_dtype=_kv_dtype(spec.kv_dtype),
        max_activations=_max_activations(spec.max_activations, backend),
    )


def _kv_dtype(value: str) -> str | None:
    if value and value not in KV_DTYPES:
        raise InvalidArgument(f"KV dtype {value!r} is not one of {', '.join(KV_DTYPES)}", reason="KV_DTYPE",
                              field="spec.kv_dtype")
    return value or None


def _max_activations(value: str, backend: Backend) -> str | None:
    check_max_activations(value, backend)  # MAX_ACTIVATIONS_UNSUPPORTED / MAX_ACTIVATIONS_BACKEND
    return value or None


def admission_pb_from_inband(admission: Admission) -> pb.AdmitSequenceRequest:
    """An in-band admission (FNX2 CONTROL admit) as the control plane's message, so both
    carry the same rules and errors (`admission_from_pb`)."""
    s = admission.sampling
    sampling = pb.SamplingSpec(
        temperature=f32_value(s.temperature_f32), top_k=s.top_k, top_p=f32_value(s.top_p_f32), seed=s.seed,
        presence_penalty=f32_value(s.presence_penalty_f32), frequency_penalty=f32_value(s.frequency_penalty_f32),
        logit_bias={token: f32_value(bits) for token, bits in s.logit_bias},
        first_sample_position=s.first_sample_position, generated_token_ids=s.generated_token_ids,
        logprobs=s.top_logprobs is not None, top_logprobs=s.top_logprobs or 0,
    )
    if s.grammar is not None:
        sampling.grammar.CopyFrom(pb.GrammarConstraint(lark_grammar=s.grammar.lark,
                                                       end_token_ids=s.grammar.end_token_ids))
    return pb.AdmitSequenceRequest(
        target_request_id=admission.request_id, execution_lease_id=admission.execution_lease_id,
        reserve_tokens=admission.reserve_tokens, sampling=sampling,
        output_mode=pb.OUTPUT_MODE_LOGITS if admission.output_mode is OutputMode.LOGITS
        else pb.OUTPUT_MODE_SAMPLED_TOKENS,
        prefix_salt=admission.prefix_salt, prefix_token_ids=admission.prefix_token_ids,
        prefix_block_hashes=admission.prefix_block_hashes,
    )


def admission_from_pb(request: pb.AdmitSequenceRequest, block_bytes: int) -> SequenceAdmission:
    """The admission, its KV reservation rounded up to whole blocks of `block_bytes`."""
    request_id = _required(request.target_request_id, "target_request_id")
    lease_id = _required(request.execution_lease_id, "execution_lease_id")
    if request.reserve_tokens == 0:
        raise InvalidArgument("reserve_tokens must be positive", field="reserve_tokens")
    chain = _prefix_chain_from_pb(request)
    s = request.sampling
    sampling = SamplingParams(
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p if s.top_p > 0 else 1.0,
        seed=s.seed,
        return_logits=request.output_mode == pb.OUTPUT_MODE_LOGITS,
        presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty,
        logit_bias=tuple(sorted(s.logit_bias.items())),
        grammar=_grammar_from_pb(s.grammar) if s.HasField("grammar") else None,
        first_sample_position=s.first_sample_position,
        generated_token_ids=tuple(s.generated_token_ids),
        top_logprobs=s.top_logprobs if s.logprobs else None,
    )
    reserve = blocks_for(request.reserve_tokens) * block_bytes
    return SequenceAdmission(request_id, lease_id, reserve, sampling, prefix_chain=chain,
                             prefix_salt=request.prefix_salt if chain else b"")


def publish_chain_from_pb(request: pb.ReleaseRequestRequest, salt: bytes) -> tuple[bytes, ...]:
    """The hashes of a released lease's tokens under its admission's salt (empty: publish nothing).
    Tokens sent for a lease admitted without a salt are refused (PREFIX_CHAIN)."""
    if not request.publish_token_ids:
        return ()
    if not salt:
        raise InvalidArgument("publish_token_ids need a lease admitted with a prefix_salt", reason="PREFIX_CHAIN",
                              field="publish_token_ids")
    return tuple(prefix_chain(salt, request.publish_token_ids))


def _prefix_chain_from_pb(request: pb.AdmitSequenceRequest) -> tuple[bytes, ...]:
    """The prompt's block hashes as this stage computes them from the tokens it was sent.

    The orchestrator's chain must equal them: a stage keys blocks only by hashes it computed
    itself, so a forged chain is refused and can never reach another prompt's blocks.
    """
    if not request.prefix_salt:
        if request.prefix_block_hashes or request.prefix_token_ids:
            raise InvalidArgument("prefix hashes and tokens need a prefix_salt", reason="PREFIX_CHAIN",
                                  field="prefix_salt")
        return ()
    if len(request.prefix_token_ids) > request.reserve_tokens:
        raise InvalidArgument(
            f"{len(request.prefix_token_ids)} prefix tokens exceed the {request.reserve_tokens} reserved",
            reason="PREFIX_CHAIN", field="prefix_token_ids",
        )
    chain = tuple(prefix_chain(request.prefix_salt, request.prefix_token_ids))
    if tuple(request.prefix_block_hashes) != chain:
        raise InvalidArgument(
            f"the prefix chain ({len(request.prefix_block_hashes)} hashes) does not match the "
            f"{len(chain)} blocks of {KV_BLOCK_TOKENS} tokens it was sent",
            reason="PREFIX_CHAIN", field="prefix_block_hashes",
        )
    return chain


def _grammar_from_pb(grammar: pb.GrammarConstraint) -> GrammarSpec:
    if not grammar.lark_grammar or not grammar.end_token_ids:
        raise InvalidArgument("a grammar needs lark_grammar and end_token_ids", reason="INVALID_GRAMMAR",
                              field="sampling.grammar")
    return GrammarSpec(grammar.lark_grammar, tuple(grammar.end_token_ids))


def health_to_pb(snapshot: HealthSnapshot) -> pb.GetHealthResponse:
    plan = snapshot.plan
    reply = pb.GetHealthResponse(
        state=STATE_TO_PB[snapshot.state],
        inflight_batches=snapshot.inflight_batches,
        live_sequences=snapshot.live_sequences,
        kv_bytes_used=snapshot.kv_bytes_used,
        kv_bytes_limit=snapshot.kv_bytes_limit,
        kv_bytes_high_water=snapshot.kv_bytes_high_water,
        inflight_batches_high_water=snapshot.inflight_high_water,
        batches_executed=snapshot.batches_executed,
        failure_reason=snapshot.failure_reason,
        phase_totals=_totals_to_pb(snapshot.phase_totals),
        service_times=_service_to_pb(snapshot.service_times),
        plan=common_pb2.PlanBinding(
            plan_id=plan.plan_id, plan_hash=plan.plan_hash, plan_generation_id=plan.plan_generation_id
        )
        if plan
        else None,
    )
    blocks = snapshot.kv_blocks
    if blocks is not None:
        reply.kv_block_tokens = snapshot.kv_block_tokens
        reply.kv_blocks_total = blocks.total_blocks
        reply.kv_blocks_free = blocks.free_blocks
        reply.kv_blocks_cached = blocks.cached_blocks
        reply.prefix_hit_blocks = blocks.hit_blocks
        reply.prefix_missed_blocks = blocks.missed_blocks
        reply.kv_evicted_blocks = blocks.evicted_blocks
    return reply


def _totals_to_pb(totals: PhaseTotals | None) -> pb.PhaseTotals | None:
    if totals is None:
        return None
    t = totals.total_ns
    occupancy = totals.occupancy.totals()
    return pb.PhaseTotals(queue_ns=t[Phase.QUEUE], compute_ns=t[Phase.COMPUTE], pack_ns=t[Phase.PACK],
                          transfer_ns=t[Phase.TRANSFER], unpack_ns=t[Phase.UNPACK],
                          batches=totals.count[Phase.COMPUTE], busy_ns=occupancy.busy_ns,
                          credit_wait_ns=occupancy.credit_wait_ns, input_wait_ns=occupancy.input_wait_ns)


def _service_to_pb(times: ServiceTimes | None) -> pb.ServiceTimes | None:
    if times is None:
        return None
    recent = times.recent_decode()
    return pb.ServiceTimes(
        decode_service_ns=times.decode_service_ns, decode_microbatches=times.decode_microbatches,
        decode_rows=times.decode_rows, decode_past_tokens=times.decode_past_tokens,
        prefill_service_ns=times.prefill_service_ns,
        prefill_tokens=times.prefill_tokens, prefill_batches=times.prefill_batches,
        recent_decode_service_ns=recent.mean_service_ns, recent_decode_microbatches=recent.microbatches,
        recent_decode_rows=recent.mean_rows, timing=times.timing)
