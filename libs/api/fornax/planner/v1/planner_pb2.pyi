from fornax.common.v1 import common_pb2 as _common_pb2
from fornax.evidence_registry.v1 import evidence_registry_pb2 as _evidence_registry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Objective(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBJECTIVE_UNSPECIFIED: _ClassVar[Objective]
    OBJECTIVE_THROUGHPUT: _ClassVar[Objective]
    OBJECTIVE_LATENCY: _ClassVar[Objective]

class PlanMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_MODE_UNSPECIFIED: _ClassVar[PlanMode]
    PLAN_MODE_EXPLORATORY: _ClassVar[PlanMode]
    PLAN_MODE_DEPLOYMENT: _ClassVar[PlanMode]
OBJECTIVE_UNSPECIFIED: Objective
OBJECTIVE_THROUGHPUT: Objective
OBJECTIVE_LATENCY: Objective
PLAN_MODE_UNSPECIFIED: PlanMode
PLAN_MODE_EXPLORATORY: PlanMode
PLAN_MODE_DEPLOYMENT: PlanMode

class LayerDescription(_message.Message):
    __slots__ = ("index", "is_moe", "weight_bytes", "active_weight_bytes_per_token", "flops_per_token", "kv_bytes_per_token", "dense_weight_bytes", "attention_flops_per_context_token", "scratch_bytes_per_row", "kv_scale_bytes_per_block")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    IS_MOE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_WEIGHT_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FLOPS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DENSE_WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FLOPS_PER_CONTEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SCRATCH_BYTES_PER_ROW_FIELD_NUMBER: _ClassVar[int]
    KV_SCALE_BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    index: int
    is_moe: bool
    weight_bytes: int
    active_weight_bytes_per_token: int
    flops_per_token: int
    kv_bytes_per_token: int
    dense_weight_bytes: int
    attention_flops_per_context_token: int
    scratch_bytes_per_row: int
    kv_scale_bytes_per_block: int
    def __init__(self, index: _Optional[int] = ..., is_moe: _Optional[bool] = ..., weight_bytes: _Optional[int] = ..., active_weight_bytes_per_token: _Optional[int] = ..., flops_per_token: _Optional[int] = ..., kv_bytes_per_token: _Optional[int] = ..., dense_weight_bytes: _Optional[int] = ..., attention_flops_per_context_token: _Optional[int] = ..., scratch_bytes_per_row: _Optional[int] = ..., kv_scale_bytes_per_block: _Optional[int] = ...) -> None: ...

class ModelDescription(_message.Message):
    __slots__ = ("model_snapshot", "hidden_size", "vocab_size", "layers", "embedding_bytes", "head_bytes", "routed_experts", "experts_per_token", "shared_experts", "expert_bytes", "weight_dtype", "required_operations", "tied_embeddings", "weights_policy", "weight_formats")
    MODEL_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SHARED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    EXPERT_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DTYPE_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    TIED_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_POLICY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FORMATS_FIELD_NUMBER: _ClassVar[int]
    model_snapshot: str
    hidden_size: int
    vocab_size: int
    layers: _containers.RepeatedCompositeFieldContainer[LayerDescription]
    embedding_bytes: int
    head_bytes: int
    routed_experts: int
    experts_per_token: int
    shared_experts: int
    expert_bytes: int
    weight_dtype: _common_pb2.ElementType
    required_operations: _containers.RepeatedScalarFieldContainer[str]
    tied_embeddings: bool
    weights_policy: str
    weight_formats: _containers.RepeatedCompositeFieldContainer[BackendWeightFormats]
    def __init__(self, model_snapshot: _Optional[str] = ..., hidden_size: _Optional[int] = ..., vocab_size: _Optional[int] = ..., layers: _Optional[_Iterable[_Union[LayerDescription, _Mapping]]] = ..., embedding_bytes: _Optional[int] = ..., head_bytes: _Optional[int] = ..., routed_experts: _Optional[int] = ..., experts_per_token: _Optional[int] = ..., shared_experts: _Optional[int] = ..., expert_bytes: _Optional[int] = ..., weight_dtype: _Optional[_Union[_common_pb2.ElementType, str]] = ..., required_operations: _Optional[_Iterable[str]] = ..., tied_embeddings: _Optional[bool] = ..., weights_policy: _Optional[str] = ..., weight_formats: _Optional[_Iterable[_Union[BackendWeightFormats, _Mapping]]] = ...) -> None: ...

class BackendWeightFormats(_message.Message):
    __slots__ = ("backend", "formats")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    FORMATS_FIELD_NUMBER: _ClassVar[int]
    backend: _common_pb2.Backend
    formats: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, backend: _Optional[_Union[_common_pb2.Backend, str]] = ..., formats: _Optional[_Iterable[str]] = ...) -> None: ...

