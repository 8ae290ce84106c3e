from fornax.common.v1 import common_pb2 as _common_pb2
from fornax.evidence_registry.v1 import evidence_registry_pb2 as _evidence_registry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StageState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_STATE_UNSPECIFIED: _ClassVar[StageState]
    STAGE_STATE_UNLOADED: _ClassVar[StageState]
    STAGE_STATE_LOADING: _ClassVar[StageState]
    STAGE_STATE_READY: _ClassVar[StageState]
    STAGE_STATE_EXECUTING: _ClassVar[StageState]
    STAGE_STATE_DRAINING: _ClassVar[StageState]
    STAGE_STATE_FAILED: _ClassVar[StageState]

class OutputMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_MODE_UNSPECIFIED: _ClassVar[OutputMode]
    OUTPUT_MODE_SAMPLED_TOKENS: _ClassVar[OutputMode]
    OUTPUT_MODE_LOGITS: _ClassVar[OutputMode]
STAGE_STATE_UNSPECIFIED: StageState
STAGE_STATE_UNLOADED: StageState
STAGE_STATE_LOADING: StageState
STAGE_STATE_READY: StageState
STAGE_STATE_EXECUTING: StageState
STAGE_STATE_DRAINING: StageState
STAGE_STATE_FAILED: StageState
OUTPUT_MODE_UNSPECIFIED: OutputMode
OUTPUT_MODE_SAMPLED_TOKENS: OutputMode
OUTPUT_MODE_LOGITS: OutputMode

class GetCapabilitiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeviceInfo(_message.Message):
    __slots__ = ("kind", "name", "memory_total_bytes", "memory_available_bytes", "cpu_count", "cpu_quota_cores", "cpuset", "memory_limit_bytes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    CPU_QUOTA_CORES_FIELD_NUMBER: _ClassVar[int]
    CPUSET_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    memory_total_bytes: int
    memory_available_bytes: int
    cpu_count: int
    cpu_quota_cores: float
    cpuset: str
    memory_limit_bytes: int
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., cpu_count: _Optional[int] = ..., cpu_quota_cores: _Optional[float] = ..., cpuset: _Optional[str] = ..., memory_limit_bytes: _Optional[int] = ...) -> None: ...

class GetCapabilitiesResponse(_message.Message):
    __slots__ = ("backend", "backend_build", "device", "supported_dtypes", "supported_operations", "fnx2_versions", "data_plane_address", "stage_index", "worker_build", "data_plane_host", "identity", "weight_formats", "max_activations")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_BUILD_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_DTYPES_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    FNX2_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    WORKER_BUILD_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_HOST_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FORMATS_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    backend: _common_pb2.Backend
    backend_build: str
    device: DeviceInfo
    supported_dtypes: _containers.RepeatedScalarFieldContainer[_common_pb2.ElementType]
    supported_operations: _containers.RepeatedScalarFieldContainer[str]
    fnx2_versions: _containers.RepeatedScalarFieldContainer[str]
    data_plane_address: str
    stage_index: int
    worker_build: str
    data_plane_host: str
    identity: str
    weight_formats: _containers.RepeatedScalarFieldContainer[str]
    max_activations: str
    def __init__(self, backend: _Optional[_Union[_common_pb2.Backend, str]] = ..., backend_build: _Optional[str] = ..., device: _Optional[_Union[DeviceInfo, _Mapping]] = ..., supported_dtypes: _Optional[_Iterable[_Union[_common_pb2.ElementType, str]]] = ..., supported_operations: _Optional[_Iterable[str]] = ..., fnx2_versions: _Optional[_Iterable[str]] = ..., data_plane_address: _Optional[str] = ..., stage_index: _Optional[int] = ..., worker_build: _Optional[str] = ..., data_plane_host: _Optional[str] = ..., identity: _Optional[str] = ..., weight_formats: _Optional[_Iterable[str]] = ..., max_activations: _Optional[str] = ...) -> None: ...

