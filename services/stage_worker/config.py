"""Stage worker settings: the only module of this service that reads the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.common.kinds import BLOCK_ACTIVATIONS, DEFAULT_BLOCK_ACTIVATIONS, Backend, block_activations_refusal
from libs.model.errors import ConfigError
from libs.model.kv_blocks import KV_DTYPES, require_kv_backend
from libs.security.paths import parse_roots
from libs.service.affinity import parse_cpu_set
from libs.service.config import ServerConfig, parse, pick, server_config
from services.stage_worker.kv_fit import parse_kv_limit

BACKENDS = tuple(backend.value for backend in Backend)
DEVICES = ("cpu", "gpu")


@dataclass(frozen=True)
class StageWorkerConfig:
    server: ServerConfig
    stage_index: int = 0
    data_plane_port: int = 0
    # FNX2 listener of a plan generation loaded beside the serving one; 0 = ephemeral.
    overlap_data_plane_port: int = 0
    # Memory this worker may hold, both generations together while one is installed beside the
    # other; 0 = its cgroup's limit (if any). The host's available memory bounds it too.
    memory_limit_bytes: int = 0
    backend: Backend = Backend.NUMPY
    device: str = "cpu"
    # MAX compile cache; None = the backend's default (~/.cache/fornax/max).
    compile_cache_dir: str | None = None
    kv_limit_bytes: int = 1 << 30
    # "fit": size the KV pool after load from the memory left (cgroup limit, else MemAvailable,
    # less resident and headroom); kv_limit_bytes is then a cap (0 = none).
    kv_limit_fit: bool = False
    # Element type of the KV store: fp32 (reference), bf16 (half the bytes per token) or fp8
    # (e4m3 latent with per-block scales, rope key bf16; numpy backend only).
    kv_dtype: str = "fp32"
    # Activations of a MAX stage's block-format weight products (`MaxOptions.block_activations`):
    # int8 (MAX's packed product) or float32 (each block decoded; exact to the dequantized
    # product, slower). A stage spec may set its own; a numpy worker takes only the default.
    max_activations: str = "int8"
    # Host other stages and the orchestrator use to reach this worker's FNX2 listener when the
    # bind host is a wildcard (e.g. a pod's stable DNS name); empty = the bind host.
    advertise_host: str = ""
    # CPUs this worker pins itself to; empty = whatever it inherited.
    cpu_affinity: tuple[int, ...] = ()
    # Hosts whose cpusets overlap this worker's (a one-box fleet short of CPUs says so); empty: none.
    cpu_shared_with: str = ""
    # This worker's own state (the artifact cache); no other service reads it.
    state_dir: str = ""
    # Where LoadStage may read artifacts or checkpoints from; empty refuses every load.
    read_roots: tuple[Path, ...] = ()

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> StageWorkerConfig:
        env = os.environ if env is None else env
        args = parse(_parser(), argv)
        # A pool's pods count from 0; the pool's offset places them in the route (Helm pools).
        stage_index = (pick(args.stage_index, env, "FORNAX_STAGE_INDEX", 0, int)
                       + pick(None, env, "FORNAX_STAGE_INDEX_OFFSET", 0, int))
        backend = pick(args.backend, env, "FORNAX_BACKEND", cls.backend)
        device = pick(args.device, env, "FORNAX_DEVICE", cls.device)
        if backend not in BACKENDS:
            raise SystemExit(f"unsupported backend {backend!r}; expected one of {', '.join(BACKENDS)}")
        if device not in DEVICES:
            raise SystemExit(f"unsupported device {device!r}; expected one of {', '.join(DEVICES)}")
        kv_fit, kv_bytes = _kv_limit(pick(args.kv_limit_bytes, env, "FORNAX_KV_LIMIT_BYTES",
                                          str(cls.kv_limit_bytes)))
        return cls(
            server=server_config(args, env, "stage_worker", instance=f"stage-{stage_index}"),
            stage_index=stage_index,
            data_plane_port=pick(args.data_plane_port, env, "FORNAX_DATA_PLANE_PORT", 0, int),
            overlap_data_plane_port=pick(args.overlap_data_plane_port, env, "FORNAX_OVERLAP_DATA_PLANE_PORT", 0, int),
            memory_limit_bytes=pick(args.memory_limit_bytes, env, "FORNAX_MEMORY_LIMIT_BYTES", 0, int),
            backend=Backend(backend),
            device=device,
            compile_cache_dir=pick(args.compile_cache_dir, env, "FORNAX_COMPILE_CACHE_DIR", cls.compile_cache_dir),
            kv_limit_fit=kv_fit,
            kv_limit_bytes=kv_bytes,
            kv_dtype=_kv_dtype(pick(args.kv_dtype, env, "FORNAX_KV_DTYPE", cls.kv_dtype), backend),
            max_activations=_max_activations(
                pick(args.max_activations, env, "FORNAX_MAX_ACTIVATIONS", cls.max_activations), backend),
            advertise_host=pick(args.advertise_host, env, "FORNAX_ADVERTISE_HOST", ""),
            state_dir=pick(args.state_dir, env, "FORNAX_STATE_DIR", f".fornax/stage_worker_{stage_index}"),
            cpu_affinity=pick(args.cpu_affinity, env, "FORNAX_CPU_AFFINITY", (), parse_cpu_set),
            cpu_shared_with=env.get("FORNAX_CPU_SHARED_WITH", ""),
            read_roots=parse_roots(pick(args.read_roots, env, "FORNAX_READ_ROOTS", "")),
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fornax-stage-worker", description="Fornax stage worker")
    parser.add_argument("--stage-index", type=int, help="env FORNAX_STAGE_INDEX")
    parser.add_argument("--data-plane-port", type=int, help="FNX2 listener port (env FORNAX_DATA_PLANE_PORT)")
    parser.add_argument("--overlap-data-plane-port", type=int,
                        help="FNX2 port of a generation loaded beside the serving one "
                             "(env FORNAX_OVERLAP_DATA_PLANE_PORT; 0 = ephemeral)")
    parser.add_argument("--memory-limit-bytes", type=int,
                        help="memory this worker may hold (env FORNAX_MEMORY_LIMIT_BYTES; 0 = its cgroup's)")
    parser.add_argument("--backend", choices=BACKENDS, help="env FORNAX_BACKEND")
    parser.add_argument("--device", choices=DEVICES, help="env FORNAX_DEVICE")
    parser.add_argument("--compile-cache-dir", help="MAX compile cache (env FORNAX_COMPILE_CACHE_DIR)")
    parser.add_argument("--kv-limit-bytes",
                        help="KV budget in bytes, 'fit' (from the memory left after load) or "
                             "'fit:<cap bytes>' (env FORNAX_KV_LIMIT_BYTES)")
    parser.add_argument("--kv-dtype", choices=tuple(KV_DTYPES),
                        help="KV store element type, fp32, bf16 or fp8 (numpy backend only) "
                             "(env FORNAX_KV_DTYPE)")
    parser.add_argument("--max-activations", choices=BLOCK_ACTIVATIONS,
                        help="activations of a MAX stage's block-format weight products: int8 (default) or "
                             "float32 (exact to the dequantized product, slower) (env FORNAX_MAX_ACTIVATIONS)")
    parser.add_argument("--advertise-host", help="host peers dial for FNX2 (env FORNAX_ADVERTISE_HOST)")
    parser.add_argument("--state-dir", help="private state: fetched artifacts (env FORNAX_STATE_DIR)")
    parser.add_argument(
        "--cpu-affinity", type=parse_cpu_set, help="CPU set to pin to, e.g. 0-3 (env FORNAX_CPU_AFFINITY)"
    )
    parser.add_argument(
        "--read-roots", help=f"directories loads may read, {os.pathsep!r}-separated (env FORNAX_READ_ROOTS)"
    )
    return parser


def _kv_limit(value: str) -> tuple[bool, int]:
    try:
        return parse_kv_limit(value)
    except ValueError as exc:
        raise SystemExit(f"FORNAX_KV_LIMIT_BYTES must be bytes, 'fit' or 'fit:<cap bytes>': {exc}") from exc


def _kv_dtype(value: str, backend: str) -> str:
    if value not in KV_DTYPES:
        raise SystemExit(f"unsupported KV dtype {value!r}; expected one of {', '.join(KV_DTYPES)}")
    try:
        require_kv_backend(value, backend, field="FORNAX_KV_DTYPE")
    except ConfigError as exc:
        raise SystemExit(str(exc)) from exc
    return value


def _max_activations(value: str, backend: str) -> str:
    """A value the MAX backend knows; a numpy worker has no block-format activations to set (it
    keeps the default, which it never uses). Refusals: `libs.common.kinds.block_activations_refusal`."""
    refusal = block_activations_refusal(value, None if value == DEFAULT_BLOCK_ACTIVATIONS else backend)
    if refusal is None and not value:  # `pick` never yields "", but an empty mode is no mode
        refusal = ("MAX_ACTIVATIONS_UNSUPPORTED", f"max activations are empty; expected one of {BLOCK_ACTIVATIONS}")
    if refusal is not None:
        reason, message = refusal
        raise SystemExit(f"{reason}: {message}")
    return value