class EvidenceRef(_message.Message):
    __slots__ = ("record_id", "type", "expected_blob_sha256")
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_BLOB_SHA256_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    type: _evidence_registry_pb2.RecordType
    expected_blob_sha256: str
    def __init__(self, record_id: _Optional[str] = ..., type: _Optional[_Union[_evidence_registry_pb2.RecordType, str]] = ..., expected_blob_sha256: _Optional[str] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "backend", "memory_bytes", "compute_flops", "memory_bandwidth_bytes_per_s", "dtypes", "operations", "build", "evidence_record_ids", "reserve_bytes", "evidence", "host", "weight_formats", "max_activations")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FLOPS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BANDWIDTH_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    DTYPES_FIELD_NUMBER: _ClassVar[int]
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    BUILD_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_RECORD_IDS_FIELD_NUMBER: _ClassVar[int]
    RESERVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FORMATS_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    backend: _common_pb2.Backend
    memory_bytes: int
    compute_flops: float
    memory_bandwidth_bytes_per_s: float
    dtypes: _containers.RepeatedScalarFieldContainer[_common_pb2.ElementType]
    operations: _containers.RepeatedScalarFieldContainer[str]
    build: str
    evidence_record_ids: _containers.RepeatedScalarFieldContainer[str]
    reserve_bytes: int
    evidence: _containers.RepeatedCompositeFieldContainer[EvidenceRef]
    host: str
    weight_formats: _containers.RepeatedScalarFieldContainer[str]
    max_activations: str
    def __init__(self, name: _Optional[str] = ..., backend: _Optional[_Union[_common_pb2.Backend, str]] = ..., memory_bytes: _Optional[int] = ..., compute_flops: _Optional[float] = ..., memory_bandwidth_bytes_per_s: _Optional[float] = ..., dtypes: _Optional[_Iterable[_Union[_common_pb2.ElementType, str]]] = ..., operations: _Optional[_Iterable[str]] = ..., build: _Optional[str] = ..., evidence_record_ids: _Optional[_Iterable[str]] = ..., reserve_bytes: _Optional[int] = ..., evidence: _Optional[_Iterable[_Union[EvidenceRef, _Mapping]]] = ..., host: _Optional[str] = ..., weight_formats: _Optional[_Iterable[str]] = ..., max_activations: _Optional[str] = ...) -> None: ...

class Link(_message.Message):
    __slots__ = ("from_node", "to_node", "bandwidth_bytes_per_s", "latency_ns", "evidence_record_ids", "evidence")
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    LATENCY_NS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_RECORD_IDS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    from_node: str
    to_node: str
    bandwidth_bytes_per_s: float
    latency_ns: int
    evidence_record_ids: _containers.RepeatedScalarFieldContainer[str]
    evidence: _containers.RepeatedCompositeFieldContainer[EvidenceRef]
    def __init__(self, from_node: _Optional[str] = ..., to_node: _Optional[str] = ..., bandwidth_bytes_per_s: _Optional[float] = ..., latency_ns: _Optional[int] = ..., evidence_record_ids: _Optional[_Iterable[str]] = ..., evidence: _Optional[_Iterable[_Union[EvidenceRef, _Mapping]]] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("nodes", "links")
    NODES_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    links: _containers.RepeatedCompositeFieldContainer[Link]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., links: _Optional[_Iterable[_Union[Link, _Mapping]]] = ...) -> None: ...