class StageSpec(_message.Message):
    __slots__ = ("stage_index", "stage_count", "layer_range", "plan", "checkpoint_dir", "artifact_dir", "manifest_hash", "backend", "boundary_dtype", "next_hop_address", "kv_limit_bytes", "output_mode", "device", "next_hop_manifest_hash", "artifact_source_address", "input_boundary_dtype", "previous_hop_identity", "next_hop_identity", "kv_dtype", "max_activations")
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    STAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAYER_RANGE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_DIR_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BOUNDARY_DTYPE_FIELD_NUMBER: _ClassVar[int]
    NEXT_HOP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KV_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_MODE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    NEXT_HOP_MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SOURCE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INPUT_BOUNDARY_DTYPE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_HOP_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    NEXT_HOP_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    KV_DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    stage_index: int
    stage_count: int
    layer_range: _common_pb2.LayerRange
    plan: _common_pb2.PlanBinding
    checkpoint_dir: str
    artifact_dir: str
    manifest_hash: str
    backend: _common_pb2.Backend
    boundary_dtype: _common_pb2.ElementType
    next_hop_address: str
    kv_limit_bytes: int
    output_mode: OutputMode
    device: str
    next_hop_manifest_hash: str
    artifact_source_address: str
    input_boundary_dtype: _common_pb2.ElementType
    previous_hop_identity: str
    next_hop_identity: str
    kv_dtype: str
    max_activations: str
    def __init__(self, stage_index: _Optional[int] = ..., stage_count: _Optional[int] = ..., layer_range: _Optional[_Union[_common_pb2.LayerRange, _Mapping]] = ..., plan: _Optional[_Union[_common_pb2.PlanBinding, _Mapping]] = ..., checkpoint_dir: _Optional[str] = ..., artifact_dir: _Optional[str] = ..., manifest_hash: _Optional[str] = ..., backend: _Optional[_Union[_common_pb2.Backend, str]] = ..., boundary_dtype: _Optional[_Union[_common_pb2.ElementType, str]] = ..., next_hop_address: _Optional[str] = ..., kv_limit_bytes: _Optional[int] = ..., output_mode: _Optional[_Union[OutputMode, str]] = ..., device: _Optional[str] = ..., next_hop_manifest_hash: _Optional[str] = ..., artifact_source_address: _Optional[str] = ..., input_boundary_dtype: _Optional[_Union[_common_pb2.ElementType, str]] = ..., previous_hop_identity: _Optional[str] = ..., next_hop_identity: _Optional[str] = ..., kv_dtype: _Optional[str] = ..., max_activations: _Optional[str] = ...) -> None: ...

class LoadStageRequest(_message.Message):
    __slots__ = ("request_id", "spec")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    spec: StageSpec
    def __init__(self, request_id: _Optional[str] = ..., spec: _Optional[_Union[StageSpec, _Mapping]] = ...) -> None: ...

class LoadStageResponse(_message.Message):
    __slots__ = ("state", "manifest_hash", "data_plane_address", "input", "output", "weight_bytes", "load_time", "kv_dtype", "kv_block_tokens", "max_activations")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOAD_TIME_FIELD_NUMBER: _ClassVar[int]
    KV_DTYPE_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    state: StageState
    manifest_hash: str
    data_plane_address: str
    input: _common_pb2.BoundaryContract
    output: _common_pb2.BoundaryContract
    weight_bytes: int
    load_time: _common_pb2.Figure
    kv_dtype: str
    kv_block_tokens: int
    max_activations: str
    def __init__(self, state: _Optional[_Union[StageState, str]] = ..., manifest_hash: _Optional[str] = ..., data_plane_address: _Optional[str] = ..., input: _Optional[_Union[_common_pb2.BoundaryContract, _Mapping]] = ..., output: _Optional[_Union[_common_pb2.BoundaryContract, _Mapping]] = ..., weight_bytes: _Optional[int] = ..., load_time: _Optional[_Union[_common_pb2.Figure, _Mapping]] = ..., kv_dtype: _Optional[str] = ..., kv_block_tokens: _Optional[int] = ..., max_activations: _Optional[str] = ...) -> None: ...

class GetHealthRequest(_message.Message):
    __slots__ = ("plan_generation_id",)
    PLAN_GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    plan_generation_id: str
    def __init__(self, plan_generation_id: _Optional[str] = ...) -> None: ...

