from fornax.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]

class RouteState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUTE_STATE_UNSPECIFIED: _ClassVar[RouteState]
    ROUTE_STATE_EMPTY: _ClassVar[RouteState]
    ROUTE_STATE_INSTALLING: _ClassVar[RouteState]
    ROUTE_STATE_SERVING: _ClassVar[RouteState]
    ROUTE_STATE_DRAINING: _ClassVar[RouteState]
    ROUTE_STATE_DRAINED: _ClassVar[RouteState]
    ROUTE_STATE_FAILED: _ClassVar[RouteState]
    ROUTE_STATE_DEGRADED: _ClassVar[RouteState]

class RouteRemovalReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUTE_REMOVAL_REASON_UNSPECIFIED: _ClassVar[RouteRemovalReason]
    ROUTE_REMOVAL_REASON_HOST_DRAINED: _ClassVar[RouteRemovalReason]
    ROUTE_REMOVAL_REASON_REJOIN_TIMEOUT: _ClassVar[RouteRemovalReason]

class CalibrationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CALIBRATION_STATE_UNSPECIFIED: _ClassVar[CalibrationState]
    CALIBRATION_STATE_NO_PREDICTION: _ClassVar[CalibrationState]
    CALIBRATION_STATE_UNMEASURED: _ClassVar[CalibrationState]
    CALIBRATION_STATE_CALIBRATED: _ClassVar[CalibrationState]
    CALIBRATION_STATE_UNCALIBRATED: _ClassVar[CalibrationState]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_ERROR: FinishReason