class Target(_message.Message):
    __slots__ = ("context_tokens", "concurrency", "objective", "min_stages", "max_stages", "mode", "boundary_dtype", "prefill_tokens", "decode_microbatch_rows")
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    MIN_STAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_STAGES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    BOUNDARY_DTYPE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MICROBATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    context_tokens: int
    concurrency: int
    objective: Objective
    min_stages: int
    max_stages: int
    mode: PlanMode
    boundary_dtype: _common_pb2.ElementType
    prefill_tokens: int
    decode_microbatch_rows: int
    def __init__(self, context_tokens: _Optional[int] = ..., concurrency: _Optional[int] = ..., objective: _Optional[_Union[Objective, str]] = ..., min_stages: _Optional[int] = ..., max_stages: _Optional[int] = ..., mode: _Optional[_Union[PlanMode, str]] = ..., boundary_dtype: _Optional[_Union[_common_pb2.ElementType, str]] = ..., prefill_tokens: _Optional[int] = ..., decode_microbatch_rows: _Optional[int] = ...) -> None: ...

class StageCost(_message.Message):
    __slots__ = ("compute_s", "pack_s", "wire_s", "unpack_s", "queue_s", "exposed_wait_s")
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    PACK_S_FIELD_NUMBER: _ClassVar[int]
    WIRE_S_FIELD_NUMBER: _ClassVar[int]
    UNPACK_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    EXPOSED_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    compute_s: float
    pack_s: float
    wire_s: float
    unpack_s: float
    queue_s: float
    exposed_wait_s: float
    def __init__(self, compute_s: _Optional[float] = ..., pack_s: _Optional[float] = ..., wire_s: _Optional[float] = ..., unpack_s: _Optional[float] = ..., queue_s: _Optional[float] = ..., exposed_wait_s: _Optional[float] = ...) -> None: ...

class TermEvidence(_message.Message):
    __slots__ = ("term", "evidence_class", "record_ids", "note", "value", "unit")
    TERM_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_CLASS_FIELD_NUMBER: _ClassVar[int]
    RECORD_IDS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    term: str
    evidence_class: str
    record_ids: _containers.RepeatedScalarFieldContainer[str]
    note: str
    value: float
    unit: str
    def __init__(self, term: _Optional[str] = ..., evidence_class: _Optional[str] = ..., record_ids: _Optional[_Iterable[str]] = ..., note: _Optional[str] = ..., value: _Optional[float] = ..., unit: _Optional[str] = ...) -> None: ...

class PlannedStage(_message.Message):
    __slots__ = ("stage_index", "node", "layer_range", "owns_embeddings", "owns_head", "weight_bytes", "kv_bytes", "activation_bytes", "memory_bytes", "decode_cost", "prefill_cost", "reserve_bytes", "backend", "build", "terms", "host", "max_activations")
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LAYER_RANGE_FIELD_NUMBER: _ClassVar[int]
    OWNS_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    OWNS_HEAD_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DECODE_COST_FIELD_NUMBER: _ClassVar[int]
    PREFILL_COST_FIELD_NUMBER: _ClassVar[int]
    RESERVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BUILD_FIELD_NUMBER: _ClassVar[int]
    TERMS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    stage_index: int
    node: str
    layer_range: _common_pb2.LayerRange
    owns_embeddings: bool
    owns_head: bool
    weight_bytes: int
    kv_bytes: int
    activation_bytes: int
    memory_bytes: int
    decode_cost: StageCost
    prefill_cost: StageCost
    reserve_bytes: int
    backend: _common_pb2.Backend
    build: str
    terms: _containers.RepeatedCompositeFieldContainer[TermEvidence]
    host: str
    max_activations: str
    def __init__(self, stage_index: _Optional[int] = ..., node: _Optional[str] = ..., layer_range: _Optional[_Union[_common_pb2.LayerRange, _Mapping]] = ..., owns_embeddings: _Optional[bool] = ..., owns_head: _Optional[bool] = ..., weight_bytes: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., activation_bytes: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., decode_cost: _Optional[_Union[StageCost, _Mapping]] = ..., prefill_cost: _Optional[_Union[StageCost, _Mapping]] = ..., reserve_bytes: _Optional[int] = ..., backend: _Optional[_Union[_common_pb2.Backend, str]] = ..., build: _Optional[str] = ..., terms: _Optional[_Iterable[_Union[TermEvidence, _Mapping]]] = ..., host: _Optional[str] = ..., max_activations: _Optional[str] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("subject", "reason", "detail", "required", "available")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    subject: str
    reason: str
    detail: str
    required: float
    available: float
    def __init__(self, subject: _Optional[str] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., required: _Optional[float] = ..., available: _Optional[float] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("plan_id", "plan_hash", "mode", "stages", "predictions", "method", "objective", "model_snapshot", "label", "evidence_record_ids", "route_key", "calibration_record_id", "placement_choice")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_HASH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    MODEL_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_RECORD_IDS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_KEY_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_CHOICE_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    plan_hash: str
    mode: PlanMode
    stages: _containers.RepeatedCompositeFieldContainer[PlannedStage]
    predictions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Figure]
    method: str
    objective: Objective
    model_snapshot: str
    label: str
    evidence_record_ids: _containers.RepeatedScalarFieldContainer[str]
    route_key: str
    calibration_record_id: str
    placement_choice: str
    def __init__(self, plan_id: _Optional[str] = ..., plan_hash: _Optional[str] = ..., mode: _Optional[_Union[PlanMode, str]] = ..., stages: _Optional[_Iterable[_Union[PlannedStage, _Mapping]]] = ..., predictions: _Optional[_Iterable[_Union[_common_pb2.Figure, _Mapping]]] = ..., method: _Optional[str] = ..., objective: _Optional[_Union[Objective, str]] = ..., model_snapshot: _Optional[str] = ..., label: _Optional[str] = ..., evidence_record_ids: _Optional[_Iterable[str]] = ..., route_key: _Optional[str] = ..., calibration_record_id: _Optional[str] = ..., placement_choice: _Optional[str] = ...) -> None: ...

class ProfileRecord(_message.Message):
    __slots__ = ("record_id", "type", "blob", "labels", "evidence_class")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_CLASS_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    type: _evidence_registry_pb2.RecordType
    blob: bytes
    labels: _containers.ScalarMap[str, str]
    evidence_class: str
    def __init__(self, record_id: _Optional[str] = ..., type: _Optional[_Union[_evidence_registry_pb2.RecordType, str]] = ..., blob: _Optional[bytes] = ..., labels: _Optional[_Mapping[str, str]] = ..., evidence_class: _Optional[str] = ...) -> None: ...

class ProfileEvidence(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[ProfileRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[ProfileRecord, _Mapping]]] = ...) -> None: ...