class GetHealthResponse(_message.Message):
    __slots__ = ("state", "inflight_batches", "live_sequences", "kv_bytes_used", "kv_bytes_limit", "kv_bytes_high_water", "inflight_batches_high_water", "batches_executed", "failure_reason", "plan", "phase_totals", "service_times", "loaded_plan_generation_ids", "kv_block_tokens", "kv_blocks_total", "kv_blocks_free", "kv_blocks_cached", "prefix_hit_blocks", "prefix_missed_blocks", "kv_evicted_blocks", "unix_time_ns")
    STATE_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    LIVE_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_USED_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_LIMIT_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_HIGH_WATER_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_BATCHES_HIGH_WATER_FIELD_NUMBER: _ClassVar[int]
    BATCHES_EXECUTED_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    PHASE_TOTALS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_TIMES_FIELD_NUMBER: _ClassVar[int]
    LOADED_PLAN_GENERATION_IDS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_CACHED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_MISSED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_EVICTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    UNIX_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    state: StageState
    inflight_batches: int
    live_sequences: int
    kv_bytes_used: int
    kv_bytes_limit: int
    kv_bytes_high_water: int
    inflight_batches_high_water: int
    batches_executed: int
    failure_reason: str
    plan: _common_pb2.PlanBinding
    phase_totals: PhaseTotals
    service_times: ServiceTimes
    loaded_plan_generation_ids: _containers.RepeatedScalarFieldContainer[str]
    kv_block_tokens: int
    kv_blocks_total: int
    kv_blocks_free: int
    kv_blocks_cached: int
    prefix_hit_blocks: int
    prefix_missed_blocks: int
    kv_evicted_blocks: int
    unix_time_ns: int
    def __init__(self, state: _Optional[_Union[StageState, str]] = ..., inflight_batches: _Optional[int] = ..., live_sequences: _Optional[int] = ..., kv_bytes_used: _Optional[int] = ..., kv_bytes_limit: _Optional[int] = ..., kv_bytes_high_water: _Optional[int] = ..., inflight_batches_high_water: _Optional[int] = ..., batches_executed: _Optional[int] = ..., failure_reason: _Optional[str] = ..., plan: _Optional[_Union[_common_pb2.PlanBinding, _Mapping]] = ..., phase_totals: _Optional[_Union[PhaseTotals, _Mapping]] = ..., service_times: _Optional[_Union[ServiceTimes, _Mapping]] = ..., loaded_plan_generation_ids: _Optional[_Iterable[str]] = ..., kv_block_tokens: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., kv_blocks_free: _Optional[int] = ..., kv_blocks_cached: _Optional[int] = ..., prefix_hit_blocks: _Optional[int] = ..., prefix_missed_blocks: _Optional[int] = ..., kv_evicted_blocks: _Optional[int] = ..., unix_time_ns: _Optional[int] = ...) -> None: ...

class ServiceTimes(_message.Message):
    __slots__ = ("decode_service_ns", "decode_microbatches", "decode_rows", "prefill_service_ns", "prefill_tokens", "prefill_batches", "recent_decode_service_ns", "recent_decode_microbatches", "recent_decode_rows", "decode_past_tokens", "timing")
    DECODE_SERVICE_NS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    DECODE_ROWS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SERVICE_NS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_BATCHES_FIELD_NUMBER: _ClassVar[int]
    RECENT_DECODE_SERVICE_NS_FIELD_NUMBER: _ClassVar[int]
    RECENT_DECODE_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    RECENT_DECODE_ROWS_FIELD_NUMBER: _ClassVar[int]
    DECODE_PAST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    decode_service_ns: int
    decode_microbatches: int
    decode_rows: int
    prefill_service_ns: int
    prefill_tokens: int
    prefill_batches: int
    recent_decode_service_ns: int
    recent_decode_microbatches: int
    recent_decode_rows: float
    decode_past_tokens: int
    timing: str
    def __init__(self, decode_service_ns: _Optional[int] = ..., decode_microbatches: _Optional[int] = ..., decode_rows: _Optional[int] = ..., prefill_service_ns: _Optional[int] = ..., prefill_tokens: _Optional[int] = ..., prefill_batches: _Optional[int] = ..., recent_decode_service_ns: _Optional[int] = ..., recent_decode_microbatches: _Optional[int] = ..., recent_decode_rows: _Optional[float] = ..., decode_past_tokens: _Optional[int] = ..., timing: _Optional[str] = ...) -> None: ...

