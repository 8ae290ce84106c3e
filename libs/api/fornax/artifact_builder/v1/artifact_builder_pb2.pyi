from fornax.common.v1 import common_pb2 as _common_pb2
from fornax.planner.v1 import planner_pb2 as _planner_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileDigest(_message.Message):
    __slots__ = ("path", "sha256", "size_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    sha256: str
    size_bytes: int
    def __init__(self, path: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class TensorProblem(_message.Message):
    __slots__ = ("name", "problem", "expected", "found")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    name: str
    problem: str
    expected: str
    found: str
    def __init__(self, name: _Optional[str] = ..., problem: _Optional[str] = ..., expected: _Optional[str] = ..., found: _Optional[str] = ...) -> None: ...

class CheckpointSnapshot(_message.Message):
    __slots__ = ("snapshot_id", "checkpoint_dir", "source", "revision", "config_sha256", "tokenizer_sha256", "chat_template_sha256", "weight_index_sha256", "shards", "num_layers", "tensor_count", "total_tensor_bytes", "tied_embeddings", "weight_dtype")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_SHA256_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_SHA256_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_SHA256_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_INDEX_SHA256_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TENSOR_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIED_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DTYPE_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    checkpoint_dir: str
    source: str
    revision: str
    config_sha256: str
    tokenizer_sha256: str
    chat_template_sha256: str
    weight_index_sha256: str
    shards: _containers.RepeatedCompositeFieldContainer[FileDigest]
    num_layers: int
    tensor_count: int
    total_tensor_bytes: int
    tied_embeddings: bool
    weight_dtype: str
    def __init__(self, snapshot_id: _Optional[str] = ..., checkpoint_dir: _Optional[str] = ..., source: _Optional[str] = ..., revision: _Optional[str] = ..., config_sha256: _Optional[str] = ..., tokenizer_sha256: _Optional[str] = ..., chat_template_sha256: _Optional[str] = ..., weight_index_sha256: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[FileDigest, _Mapping]]] = ..., num_layers: _Optional[int] = ..., tensor_count: _Optional[int] = ..., total_tensor_bytes: _Optional[int] = ..., tied_embeddings: _Optional[bool] = ..., weight_dtype: _Optional[str] = ...) -> None: ...

class InspectCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_dir", "source", "revision")
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    checkpoint_dir: str
    source: str
    revision: str
    def __init__(self, checkpoint_dir: _Optional[str] = ..., source: _Optional[str] = ..., revision: _Optional[str] = ...) -> None: ...

class InspectCheckpointResponse(_message.Message):
    __slots__ = ("snapshot", "valid", "problems", "model_record_id")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    MODEL_RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    snapshot: CheckpointSnapshot
    valid: bool
    problems: _containers.RepeatedCompositeFieldContainer[TensorProblem]
    model_record_id: str
    def __init__(self, snapshot: _Optional[_Union[CheckpointSnapshot, _Mapping]] = ..., valid: _Optional[bool] = ..., problems: _Optional[_Iterable[_Union[TensorProblem, _Mapping]]] = ..., model_record_id: _Optional[str] = ...) -> None: ...

class BuildStageArtifactsRequest(_message.Message):
    __slots__ = ("request_id", "checkpoint_dir", "out_dir", "plan_json", "layer_ranges", "boundary_dtype", "source", "revision", "plan", "hop_boundary_dtypes", "weights_policy", "stage_weights_policies", "stage_backends")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    OUT_DIR_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    LAYER_RANGES_FIELD_NUMBER: _ClassVar[int]
    BOUNDARY_DTYPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    HOP_BOUNDARY_DTYPES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_POLICY_FIELD_NUMBER: _ClassVar[int]
    STAGE_WEIGHTS_POLICIES_FIELD_NUMBER: _ClassVar[int]
    STAGE_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    checkpoint_dir: str
    out_dir: str
    plan_json: str
    layer_ranges: _containers.RepeatedCompositeFieldContainer[_common_pb2.LayerRange]
    boundary_dtype: _common_pb2.ElementType
    source: str
    revision: str
    plan: _planner_pb2.Plan
    hop_boundary_dtypes: _containers.RepeatedScalarFieldContainer[_common_pb2.ElementType]
    weights_policy: str
    stage_weights_policies: _containers.RepeatedScalarFieldContainer[str]
    stage_backends: _containers.RepeatedScalarFieldContainer[_common_pb2.Backend]
    def __init__(self, request_id: _Optional[str] = ..., checkpoint_dir: _Optional[str] = ..., out_dir: _Optional[str] = ..., plan_json: _Optional[str] = ..., layer_ranges: _Optional[_Iterable[_Union[_common_pb2.LayerRange, _Mapping]]] = ..., boundary_dtype: _Optional[_Union[_common_pb2.ElementType, str]] = ..., source: _Optional[str] = ..., revision: _Optional[str] = ..., plan: _Optional[_Union[_planner_pb2.Plan, _Mapping]] = ..., hop_boundary_dtypes: _Optional[_Iterable[_Union[_common_pb2.ElementType, str]]] = ..., weights_policy: _Optional[str] = ..., stage_weights_policies: _Optional[_Iterable[str]] = ..., stage_backends: _Optional[_Iterable[_Union[_common_pb2.Backend, str]]] = ...) -> None: ...

