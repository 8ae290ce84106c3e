"""Stage artifacts over gRPC: a real builder server, a worker-side cache, injected faults.

A cut stream resumes from the bytes on disk; corrupted bytes are refused by sha256 and fetched
again; a fault that never clears ends in its own reason code, and nothing unverified is kept.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from fornax.artifact_builder.v1 import artifact_builder_pb2 as pb
from fornax.artifact_builder.v1 import artifact_builder_pb2_grpc as pb_grpc
from fornax.common.v1 import common_pb2
from libs.artifacts.manifest import MANIFEST_FILE, WEIGHTS_FILE
from libs.artifacts.transfer import ArtifactCache, ArtifactTransferCorruptError, ArtifactTransferTruncatedError
from libs.artifacts.verify import verify_artifact
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.service.config import ServerConfig
from libs.service.interceptors import ErrorInterceptor, reason_of
from services.artifact_builder.config import BuilderConfig
from services.artifact_builder.server import ArtifactBuilderServicer
from services.stage_worker.fetch import fetch_artifact

pytestmark = pytest.mark.integration


class FaultyBuilder(ArtifactBuilderServicer):
    """Serves the weights file wrong for the first `faults` requests: 'corrupt' flips a byte,
    'truncate' ends the stream at the file's midpoint."""

    def __init__(self, cfg: BuilderConfig, fault: str = "", faults: int = 0):
        super().__init__(cfg)
        self.fault, self.faults, self.requests = fault, faults, []

    async def FetchArtifact(self, request, context):
        self.requests.append((request.path, request.offset_bytes))
        faulty = request.path == WEIGHTS_FILE and self.faults > 0
        if faulty:
            self.faults -= 1
        small = pb.FetchArtifactRequest()
        small.CopyFrom(request)
        small.max_chunk_bytes = 64 * 1024  # several chunks per file, so a cut lands mid-file
        async for chunk in super().FetchArtifact(small, context):
            if faulty and self.fault == "truncate" and chunk.offset_bytes >= chunk.file_size_bytes // 2:
                return
            if faulty and self.fault == "corrupt":
                data = bytearray(chunk.data)
                data[len(data) // 2] ^= 0xFF
                chunk = pb.FetchArtifactResponse(offset_bytes=chunk.offset_bytes, data=bytes(data),
                                                 file_size_bytes=chunk.file_size_bytes)
            yield chunk


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("transfer")
    checkpoint = write_checkpoint(CheckpointRequest("tiny", root / "tiny")).out_dir
    return root, checkpoint


def _serve_and(built, servicer_factory, body):
    root, checkpoint = built
    cfg = BuilderConfig(server=ServerConfig("artifact_builder"), artifact_store=str(root / "store"),
                        build_chunk_bytes=1 << 16, read_roots=(root.resolve(),))

    async def main():
        servicer = servicer_factory(cfg)
        server = grpc.aio.server(interceptors=[ErrorInterceptor("artifact_builder")])
        pb_grpc.add_ArtifactBuilderServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        address = f"127.0.0.1:{port}"
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = pb_grpc.ArtifactBuilderServiceStub(channel)
                events = [e async for e in stub.BuildStageArtifacts(pb.BuildStageArtifactsRequest(
                    checkpoint_dir=str(checkpoint), boundary_dtype=common_pb2.ELEMENT_TYPE_FP32,
                    layer_ranges=[common_pb2.LayerRange(layer_start=0, layer_end_exclusive=4)]))]
                artifact = events[-1].result.stages[0]
                return await body(address, stub, artifact, servicer)
        finally:
            await server.stop(0)

    return asyncio.run(main())


def test_a_clean_fetch_lands_a_verified_artifact_in_the_private_cache(built, tmp_path):
    async def body(address, stub, artifact, servicer):
        cache = ArtifactCache(tmp_path / "cache")
        directory = await fetch_artifact(address, artifact.manifest_hash, cache)
        again = await fetch_artifact(address, artifact.manifest_hash, cache)  # cache hit: no new transfer
        return directory, again, list(servicer.requests), artifact

    directory, again, requests, artifact = _serve_and(built, FaultyBuilder, body)
    assert directory == again and directory.is_relative_to(tmp_path / "cache")
    verified = verify_artifact(directory, expected_manifest_hash=artifact.manifest_hash)
    assert verified.manifest_hash == artifact.manifest_hash
    assert sum(path == WEIGHTS_FILE for path, _ in requests) == 1
    assert not directory.is_relative_to(Path(artifact.artifact_dir).parent)


@pytest.mark.parametrize("fault", ["corrupt", "truncate"])
def test_a_damaged_transfer_is_fetched_again(built, tmp_path, fault):
    async def body(address, stub, artifact, servicer):
        directory = await fetch_artifact(address, artifact.manifest_hash, ArtifactCache(tmp_path / "cache"))
        return directory, servicer.requests, artifact

    directory, requests, artifact = _serve_and(built, lambda cfg: FaultyBuilder(cfg, fault, faults=1), body)
    verify_artifact(directory, expected_manifest_hash=artifact.manifest_hash)
    weights = [offset for path, offset in requests if path == WEIGHTS_FILE]
    if fault == "truncate":
        assert len(weights) == 2 and weights[0] == 0 and weights[1] > 0  # resumed, not restarted
    else:
        assert weights == [0, 0]  # refused by sha256, fetched again from zero


@pytest.mark.parametrize(("fault", "error", "reason"), [
    ("corrupt", ArtifactTransferCorruptError, "ARTIFACT_TRANSFER_CORRUPT"),
    ("truncate", ArtifactTransferTruncatedError, "ARTIFACT_TRANSFER_TRUNCATED"),
])
def test_a_fault_that_never_clears_is_refused_with_its_code(built, tmp_path, fault, error, reason):
    async def body(address, stub, artifact, servicer):
        cache = ArtifactCache(tmp_path / "cache")
        with pytest.raises(error) as raised:
            await fetch_artifact(address, artifact.manifest_hash, cache, attempts=3)
        return raised.value, cache, artifact

    raised, cache, artifact = _serve_and(built, lambda cfg: FaultyBuilder(cfg, fault, faults=99), body)
    assert raised.reason == reason
    assert not cache.artifact_dir(artifact.manifest_hash).exists()
    source = verify_artifact(artifact.artifact_dir).manifest  # the builder's copy, read here only to name the blob
    weights = next(f for f in source.files if f.path == WEIGHTS_FILE)
    assert not cache.blob(weights.sha256).exists()  # nothing unverified enters the blob store


def test_the_builder_serves_only_listed_files_of_known_artifacts(built):
    async def body(address, stub, artifact, servicer):
        async def code_of(request):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                [c async for c in stub.FetchArtifact(request)]
            return err.value.code(), reason_of(err.value)

        return (
            await code_of(pb.FetchArtifactRequest(manifest_hash=artifact.manifest_hash, path="../../etc/passwd")),
            await code_of(pb.FetchArtifactRequest(manifest_hash="sha256:" + "0" * 64, path=MANIFEST_FILE)),
            await code_of(pb.FetchArtifactRequest(manifest_hash="md5:abc", path=MANIFEST_FILE)),
            await code_of(pb.FetchArtifactRequest(manifest_hash=artifact.manifest_hash, path=MANIFEST_FILE,
                                                  offset_bytes=10**9)),
        )

    outside, unknown, malformed, past_end = _serve_and(built, ArtifactBuilderServicer, body)
    assert outside == (grpc.StatusCode.NOT_FOUND, "ARTIFACT_FILE_NOT_LISTED")
    assert unknown == (grpc.StatusCode.NOT_FOUND, "ARTIFACT_NOT_FOUND")
    assert malformed[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert past_end[0] == grpc.StatusCode.INVALID_ARGUMENT


def test_model_files_come_with_hashes_that_match_the_snapshot(built):
    async def body(address, stub, artifact, servicer):
        return await stub.GetModelFiles(pb.GetModelFilesRequest(checkpoint_dir=str(built[1])))

    reply = _serve_and(built, ArtifactBuilderServicer, body)
    files = {f.path: f for f in reply.files}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(files)
    assert files["tokenizer.json"].sha256 == reply.snapshot.tokenizer_sha256
    assert files["config.json"].content == (built[1] / "config.json").read_bytes()
    assert not any(name.endswith(".safetensors") for name in files)


def test_a_worker_refuses_an_artifact_built_for_other_hop_dtypes(built, tmp_path):
    from libs.common.kinds import Backend, DType
    from libs.service.errors import FailedPrecondition
    from services.stage_worker.runtime import LoadSpec, PlanBinding, StageRuntime

    async def body(address, stub, artifact, servicer):
        events = [e async for e in stub.BuildStageArtifacts(pb.BuildStageArtifactsRequest(
            checkpoint_dir=str(built[1]), boundary_dtype=common_pb2.ELEMENT_TYPE_FP32,
            layer_ranges=[common_pb2.LayerRange(layer_start=0, layer_end_exclusive=2),
                          common_pb2.LayerRange(layer_start=2, layer_end_exclusive=4)]))]
        result = events[-1].result
        first = result.stages[0]
        runtime = StageRuntime(Backend.NUMPY, "cpu", 1 << 20, artifact_cache_dir=str(tmp_path / "cache"))

        def spec(dtype: DType) -> LoadSpec:
            return LoadSpec(stage_index=0, stage_count=2, layer_start=0, layer_end=2,
                            plan=PlanBinding(result.plan_id, result.plan_hash, "generation-1"),
                            backend=Backend.NUMPY, boundary_dtype=dtype, artifact_source=address,
                            manifest_hash=first.manifest_hash, next_hop="127.0.0.1:1",
                            next_hop_manifest_hash=result.stages[1].manifest_hash)

        with pytest.raises(FailedPrecondition) as refused:
            await runtime.load(spec(DType.BF16))  # the artifact's output hop is fp32
        await runtime.unload()
        loaded = await runtime.load(spec(DType.FP32))
        return refused.value, loaded

    refused, loaded = _serve_and(built, ArtifactBuilderServicer, body)
    assert refused.reason == "BOUNDARY_CONTRACT_MISMATCH"
    assert loaded.manifest_hash.startswith("sha256:")
