"""Execution lease ids and deadline budgets: pure functions, no clocks read here."""

from __future__ import annotations

import uuid


def derive_execution_lease_id(plan_generation_id: str, plan_id: str, plan_hash: str,
                              request_id: str) -> str:
    """uuid5(plan_generation_id, "fnx2:{plan_id}:{plan_hash}:{request_id}").

    A new plan generation yields new lease ids, which fences every older lease.
    """
    return str(uuid.uuid5(uuid.UUID(plan_generation_id), f"fnx2:{plan_id}:{plan_hash}:{request_id}"))


def budget_from_deadline(deadline_ns: int, now_ns: int) -> int:
    """Remaining budget for the wire; 0 means already expired. Never a clock reading."""
    return max(0, deadline_ns - now_ns)


def local_deadline(now_ns: int, budget_ns: int, stored_deadline_ns: int | None) -> int:
    """Convert a received budget to this process's monotonic clock; a retry only tightens."""
    candidate = now_ns + budget_ns
    return candidate if stored_deadline_ns is None else min(stored_deadline_ns, candidate)
