"""The operations a stage worker implements, named as the planner's model description requires
them (services/planner/model.py). A worker reports them over `GetCapabilities`; `fornax plan
--fleet` declares them for a fleet file's hosts before any worker runs."""

from __future__ import annotations

SUPPORTED_OPERATIONS = (
    "embedding",
    "rmsnorm",
    "mla_attention",
    "rope",
    "rope_yarn",
    "swiglu",
    "lm_head",
    "moe_router_softmax_topk",
    "moe_group_limited_greedy",
    "shared_experts",
    "sampling",
)
