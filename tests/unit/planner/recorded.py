"""Recorded registry records (as `tests/unit/planner/data/*.json` hold them) read back as the
planner reads them."""

from __future__ import annotations

import json
from pathlib import Path

from apps.fleet.plan_inventory import fleet_target, inventory_from_fleet
from apps.fleet.spec import load_fleet_spec
from services.planner.model import ModelDescription, describe_config
from services.planner.profiles import ProfileBook, ProfileRecordInput, book_from_records


def book_of(records: list[dict]) -> ProfileBook:
    return book_from_records(ProfileRecordInput(r["record_id"], r["record_type"], r["blob"].encode(),
                                                tuple(tuple(kv) for kv in r["labels"]), r["evidence_class"])
                             for r in records)


def planned_at(records: list[dict]) -> int:
    """A minute after the newest record: when the recorded plan was made."""
    return max(json.loads(r["blob"])["measured_unix_ns"] for r in records) + 60 * 10**9


def route_of(plan) -> str:
    return plan.route_key.split("|", 1)[1]


ROOT = Path(__file__).resolve().parents[3]
SPEC = load_fleet_spec(str(ROOT / "fleets" / "two-unlike-hosts.yaml"))
INVENTORY = inventory_from_fleet(SPEC).inventory
# `fornax up`'s planning target (InstallSpec defaults).
UP = fleet_target(SPEC, context_tokens=2048, concurrency=32, stages=None, mode="exploratory")


def recorded(name: str) -> tuple[dict, ModelDescription]:
    """A data file of this directory and the model its records profiled."""
    data = json.loads((Path(__file__).parent / "data" / name).read_text())
    return data, describe_config(data["checkpoint_config"], snapshot=data["model_snapshot"])
