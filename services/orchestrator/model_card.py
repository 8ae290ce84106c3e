"""What a route serves, derived from the model config and the stage layer ranges."""

from __future__ import annotations

from libs.model.config import DeepseekV2Config
from services.orchestrator.domain import ServedModel, StageLayout, mla_kv_bytes_per_token


def even_layer_split(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous [layer_start, layer_end) ranges, sizes differing by at most one."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"cannot cut {num_layers} layers into {stages} stages")
    base, extra = divmod(num_layers, stages)
    bounds, start = [], 0
    for index in range(stages):
        end = start + base + (1 if index < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def served_model(cfg: DeepseekV2Config, ranges: list[tuple[int, int]], model_id: str,
                 kv_budget_bytes: int | None = None,
                 stage_kv_budgets: tuple[int, ...] | None = None) -> ServedModel:
    """`kv_budget_bytes` is every stage's KV limit; `stage_kv_budgets` gives one per stage."""
    budgets = stage_kv_budgets or (kv_budget_bytes,) * len(ranges)
    if len(budgets) != len(ranges):
        raise ValueError(f"{len(budgets)} KV budgets for {len(ranges)} stages")
    layouts = tuple(StageLayout(a, b, mla_kv_bytes_per_token(cfg.kv_lora_rank,
                                                              cfg.qk_rope_head_dim, b - a),
                                budget)
                    for (a, b), budget in zip(ranges, budgets))
    return ServedModel(model_id=model_id, context_length=cfg.max_position_embeddings,
                       vocab_size=cfg.vocab_size, stages=layouts)
