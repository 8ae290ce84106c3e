"""Stage plans and tensor ownership: which stage gets which checkpoint tensor.

Ownership rules: the first stage owns the embeddings; the last owns the final norm and the LM
head; every decoder layer's tensors (attention, norms, router, shared and routed experts)
travel with the layer. With tied embeddings the last stage receives an explicit
`lm_head.weight` copy of `model.embed_tokens.weight`, declared in its manifest.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from libs.artifacts.manifest import canonical_hash
from libs.model.config import DeepseekV2Config
from libs.model.layout import EMBED, LM_HEAD, tensors_for_layers
from services.artifact_builder.errors import PlanInvalidError, UnionMismatchError
from services.artifact_builder.snapshot import SourceTensor

EXPLICIT_PLAN_ID = "explicit-layer-ranges"


@dataclass(frozen=True)
class StageRange:
    """Layers [layer_start, layer_end) of one stage."""

    stage_index: int
    layer_start: int
    layer_end: int


@dataclass(frozen=True)
class StagePlan:
    plan_id: str
    plan_hash: str  # "sha256:<hex>"
    stages: tuple[StageRange, ...]


@dataclass(frozen=True)
class OwnedTensor:
    """A tensor of a stage artifact; `source` differs in name only for the tied head copy."""

    name: str
    source: SourceTensor


@dataclass(frozen=True)
class StageContents:
    stage: StageRange
    stage_count: int
    owns_embeddings: bool
    owns_head: bool
    tensors: tuple[OwnedTensor, ...]
    tied_copies: tuple[str, ...]

    @property
    def weight_bytes(self) -> int:
        return sum(t.source.nbytes for t in self.tensors)


def even_layer_ranges(num_layers: int, stage_count: int) -> tuple[tuple[int, int], ...]:
    """Contiguous ranges, sizes differing by at most one, earlier stages taking the extra."""
    if not 1 <= stage_count <= num_layers:
        raise PlanInvalidError(f"cannot cut {num_layers} layers into {stage_count} stages", field="stages")
    base, extra = divmod(num_layers, stage_count)
    ranges, start = [], 0
    for i in range(stage_count):
        end = start + base + (1 if i < extra else 0)
        ranges.append((start, end))
        start = end
    return tuple(ranges)


def plan_from_ranges(ranges: tuple[tuple[int, int], ...], plan_id: str = "", plan_hash: str = "") -> StagePlan:
    """A plan from explicit ranges; without a given hash, hash the canonical ranges."""
    stages = tuple(StageRange(i, s, e) for i, (s, e) in enumerate(ranges))
    if not plan_hash:
        plan_hash = canonical_hash({"layer_ranges": [[s, e] for s, e in ranges]})
    return StagePlan(plan_id=plan_id or EXPLICIT_PLAN_ID, plan_hash=plan_hash, stages=stages)


def validate_plan(plan: StagePlan, num_layers: int) -> None:
    """Stages must be non-empty, contiguous, in order, and cover [0, num_layers) exactly."""
    if not plan.stages:
        raise PlanInvalidError("the plan has no stages", field="layer_ranges")
    if not plan.plan_hash.startswith("sha256:"):
        raise PlanInvalidError(f"plan hash {plan.plan_hash!r} is not sha256:<hex>", field="plan_hash")
    cursor = 0
    for index, stage in enumerate(plan.stages):
        if stage.stage_index != index:
            raise PlanInvalidError(f"stage {index} has stage_index {stage.stage_index}", field="layer_ranges")
        if stage.layer_start != cursor or stage.layer_end <= stage.layer_start:
            raise PlanInvalidError(
                f"stage {index} covers [{stage.layer_start}, {stage.layer_end}); "
                f"expected a non-empty range starting at {cursor}",
                field="layer_ranges",
            )
        cursor = stage.layer_end
    if cursor != num_layers:
        raise PlanInvalidError(
            f"the plan covers layers [0, {cursor}), the model has {num_layers}", field="layer_ranges"
        )


def assign_tensors(
    config: DeepseekV2Config, plan: StagePlan, tensors: dict[str, SourceTensor]
) -> tuple[StageContents, ...]:
    validate_plan(plan, config.num_hidden_layers)
    count = len(plan.stages)
    contents = tuple(_stage_contents(config, stage, count, tensors) for stage in plan.stages)
    check_union(config, contents, set(tensors))
    return contents


def _stage_contents(
    config: DeepseekV2Config, stage: StageRange, count: int, tensors: dict[str, SourceTensor]
) -> StageContents:
    first, last = stage.stage_index == 0, stage.stage_index == count - 1
    names = tensors_for_layers(config, stage.layer_start, stage.layer_end, first, last)
    tied = config.tie_word_embeddings and last
    # tensors_for_layers names the embedding matrix as a tied last stage's head; this artifact
    # carries it as an explicit lm_head.weight copy instead, and the embeddings only when first.
    owned = [OwnedTensor(n, tensors[n]) for n in names if n != EMBED or first]
    if tied:
        owned.append(OwnedTensor(LM_HEAD, tensors[EMBED]))
    return StageContents(
        stage=stage,
        stage_count=count,
        owns_embeddings=first,
        owns_head=last,
        tensors=tuple(sorted(owned, key=lambda t: t.name)),
        tied_copies=(LM_HEAD,) if tied else (),
    )


def check_union(config: DeepseekV2Config, contents: tuple[StageContents, ...], checkpoint: set[str]) -> None:
    """The stages together hold the checkpoint plus the declared tied copy, each exactly once."""
    counts = Counter(t.name for c in contents for t in c.tensors)
    duplicated = sorted(n for n, k in counts.items() if k > 1)
    if duplicated:
        raise UnionMismatchError(f"tensors placed in more than one stage: {duplicated[:5]}")
    declared = {n for c in contents for n in c.tied_copies}
    expected = checkpoint | declared
    if set(counts) != expected:
        missing, extra = sorted(expected - set(counts)), sorted(set(counts) - expected)
        raise UnionMismatchError(f"stage union differs from the checkpoint: missing {missing[:5]}, extra {extra[:5]}")
    for c in contents:
        for t in c.tensors:
            copied = t.name != t.source.name
            if copied and not (t.name in c.tied_copies and t.source.name == EMBED and config.tie_word_embeddings):
                raise UnionMismatchError(f"stage {c.stage.stage_index}: undeclared copy {t.source.name} -> {t.name}")
