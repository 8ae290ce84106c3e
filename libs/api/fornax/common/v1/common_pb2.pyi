from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EvidenceClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVIDENCE_CLASS_UNSPECIFIED: _ClassVar[EvidenceClass]
    EVIDENCE_CLASS_CONTRACT: _ClassVar[EvidenceClass]
    EVIDENCE_CLASS_REFERENCE: _ClassVar[EvidenceClass]
    EVIDENCE_CLASS_PHYSICAL: _ClassVar[EvidenceClass]

class Backend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKEND_UNSPECIFIED: _ClassVar[Backend]
    BACKEND_MAX: _ClassVar[Backend]
    BACKEND_NUMPY: _ClassVar[Backend]

class ElementType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ELEMENT_TYPE_UNSPECIFIED: _ClassVar[ElementType]
    ELEMENT_TYPE_BF16: _ClassVar[ElementType]
    ELEMENT_TYPE_FP16: _ClassVar[ElementType]
    ELEMENT_TYPE_FP32: _ClassVar[ElementType]
    ELEMENT_TYPE_INT32: _ClassVar[ElementType]

class TensorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TENSOR_KIND_UNSPECIFIED: _ClassVar[TensorKind]
    TENSOR_KIND_TOKEN_IDS: _ClassVar[TensorKind]
    TENSOR_KIND_ACTIVATION: _ClassVar[TensorKind]
    TENSOR_KIND_LOGITS: _ClassVar[TensorKind]
    TENSOR_KIND_SAMPLED_TOKEN_IDS: _ClassVar[TensorKind]
EVIDENCE_CLASS_UNSPECIFIED: EvidenceClass
EVIDENCE_CLASS_CONTRACT: EvidenceClass
EVIDENCE_CLASS_REFERENCE: EvidenceClass
EVIDENCE_CLASS_PHYSICAL: EvidenceClass
BACKEND_UNSPECIFIED: Backend
BACKEND_MAX: Backend
BACKEND_NUMPY: Backend
ELEMENT_TYPE_UNSPECIFIED: ElementType
ELEMENT_TYPE_BF16: ElementType
ELEMENT_TYPE_FP16: ElementType
ELEMENT_TYPE_FP32: ElementType
ELEMENT_TYPE_INT32: ElementType
TENSOR_KIND_UNSPECIFIED: TensorKind
TENSOR_KIND_TOKEN_IDS: TensorKind
TENSOR_KIND_ACTIVATION: TensorKind
TENSOR_KIND_LOGITS: TensorKind
TENSOR_KIND_SAMPLED_TOKEN_IDS: TensorKind

class LayerRange(_message.Message):
    __slots__ = ("layer_start", "layer_end_exclusive")
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    layer_start: int
    layer_end_exclusive: int
    def __init__(self, layer_start: _Optional[int] = ..., layer_end_exclusive: _Optional[int] = ...) -> None: ...

class PlanBinding(_message.Message):
    __slots__ = ("plan_id", "plan_hash", "plan_generation_id")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_HASH_FIELD_NUMBER: _ClassVar[int]
    PLAN_GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    plan_hash: str
    plan_generation_id: str
    def __init__(self, plan_id: _Optional[str] = ..., plan_hash: _Optional[str] = ..., plan_generation_id: _Optional[str] = ...) -> None: ...

class BoundaryContract(_message.Message):
    __slots__ = ("kind", "dtype", "width")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    kind: TensorKind
    dtype: ElementType
    width: int
    def __init__(self, kind: _Optional[_Union[TensorKind, str]] = ..., dtype: _Optional[_Union[ElementType, str]] = ..., width: _Optional[int] = ...) -> None: ...

class Figure(_message.Message):
    __slots__ = ("name", "value", "unit", "evidence_class", "prediction", "hardware", "backend_build", "model_snapshot", "command")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_CLASS_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_BUILD_FIELD_NUMBER: _ClassVar[int]
    MODEL_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    unit: str
    evidence_class: EvidenceClass
    prediction: bool
    hardware: str
    backend_build: str
    model_snapshot: str
    command: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ..., unit: _Optional[str] = ..., evidence_class: _Optional[_Union[EvidenceClass, str]] = ..., prediction: _Optional[bool] = ..., hardware: _Optional[str] = ..., backend_build: _Optional[str] = ..., model_snapshot: _Optional[str] = ..., command: _Optional[str] = ...) -> None: ...