class StageArtifact(_message.Message):
    __slots__ = ("stage_index", "artifact_dir", "manifest_hash", "layer_range", "weight_bytes")
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_DIR_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    LAYER_RANGE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    stage_index: int
    artifact_dir: str
    manifest_hash: str
    layer_range: _common_pb2.LayerRange
    weight_bytes: int
    def __init__(self, stage_index: _Optional[int] = ..., artifact_dir: _Optional[str] = ..., manifest_hash: _Optional[str] = ..., layer_range: _Optional[_Union[_common_pb2.LayerRange, _Mapping]] = ..., weight_bytes: _Optional[int] = ...) -> None: ...

class BuildProgress(_message.Message):
    __slots__ = ("stage_index", "tensors_done", "tensors_total", "bytes_done", "bytes_total")
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TENSORS_DONE_FIELD_NUMBER: _ClassVar[int]
    TENSORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    stage_index: int
    tensors_done: int
    tensors_total: int
    bytes_done: int
    bytes_total: int
    def __init__(self, stage_index: _Optional[int] = ..., tensors_done: _Optional[int] = ..., tensors_total: _Optional[int] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ...) -> None: ...

class BuildResult(_message.Message):
    __slots__ = ("plan_id", "plan_hash", "stages")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_HASH_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    plan_hash: str
    stages: _containers.RepeatedCompositeFieldContainer[StageArtifact]
    def __init__(self, plan_id: _Optional[str] = ..., plan_hash: _Optional[str] = ..., stages: _Optional[_Iterable[_Union[StageArtifact, _Mapping]]] = ...) -> None: ...

class BuildStageArtifactsResponse(_message.Message):
    __slots__ = ("progress", "result")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    progress: BuildProgress
    result: BuildResult
    def __init__(self, progress: _Optional[_Union[BuildProgress, _Mapping]] = ..., result: _Optional[_Union[BuildResult, _Mapping]] = ...) -> None: ...

class VerifyArtifactRequest(_message.Message):
    __slots__ = ("artifact_dir", "expected_manifest_hash", "expected_plan_hash")
    ARTIFACT_DIR_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_PLAN_HASH_FIELD_NUMBER: _ClassVar[int]
    artifact_dir: str
    expected_manifest_hash: str
    expected_plan_hash: str
    def __init__(self, artifact_dir: _Optional[str] = ..., expected_manifest_hash: _Optional[str] = ..., expected_plan_hash: _Optional[str] = ...) -> None: ...

class VerifyArtifactResponse(_message.Message):
    __slots__ = ("ok", "manifest_hash", "reason", "detail")
    OK_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    manifest_hash: str
    reason: str
    detail: str
    def __init__(self, ok: _Optional[bool] = ..., manifest_hash: _Optional[str] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class FetchArtifactRequest(_message.Message):
    __slots__ = ("manifest_hash", "path", "offset_bytes", "max_chunk_bytes")
    MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    manifest_hash: str
    path: str
    offset_bytes: int
    max_chunk_bytes: int
    def __init__(self, manifest_hash: _Optional[str] = ..., path: _Optional[str] = ..., offset_bytes: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ...) -> None: ...

class FetchArtifactResponse(_message.Message):
    __slots__ = ("offset_bytes", "data", "file_size_bytes")
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    offset_bytes: int
    data: bytes
    file_size_bytes: int
    def __init__(self, offset_bytes: _Optional[int] = ..., data: _Optional[bytes] = ..., file_size_bytes: _Optional[int] = ...) -> None: ...

class GetModelFilesRequest(_message.Message):
    __slots__ = ("checkpoint_dir",)
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    checkpoint_dir: str
    def __init__(self, checkpoint_dir: _Optional[str] = ...) -> None: ...

class ModelFile(_message.Message):
    __slots__ = ("path", "content", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    content: bytes
    sha256: str
    def __init__(self, path: _Optional[str] = ..., content: _Optional[bytes] = ..., sha256: _Optional[str] = ...) -> None: ...

class GetModelFilesResponse(_message.Message):
    __slots__ = ("files", "snapshot")
    FILES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[ModelFile]
    snapshot: CheckpointSnapshot
    def __init__(self, files: _Optional[_Iterable[_Union[ModelFile, _Mapping]]] = ..., snapshot: _Optional[_Union[CheckpointSnapshot, _Mapping]] = ...) -> None: ...