class EvidenceFailure(_message.Message):
    __slots__ = ("record_id", "subject", "reason", "detail")
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    subject: str
    reason: str
    detail: str
    def __init__(self, record_id: _Optional[str] = ..., subject: _Optional[str] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class CreatePlanRequest(_message.Message):
    __slots__ = ("request_id", "model", "inventory", "target", "model_evidence_record_ids", "model_evidence", "profiles")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MODEL_EVIDENCE_RECORD_IDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: ModelDescription
    inventory: Inventory
    target: Target
    model_evidence_record_ids: _containers.RepeatedScalarFieldContainer[str]
    model_evidence: _containers.RepeatedCompositeFieldContainer[EvidenceRef]
    profiles: ProfileEvidence
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[_Union[ModelDescription, _Mapping]] = ..., inventory: _Optional[_Union[Inventory, _Mapping]] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., model_evidence_record_ids: _Optional[_Iterable[str]] = ..., model_evidence: _Optional[_Iterable[_Union[EvidenceRef, _Mapping]]] = ..., profiles: _Optional[_Union[ProfileEvidence, _Mapping]] = ...) -> None: ...

class CreatePlanResponse(_message.Message):
    __slots__ = ("feasible", "plan", "rejections", "infeasibility", "shortfall_bytes", "infeasibility_reason", "evidence_failures")
    FEASIBLE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    INFEASIBILITY_FIELD_NUMBER: _ClassVar[int]
    SHORTFALL_BYTES_FIELD_NUMBER: _ClassVar[int]
    INFEASIBILITY_REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    feasible: bool
    plan: Plan
    rejections: _containers.RepeatedCompositeFieldContainer[Rejection]
    infeasibility: str
    shortfall_bytes: float
    infeasibility_reason: str
    evidence_failures: _containers.RepeatedCompositeFieldContainer[EvidenceFailure]
    def __init__(self, feasible: _Optional[bool] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., rejections: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ..., infeasibility: _Optional[str] = ..., shortfall_bytes: _Optional[float] = ..., infeasibility_reason: _Optional[str] = ..., evidence_failures: _Optional[_Iterable[_Union[EvidenceFailure, _Mapping]]] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ("plan_id",)
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    def __init__(self, plan_id: _Optional[str] = ...) -> None: ...

class GetPlanResponse(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: Plan
    def __init__(self, plan: _Optional[_Union[Plan, _Mapping]] = ...) -> None: ...
