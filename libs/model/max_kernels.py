"""`StageKernels` on Modular MAX graphs.

One graph is compiled per layer kind (embedding, dense decoder layer, MoE decoder layer,
final norm + head, plus one routed-expert graph) and bound to every layer of that kind through
a weights registry, so a stage of any depth pays at most five compiles. Compiled artifacts land in a fixed cache dir
(`MODULAR_MAX_CACHE_DIR`), so later processes only pay a cache hit. MAX reads that variable for the
whole process, so each process entry point that may compile sets it, with `configure_max_process`,
before the first compile; this module never writes the environment.

The device is chosen explicitly: "cpu", or "gpu" (first accelerator) which is an error when
no accelerator is present. Nothing falls back.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from libs.common.kinds import BLOCK_ACTIVATIONS
from libs.model.config import DeepseekV2Config
from libs.model.errors import BackendUnavailableError, BatchError, CheckpointError
from libs.model.kernels import LayerInputs, LayerOutputs
from libs.model.mla_forms import AttentionForm, choose_form, keys_per_row, row_keys

if TYPE_CHECKING:
    from libs.model.graph_variants import GraphVariants
    from libs.model.weights import StageWeights

# The one variable that moves the Fornax MAX compile cache (flags may override it).
CACHE_DIR_ENV = "FORNAX_COMPILE_CACHE_DIR"
DEVICES = ("cpu", "gpu")
WEIGHT_DTYPES = ("float32", "bfloat16")
# Float weight formats the MAX graphs hold, and the graph weight dtype each needs; block formats
# MAX runs in-graph through ops.qmatmul or the Mojo custom op (`libs.weights.policy.MAX_QUANT_FORMATS`).
GRAPH_DTYPE_OF_FORMAT = {"fp32": "float32", "bf16": "bfloat16"}
ATTENTION_FORMS = ("auto", "absorbed", "expanded")

ProgressFn = Callable[[str], None]


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$FORNAX_COMPILE_CACHE_DIR` in `env`, else `~/.cache/fornax/max`."""
    configured = (env or {}).get(CACHE_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "fornax" / "max"


def configure_max_process(env: MutableMapping[str, str], cache_dir: Path) -> None:
    """For a process entry point, before MAX compiles anything: where MAX caches compiled
    graphs, and telemetry off unless the operator turned it on."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    env["MODULAR_MAX_CACHE_DIR"] = str(cache_dir)
    env.setdefault("MODULAR_TELEMETRY_ENABLED", "0")


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class MaxOptions:
    device: str = "cpu"
    # "bfloat16": bf16 weights and bf16 linear products; softmax and norms compute in float32.
    # "auto": bfloat16 when the stage's weights are stored bf16, float32 when they are float32.
    weight_dtype: str = "auto"
    # MLA form per microbatch: "auto" (the cheaper by `mla_forms.choose_form`), or one form
    # for every microbatch ("absorbed" / "expanded"), for tests and measurements
    attention_form: str = "auto"
    # Activations of block-format weight products: "int8" runs Q4_0/Q4_K/Q6_K through MAX's
    # ops.qmatmul (activations quantized per 32-block) and the other block formats through
    # the float32 Mojo custom op; "float32" runs every block format through the custom op
    block_activations: str = "int8"
    progress: ProgressFn = field(default=stderr_progress, compare=False)


def max_build() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"max {version('max')}"
    except PackageNotFoundError as exc:
        raise BackendUnavailableError("the max package is not installed") from exc


def weight_dtype_for(weights: StageWeights) -> str:
    """The graph weight dtype a stage's stored formats run in; a format with no MAX kernel is
    refused (`WEIGHT_FORMAT_UNSUPPORTED`), never widened to float32."""
    from libs.weights.errors import WeightFormatUnsupportedError
    from libs.weights.policy import MAX_FORMATS

    formats = weights.formats()
    unsupported = sorted(formats - MAX_FORMATS)
    if unsupported:
        raise WeightFormatUnsupportedError(
            f"the MAX backend runs {', '.join(sorted(MAX_FORMATS))} weights in-graph; this stage holds "
            f"{', '.join(unsupported)} (build the stage for the max backend: `--for-backend max`, or a fleet "
            "whose plan places it on a MAX host, converts them once at build time)")
    return "bfloat16" if "bf16" in formats else "float32"


def _check_block_activations(options: MaxOptions) -> None:
    if options.block_activations not in BLOCK_ACTIVATIONS:
        raise BackendUnavailableError(
            f"max block activations {options.block_activations!r} not in {BLOCK_ACTIVATIONS}")


def make_max_kernels(
    cfg: DeepseekV2Config, weights: StageWeights, device: str = "cpu", options: MaxOptions | None = None
) -> MaxKernels:
    """Registry factory (`libs.model.kernels.BACKENDS["max"]`)."""
    opts = options or MaxOptions(device=device)
    if opts.device != device:
        opts = replace(opts, device=device)
    if opts.weight_dtype == "auto":
        opts = replace(opts, weight_dtype=weight_dtype_for(weights))
    return MaxKernels(cfg, weights, opts)


class MaxKernels:
    """MAX implementation of `libs.model.kernels.StageKernels`."""

    name = "max"

    def __init__(self, cfg: DeepseekV2Config, weights: StageWeights, options: MaxOptions) -> None:
        if options.device not in DEVICES:
            raise BackendUnavailableError(f"max device {options.device!r} not in {DEVICES}")
        if options.weight_dtype not in WEIGHT_DTYPES:
            raise BackendUnavailableError(f"max weight dtype {options.weight_dtype!r} not in {WEIGHT_DTYPES}")
        if options.attention_form not in ATTENTION_FORMS:
            raise BackendUnavailableError(f"max attention form {options.attention_form!r} not in {ATTENTION_FORMS}")
        _check_block_activations(options)
        self.build = max_build()
        self.cfg = cfg
        self.options = options
        from libs.model import max_runtime  # imports max only when a MAX stage is built

        self._rt = max_runtime.shared_runtime(cfg, options.device, options.weight_dtype, options.progress,
                                              options.block_activations)
        self.device_description = self._rt.device_description
        self._layers: dict[int, tuple[Any, Any]] = {}  # layer -> (model, routed experts or None)
        self._embed: Any = None  # bound MAX models, present on the first / last stage
        self._final: Any = None
        self._bind(weights)

    def _bind(self, weights: StageWeights) -> None:
        from libs.model import max_runtime

        rt = self._rt
        for index in range(weights.layer_start, weights.layer_end):
            registry = max_runtime.layer_registry(self.cfg, index, weights.layer(index))
            model = rt.bind(rt.layer_kind(index), registry)
            moe = weights.layer(index).moe
            self._layers[index] = (model, None if moe is None else rt.bind_experts(moe))
        if weights.embed is not None:
            self._embed = rt.bind(max_runtime.GraphKind.EMBED, {"embed_tokens": weights.embed})
        if weights.final_norm is not None:
            if weights.lm_head is None:
                raise CheckpointError("the last stage has a final norm but no lm_head")
            registry = {"norm": weights.final_norm, "lm_head": weights.lm_head}
            self._final = rt.bind(max_runtime.GraphKind.FINAL, registry)

    @property
    def compile_seconds(self) -> dict[str, float]:
        """Wall seconds per graph kind compiled or fetched from the cache, in this process."""
        return dict(self._rt.compile_seconds)

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        if self._embed is None:
            raise CheckpointError("this stage does not own the embeddings")
        return self._rt.run(self._embed, np.ascontiguousarray(token_ids, dtype=np.int32))[0]

    def decoder_layer(self, layer_index: int, inputs: LayerInputs) -> LayerOutputs:
        bound = self._layers.get(layer_index)
        if bound is None:
            raise CheckpointError(f"layer {layer_index} is not loaded on this stage")
        arrays = [
            np.ascontiguousarray(a, dtype=np.float32)
            for a in (inputs.hidden, inputs.rope_cos, inputs.rope_sin,
                      inputs.past_latent, inputs.past_k_rope, inputs.mask)
        ]
        rows, past = arrays[0].shape[0], arrays[3].shape[0]
        if arrays[5].shape != (rows, past + rows):
            # checked here, not only in the graph: the absorbed form reads the mask on the host
            # (`row_keys`), where a narrower mask would pick wrong keys instead of failing
            raise BatchError(f"mask must be [R, P + R] = [{rows}, {past + rows}], got {list(arrays[5].shape)}")
        form = self.attention_form(inputs.mask)
        if form is AttentionForm.ABSORBED:
            keys = row_keys(arrays[-1])
            arrays += [keys.index, keys.mask]
        else:  # the per-row key inputs are unused by the expanded branch
            arrays += [np.zeros((rows, 1), np.int32), np.zeros((rows, 1), np.float32)]
        flags = (form is AttentionForm.EXPANDED,)
        model, experts = bound
        if experts is None:
            hidden, latent, k_rope = self._rt.run(model, *arrays, host_flags=flags)
            return LayerOutputs(hidden, latent, k_rope, None)
        hidden, latent, k_rope, expert_ids = self._rt.run_moe(model, experts, *arrays, host_flags=flags)
        return LayerOutputs(hidden, latent, k_rope, expert_ids)

    def attention_form(self, mask: np.ndarray) -> AttentionForm:
        """The MLA form this microbatch runs in (see `mla_forms`)."""
        if self.options.attention_form != "auto":
            return AttentionForm(self.options.attention_form)
        rows, keys = mask.shape
        return choose_form(self.cfg, rows, keys, keys_per_row(mask))

    def final(self, hidden: np.ndarray) -> np.ndarray:
        if self._final is None:
            raise CheckpointError("this stage does not own the final norm and lm_head")
        return self._rt.run(self._final, np.ascontiguousarray(hidden, dtype=np.float32))[0]



def warm_compile_cache(cfg: DeepseekV2Config, options: MaxOptions,
                       on_graph: Callable[[str, int, int], None] | None = None,
                       variants: GraphVariants | None = None) -> dict[str, float]:
    """Compile (or fetch from the cache) every graph `cfg` needs, without weights, so a later
    stage load only pays cache hits: each graph kind, in every variant the MAX stages need
    (`libs.model.graph_variants`: a weight policy's, or a GGUF's stored formats'; None: the one
    unquantized variant), whose float dtype then follows them. Returns wall seconds per graph;
    `on_graph` hears (graph about to compile, graphs done, graphs in all) before each, and
    ("", all, all) at the end."""
    if variants is not None:
        options = replace(options, weight_dtype=variants.weight_dtype)
    if options.device not in DEVICES:
        raise BackendUnavailableError(f"max device {options.device!r} not in {DEVICES}")
    if options.weight_dtype not in WEIGHT_DTYPES:
        raise BackendUnavailableError(f"max weight dtype {options.weight_dtype!r} not in {WEIGHT_DTYPES}")
    _check_block_activations(options)
    from libs.model import max_runtime

    rt = max_runtime.shared_runtime(cfg, options.device, options.weight_dtype, options.progress,
                                    options.block_activations)
    from libs.model.compile_cache import GraphName

    graphs = [(kind, quant) for kind in max_runtime.graph_kinds_for(cfg)
              for quant in (variants.quant.get(GraphName(kind.value), ((),)) if variants is not None else ((),))]
    report = on_graph or (lambda kind, done, total: None)
    for done, (kind, quant) in enumerate(graphs):
        report(kind.value, done, len(graphs))
        rt.compiled(kind, quant)
    report("", len(graphs), len(graphs))
    return dict(rt.compile_seconds)