ROUTE_STATE_UNSPECIFIED: RouteState
ROUTE_STATE_EMPTY: RouteState
ROUTE_STATE_INSTALLING: RouteState
ROUTE_STATE_SERVING: RouteState
ROUTE_STATE_DRAINING: RouteState
ROUTE_STATE_DRAINED: RouteState
ROUTE_STATE_FAILED: RouteState
ROUTE_STATE_DEGRADED: RouteState
ROUTE_REMOVAL_REASON_UNSPECIFIED: RouteRemovalReason
ROUTE_REMOVAL_REASON_HOST_DRAINED: RouteRemovalReason
ROUTE_REMOVAL_REASON_REJOIN_TIMEOUT: RouteRemovalReason
CALIBRATION_STATE_UNSPECIFIED: CalibrationState
CALIBRATION_STATE_NO_PREDICTION: CalibrationState
CALIBRATION_STATE_UNMEASURED: CalibrationState
CALIBRATION_STATE_CALIBRATED: CalibrationState
CALIBRATION_STATE_UNCALIBRATED: CalibrationState

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed", "max_tokens", "stop")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "model", "text", "token_ids", "sampling", "deadline_budget_ns", "chat")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_BUDGET_NS_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    text: str
    token_ids: TokenIds
    sampling: SamplingParams
    deadline_budget_ns: int
    chat: bool
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., deadline_budget_ns: _Optional[int] = ..., chat: _Optional[bool] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text_delta", "token_ids", "finish_reason", "usage")
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    text_delta: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    def __init__(self, text_delta: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id", "target_request_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    target_request_id: str
    def __init__(self, request_id: _Optional[str] = ..., target_request_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class InstallPlanRequest(_message.Message):
    __slots__ = ("request_id", "checkpoint_dir", "stages", "backend", "boundary_dtype", "allow_break_before_make")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BOUNDARY_DTYPE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_BREAK_BEFORE_MAKE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    checkpoint_dir: str
    stages: int
    backend: _common_pb2.Backend
    boundary_dtype: _common_pb2.ElementType
    allow_break_before_make: bool
    def __init__(self, request_id: _Optional[str] = ..., checkpoint_dir: _Optional[str] = ..., stages: _Optional[int] = ..., backend: _Optional[_Union[_common_pb2.Backend, str]] = ..., boundary_dtype: _Optional[_Union[_common_pb2.ElementType, str]] = ..., allow_break_before_make: _Optional[bool] = ...) -> None: ...

class StageStatus(_message.Message):
    __slots__ = ("stage_index", "worker_address", "layer_range", "manifest_hash", "healthy", "condition")
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAYER_RANGE_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    stage_index: int
    worker_address: str
    layer_range: _common_pb2.LayerRange
    manifest_hash: str
    healthy: bool
    condition: str
    def __init__(self, stage_index: _Optional[int] = ..., worker_address: _Optional[str] = ..., layer_range: _Optional[_Union[_common_pb2.LayerRange, _Mapping]] = ..., manifest_hash: _Optional[str] = ..., healthy: _Optional[bool] = ..., condition: _Optional[str] = ...) -> None: ...

class PlanStatus(_message.Message):
    __slots__ = ("plan", "state", "stages", "inflight_requests", "reason", "calibration", "routes", "removed_routes")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    REMOVED_ROUTES_FIELD_NUMBER: _ClassVar[int]
    plan: _common_pb2.PlanBinding
    state: RouteState
    stages: _containers.RepeatedCompositeFieldContainer[StageStatus]
    inflight_requests: int
    reason: str
    calibration: RouteCalibration
    routes: _containers.RepeatedCompositeFieldContainer[PlanStatus]
    removed_routes: _containers.RepeatedCompositeFieldContainer[RemovedRoute]
    def __init__(self, plan: _Optional[_Union[_common_pb2.PlanBinding, _Mapping]] = ..., state: _Optional[_Union[RouteState, str]] = ..., stages: _Optional[_Iterable[_Union[StageStatus, _Mapping]]] = ..., inflight_requests: _Optional[int] = ..., reason: _Optional[str] = ..., calibration: _Optional[_Union[RouteCalibration, _Mapping]] = ..., routes: _Optional[_Iterable[_Union[PlanStatus, _Mapping]]] = ..., removed_routes: _Optional[_Iterable[_Union[RemovedRoute, _Mapping]]] = ...) -> None: ...

class RemovedRoute(_message.Message):
    __slots__ = ("worker_addresses", "reason", "host_worker_address", "detail")
    WORKER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HOST_WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    worker_addresses: _containers.RepeatedScalarFieldContainer[str]
    reason: RouteRemovalReason
    host_worker_address: str
    detail: str
    def __init__(self, worker_addresses: _Optional[_Iterable[str]] = ..., reason: _Optional[_Union[RouteRemovalReason, str]] = ..., host_worker_address: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class StageCalibration(_message.Message):
    __slots__ = ("stage_index", "state", "predicted_decode_service_s", "measured_decode_service_s", "measured_microbatches", "measured_rows_per_microbatch")
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_DECODE_SERVICE_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_DECODE_SERVICE_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_ROWS_PER_MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    stage_index: int
    state: CalibrationState
    predicted_decode_service_s: float
    measured_decode_service_s: float
    measured_microbatches: int
    measured_rows_per_microbatch: float
    def __init__(self, stage_index: _Optional[int] = ..., state: _Optional[_Union[CalibrationState, str]] = ..., predicted_decode_service_s: _Optional[float] = ..., measured_decode_service_s: _Optional[float] = ..., measured_microbatches: _Optional[int] = ..., measured_rows_per_microbatch: _Optional[float] = ...) -> None: ...

class RouteCalibration(_message.Message):
    __slots__ = ("state", "reason", "prediction_basis", "relative_bound", "stages")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_BASIS_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_BOUND_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    state: CalibrationState
    reason: str
    prediction_basis: str
    relative_bound: float
    stages: _containers.RepeatedCompositeFieldContainer[StageCalibration]
    def __init__(self, state: _Optional[_Union[CalibrationState, str]] = ..., reason: _Optional[str] = ..., prediction_basis: _Optional[str] = ..., relative_bound: _Optional[float] = ..., stages: _Optional[_Iterable[_Union[StageCalibration, _Mapping]]] = ...) -> None: ...

class InstallPlanResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: PlanStatus
    def __init__(self, status: _Optional[_Union[PlanStatus, _Mapping]] = ...) -> None: ...

class DrainPlanRequest(_message.Message):
    __slots__ = ("request_id", "timeout_ns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    timeout_ns: int
    def __init__(self, request_id: _Optional[str] = ..., timeout_ns: _Optional[int] = ...) -> None: ...

class DrainPlanResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: PlanStatus
    def __init__(self, status: _Optional[_Union[PlanStatus, _Mapping]] = ...) -> None: ...

class RollbackPlanRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class RollbackPlanResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: PlanStatus
    def __init__(self, status: _Optional[_Union[PlanStatus, _Mapping]] = ...) -> None: ...

class GetPlanStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPlanStatusResponse(_message.Message):
    __slots__ = ("current", "previous")
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    current: PlanStatus
    previous: PlanStatus
    def __init__(self, current: _Optional[_Union[PlanStatus, _Mapping]] = ..., previous: _Optional[_Union[PlanStatus, _Mapping]] = ...) -> None: ...

class DrainHostRequest(_message.Message):
    __slots__ = ("request_id", "worker_address", "timeout_ns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    worker_address: str
    timeout_ns: int
    def __init__(self, request_id: _Optional[str] = ..., worker_address: _Optional[str] = ..., timeout_ns: _Optional[int] = ...) -> None: ...

class RouteWorkers(_message.Message):
    __slots__ = ("worker_addresses",)
    WORKER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    worker_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class DrainHostResponse(_message.Message):
    __slots__ = ("removed_routes", "finished_requests", "handed_off_requests", "ended_requests", "stored_route_set", "status", "largest_gap_ns")
    REMOVED_ROUTES_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    HANDED_OFF_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ENDED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STORED_ROUTE_SET_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LARGEST_GAP_NS_FIELD_NUMBER: _ClassVar[int]
    removed_routes: _containers.RepeatedCompositeFieldContainer[RouteWorkers]
    finished_requests: int
    handed_off_requests: int
    ended_requests: int
    stored_route_set: str
    status: PlanStatus
    largest_gap_ns: int
    def __init__(self, removed_routes: _Optional[_Iterable[_Union[RouteWorkers, _Mapping]]] = ..., finished_requests: _Optional[int] = ..., handed_off_requests: _Optional[int] = ..., ended_requests: _Optional[int] = ..., stored_route_set: _Optional[str] = ..., status: _Optional[_Union[PlanStatus, _Mapping]] = ..., largest_gap_ns: _Optional[int] = ...) -> None: ...

class AddRoutesRequest(_message.Message):
    __slots__ = ("request_id", "routes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    routes: _containers.RepeatedCompositeFieldContainer[RouteWorkers]
    def __init__(self, request_id: _Optional[str] = ..., routes: _Optional[_Iterable[_Union[RouteWorkers, _Mapping]]] = ...) -> None: ...

class AddRoutesResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: PlanStatus
    def __init__(self, status: _Optional[_Union[PlanStatus, _Mapping]] = ...) -> None: ...
