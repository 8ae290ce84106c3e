"""What a route serves, derived from the model config and the stage layer ranges."""

from __future__ import annotations

from libs.common.kinds import Backend
from libs.model.config import DeepseekV2Config
from libs.model.kv_blocks import KV_BLOCK_TOKENS
from services.orchestrator.engine.domain import (
    EvidenceClass,
    RouteCard,
    ServedModel,
    StageLayout,
    mla_kv_bytes_per_token,
)
from services.planner.model import describe_checkpoint


def route_card(model_snapshot: str, backend: Backend | None, boundary_dtype: str, plan_id: str,
               plan_mode: str) -> RouteCard:
    """`backend` None: each stage runs its own worker's backend; the card then claims only the
    weaker class (reference), never physical, and says the backend is mixed."""
    execution = EvidenceClass.PHYSICAL if backend is Backend.MAX else EvidenceClass.REFERENCE
    return RouteCard(model_snapshot=model_snapshot, plan_id=plan_id, plan_mode=plan_mode,
                     backend=str(backend) if backend is not None else "mixed",
                     boundary_dtype=str(boundary_dtype), execution_evidence=execution)


def checkpoint_snapshot(checkpoint_dir: str) -> str:
    return describe_checkpoint(checkpoint_dir).model_snapshot


def served_model(cfg: DeepseekV2Config, ranges: list[tuple[int, int]], model_id: str,
                 kv_budget_bytes: int | None = None,
                 stage_kv_budgets: tuple[int, ...] | None = None,
                 stage_kv_blocks: tuple[tuple[int, int | None], ...] | None = None,
                 kv_dtype: str = "fp32") -> ServedModel:
    """`kv_budget_bytes` is every stage's KV limit; `stage_kv_budgets` gives one per stage;
    `stage_kv_blocks` gives each stage's own (block tokens, total blocks) when it reported them;
    `kv_dtype` is the stages' KV element type (the admission's bytes per token)."""
    budgets = stage_kv_budgets or (kv_budget_bytes,) * len(ranges)
    if len(budgets) != len(ranges):
        raise ValueError(f"{len(budgets)} KV budgets for {len(ranges)} stages")
    blocks = stage_kv_blocks or ((KV_BLOCK_TOKENS, None),) * len(ranges)
    if len(blocks) != len(ranges):
        raise ValueError(f"{len(blocks)} KV block counts for {len(ranges)} stages")
    layouts = tuple(StageLayout(a, b, mla_kv_bytes_per_token(cfg.kv_lora_rank,
                                                              cfg.qk_rope_head_dim, b - a, kv_dtype),
                                budget, block_tokens, total)
                    for (a, b), budget, (block_tokens, total) in zip(ranges, budgets, blocks, strict=True))
    return ServedModel(model_id=model_id, context_length=cfg.max_position_embeddings,
                       vocab_size=cfg.vocab_size, stages=layouts)