class PhaseTotals(_message.Message):
    __slots__ = ("queue_ns", "compute_ns", "pack_ns", "transfer_ns", "unpack_ns", "batches", "busy_ns", "credit_wait_ns", "input_wait_ns")
    QUEUE_NS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_NS_FIELD_NUMBER: _ClassVar[int]
    PACK_NS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_NS_FIELD_NUMBER: _ClassVar[int]
    UNPACK_NS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    BUSY_NS_FIELD_NUMBER: _ClassVar[int]
    CREDIT_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    INPUT_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    queue_ns: int
    compute_ns: int
    pack_ns: int
    transfer_ns: int
    unpack_ns: int
    batches: int
    busy_ns: int
    credit_wait_ns: int
    input_wait_ns: int
    def __init__(self, queue_ns: _Optional[int] = ..., compute_ns: _Optional[int] = ..., pack_ns: _Optional[int] = ..., transfer_ns: _Optional[int] = ..., unpack_ns: _Optional[int] = ..., batches: _Optional[int] = ..., busy_ns: _Optional[int] = ..., credit_wait_ns: _Optional[int] = ..., input_wait_ns: _Optional[int] = ...) -> None: ...

class CancelRequestRequest(_message.Message):
    __slots__ = ("request_id", "target_request_id", "plan_generation_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    target_request_id: str
    plan_generation_id: str
    def __init__(self, request_id: _Optional[str] = ..., target_request_id: _Optional[str] = ..., plan_generation_id: _Optional[str] = ...) -> None: ...

class CancelRequestResponse(_message.Message):
    __slots__ = ("found", "kv_epoch")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    KV_EPOCH_FIELD_NUMBER: _ClassVar[int]
    found: bool
    kv_epoch: int
    def __init__(self, found: _Optional[bool] = ..., kv_epoch: _Optional[int] = ...) -> None: ...

class ReleaseRequestRequest(_message.Message):
    __slots__ = ("request_id", "target_request_id", "plan_generation_id", "publish_token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    target_request_id: str
    plan_generation_id: str
    publish_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., target_request_id: _Optional[str] = ..., plan_generation_id: _Optional[str] = ..., publish_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseRequestResponse(_message.Message):
    __slots__ = ("found", "kv_epoch", "kv_bytes_freed")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    KV_EPOCH_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    found: bool
    kv_epoch: int
    kv_bytes_freed: int
    def __init__(self, found: _Optional[bool] = ..., kv_epoch: _Optional[int] = ..., kv_bytes_freed: _Optional[int] = ...) -> None: ...

class DrainStageRequest(_message.Message):
    __slots__ = ("request_id", "timeout_ns", "plan_generation_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_NS_FIELD_NUMBER: _ClassVar[int]
    PLAN_GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    timeout_ns: int
    plan_generation_id: str
    def __init__(self, request_id: _Optional[str] = ..., timeout_ns: _Optional[int] = ..., plan_generation_id: _Optional[str] = ...) -> None: ...

class DrainStageResponse(_message.Message):
    __slots__ = ("state", "inflight_batches")
    STATE_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    state: StageState
    inflight_batches: int
    def __init__(self, state: _Optional[_Union[StageState, str]] = ..., inflight_batches: _Optional[int] = ...) -> None: ...

class UnloadStageRequest(_message.Message):
    __slots__ = ("request_id", "plan_generation_id", "keep_plan_generation_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_PLAN_GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    plan_generation_id: str
    keep_plan_generation_id: str
    def __init__(self, request_id: _Optional[str] = ..., plan_generation_id: _Optional[str] = ..., keep_plan_generation_id: _Optional[str] = ...) -> None: ...

class UnloadStageResponse(_message.Message):
    __slots__ = ("state", "live_sequences_at_unload", "kv_bytes_used_at_unload", "unloaded_plan_generation_ids")
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIVE_SEQUENCES_AT_UNLOAD_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_USED_AT_UNLOAD_FIELD_NUMBER: _ClassVar[int]
    UNLOADED_PLAN_GENERATION_IDS_FIELD_NUMBER: _ClassVar[int]
    state: StageState
    live_sequences_at_unload: int
    kv_bytes_used_at_unload: int
    unloaded_plan_generation_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, state: _Optional[_Union[StageState, str]] = ..., live_sequences_at_unload: _Optional[int] = ..., kv_bytes_used_at_unload: _Optional[int] = ..., unloaded_plan_generation_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SamplingSpec(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "grammar", "first_sample_position", "generated_token_ids", "logprobs", "top_logprobs")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    FIRST_SAMPLE_POSITION_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    presence_penalty: float
    frequency_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    grammar: GrammarConstraint
    first_sample_position: int
    generated_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: bool
    top_logprobs: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., grammar: _Optional[_Union[GrammarConstraint, _Mapping]] = ..., first_sample_position: _Optional[int] = ..., generated_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ...) -> None: ...

class GrammarConstraint(_message.Message):
    __slots__ = ("lark_grammar", "end_token_ids")
    LARK_GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    END_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    lark_grammar: str
    end_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, lark_grammar: _Optional[str] = ..., end_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AdmitSequenceRequest(_message.Message):
    __slots__ = ("request_id", "target_request_id", "execution_lease_id", "reserve_tokens", "sampling", "output_mode", "plan_generation_id", "prefix_salt", "prefix_block_hashes", "prefix_token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RESERVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_MODE_FIELD_NUMBER: _ClassVar[int]
    PLAN_GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_SALT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    target_request_id: str
    execution_lease_id: str
    reserve_tokens: int
    sampling: SamplingSpec
    output_mode: OutputMode
    plan_generation_id: str
    prefix_salt: bytes
    prefix_block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    prefix_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., target_request_id: _Optional[str] = ..., execution_lease_id: _Optional[str] = ..., reserve_tokens: _Optional[int] = ..., sampling: _Optional[_Union[SamplingSpec, _Mapping]] = ..., output_mode: _Optional[_Union[OutputMode, str]] = ..., plan_generation_id: _Optional[str] = ..., prefix_salt: _Optional[bytes] = ..., prefix_block_hashes: _Optional[_Iterable[bytes]] = ..., prefix_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AdmitSequenceResponse(_message.Message):
    __slots__ = ("kv_bytes_reserved", "kv_bytes_free", "cached_tokens", "kv_block_tokens")
    KV_BYTES_RESERVED_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FREE_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    kv_bytes_reserved: int
    kv_bytes_free: int
    cached_tokens: int
    kv_block_tokens: int
    def __init__(self, kv_bytes_reserved: _Optional[int] = ..., kv_bytes_free: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., kv_block_tokens: _Optional[int] = ...) -> None: ...

class ProfileStageRequest(_message.Message):
    __slots__ = ("request_id", "checkpoint_dir", "layer_ranges", "artifact_source_address", "manifest_hashes", "host", "model_snapshot", "prefill_lengths", "decode_batches", "context_tokens", "concurrency", "runs", "valid_for_s", "command", "min_run_ms", "decode_contexts")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    LAYER_RANGES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SOURCE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_HASHES_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    MODEL_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    PREFILL_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    DECODE_BATCHES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    VALID_FOR_S_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    MIN_RUN_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    checkpoint_dir: str
    layer_ranges: _containers.RepeatedCompositeFieldContainer[_common_pb2.LayerRange]
    artifact_source_address: str
    manifest_hashes: _containers.RepeatedScalarFieldContainer[str]
    host: str
    model_snapshot: str
    prefill_lengths: _containers.RepeatedScalarFieldContainer[int]
    decode_batches: _containers.RepeatedScalarFieldContainer[int]
    context_tokens: int
    concurrency: int
    runs: int
    valid_for_s: int
    command: str
    min_run_ms: int
    decode_contexts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., checkpoint_dir: _Optional[str] = ..., layer_ranges: _Optional[_Iterable[_Union[_common_pb2.LayerRange, _Mapping]]] = ..., artifact_source_address: _Optional[str] = ..., manifest_hashes: _Optional[_Iterable[str]] = ..., host: _Optional[str] = ..., model_snapshot: _Optional[str] = ..., prefill_lengths: _Optional[_Iterable[int]] = ..., decode_batches: _Optional[_Iterable[int]] = ..., context_tokens: _Optional[int] = ..., concurrency: _Optional[int] = ..., runs: _Optional[int] = ..., valid_for_s: _Optional[int] = ..., command: _Optional[str] = ..., min_run_ms: _Optional[int] = ..., decode_contexts: _Optional[_Iterable[int]] = ...) -> None: ...

class ProfileStageResponse(_message.Message):
    __slots__ = ("profile_json", "record")
    PROFILE_JSON_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    profile_json: bytes
    record: _evidence_registry_pb2.Record
    def __init__(self, profile_json: _Optional[bytes] = ..., record: _Optional[_Union[_evidence_registry_pb2.Record, _Mapping]] = ...) -> None: ...

class OpenLinkProbeRequest(_message.Message):
    __slots__ = ("request_id", "peer_identity", "ttl_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    peer_identity: str
    ttl_s: int
    def __init__(self, request_id: _Optional[str] = ..., peer_identity: _Optional[str] = ..., ttl_s: _Optional[int] = ...) -> None: ...

class OpenLinkProbeResponse(_message.Message):
    __slots__ = ("probe_id", "address", "identity")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    address: str
    identity: str
    def __init__(self, probe_id: _Optional[str] = ..., address: _Optional[str] = ..., identity: _Optional[str] = ...) -> None: ...

class ProfileLinkRequest(_message.Message):
    __slots__ = ("request_id", "probe_address", "probe_id", "probe_identity", "from_host", "to_host", "runs", "rtt_iters", "valid_for_s", "command")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROBE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    PROBE_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    FROM_HOST_FIELD_NUMBER: _ClassVar[int]
    TO_HOST_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    RTT_ITERS_FIELD_NUMBER: _ClassVar[int]
    VALID_FOR_S_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    probe_address: str
    probe_id: str
    probe_identity: str
    from_host: str
    to_host: str
    runs: int
    rtt_iters: int
    valid_for_s: int
    command: str
    def __init__(self, request_id: _Optional[str] = ..., probe_address: _Optional[str] = ..., probe_id: _Optional[str] = ..., probe_identity: _Optional[str] = ..., from_host: _Optional[str] = ..., to_host: _Optional[str] = ..., runs: _Optional[int] = ..., rtt_iters: _Optional[int] = ..., valid_for_s: _Optional[int] = ..., command: _Optional[str] = ...) -> None: ...

class ProfileLinkResponse(_message.Message):
    __slots__ = ("profile_json", "record")
    PROFILE_JSON_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    profile_json: bytes
    record: _evidence_registry_pb2.Record
    def __init__(self, profile_json: _Optional[bytes] = ..., record: _Optional[_Union[_evidence_registry_pb2.Record, _Mapping]] = ...) -> None: ...

class CompareDecodeStepRequest(_message.Message):
    __slots__ = ("request_id", "checkpoint_dir", "layer_range", "rows", "context_tokens", "runs", "min_run_ms", "artifact_source_address", "manifest_hash")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    LAYER_RANGE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    MIN_RUN_MS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SOURCE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    checkpoint_dir: str
    layer_range: _common_pb2.LayerRange
    rows: _containers.RepeatedScalarFieldContainer[int]
    context_tokens: int
    runs: int
    min_run_ms: int
    artifact_source_address: str
    manifest_hash: str
    def __init__(self, request_id: _Optional[str] = ..., checkpoint_dir: _Optional[str] = ..., layer_range: _Optional[_Union[_common_pb2.LayerRange, _Mapping]] = ..., rows: _Optional[_Iterable[int]] = ..., context_tokens: _Optional[int] = ..., runs: _Optional[int] = ..., min_run_ms: _Optional[int] = ..., artifact_source_address: _Optional[str] = ..., manifest_hash: _Optional[str] = ...) -> None: ...

class DecodeStepTiming(_message.Message):
    __slots__ = ("backend", "backend_build", "rows", "seconds_per_step")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_BUILD_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    backend: str
    backend_build: str
    rows: int
    seconds_per_step: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, backend: _Optional[str] = ..., backend_build: _Optional[str] = ..., rows: _Optional[int] = ..., seconds_per_step: _Optional[_Iterable[float]] = ...) -> None: ...

class CompareDecodeStepResponse(_message.Message):
    __slots__ = ("timings", "host", "cpu_model", "cpu_quota_cores", "cpuset", "context_tokens", "command")
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    CPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    CPU_QUOTA_CORES_FIELD_NUMBER: _ClassVar[int]
    CPUSET_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    timings: _containers.RepeatedCompositeFieldContainer[DecodeStepTiming]
    host: str
    cpu_model: str
    cpu_quota_cores: float
    cpuset: str
    context_tokens: int
    command: str
    def __init__(self, timings: _Optional[_Iterable[_Union[DecodeStepTiming, _Mapping]]] = ..., host: _Optional[str] = ..., cpu_model: _Optional[str] = ..., cpu_quota_cores: _Optional[float] = ..., cpuset: _Optional[str] = ..., context_tokens: _Optional[int] = ..., command: _Optional[str] = ...) -> None: ...
