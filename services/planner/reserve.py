"""The runtime's own resident memory the planner holds back on a host: measured where it can be.

Pure. A host's usable stage profile (`ProfileBook.stage_problem` finds none: same model,
backend, weight policy and MAX activations, inside its validity) that records `runtime_resident` gives the
reserve as a physical measurement: the worker's resident memory beyond its weights and KV
(`libs.profiles.schema.RuntimeResident`). Anywhere else the node's own reserve stands, a
declared estimate (a fleet file's hosts and running workers: `inventory_facts.RUNTIME_RESERVE_BYTES`;
an inventory file: its `reserve:`), and the choice says why no measurement applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.planner.inventory import Node
from services.planner.profiles import ProfileBook

PHYSICAL = "physical"
DECLARED = "declared"


@dataclass(frozen=True)
class ReserveChoice:
    reserve_bytes: int
    evidence: str  # PHYSICAL or DECLARED
    record_id: str  # the stage profile that measured it; "" when declared
    detail: str

    @property
    def measured(self) -> bool:
        return self.evidence == PHYSICAL


def choose_reserve(node: Node, host: str, book: ProfileBook, model_snapshot: str, weights_policy: str,
                   now_ns: int) -> ReserveChoice:
    """The measured reserve of `host`'s usable stage profile, else `node.reserve_bytes` (declared)."""
    declared = f"declared {node.reserve_bytes / 2**20:.0f} MiB for the {node.backend} runtime"
    problem = book.stage_problem(host, model_snapshot, str(node.backend), now_ns, weights_policy, node.activations)
    if problem is not None:
        return ReserveChoice(node.reserve_bytes, DECLARED, "", f"{declared} (no measurement applies: "
                             f"{problem.describe()})")
    record = book.stage_record(host, node.activations)
    assert record is not None  # stage_problem found it usable
    resident = record.profile.runtime_resident
    if resident is None:
        return ReserveChoice(node.reserve_bytes, DECLARED, "", f"{declared} (stage profile {record.record_id} "
                             "predates the measured runtime reserve: run `fornax profile` again)")
    peak = max(resident.samples, key=lambda s: s.runtime_bytes)
    return ReserveChoice(resident.reserve_bytes, PHYSICAL, record.record_id,
                         f"measured on {host} ({record.profile.host.cpu_model}) by stage profile {record.record_id}: "
                         f"{peak.point}, resident {peak.rss_bytes / 2**20:.0f} MiB less weight file pages "
                         f"{peak.weight_file_bytes / 2**20:.0f} MiB and KV {peak.kv_bytes / 2**20:.0f} MiB "
                         f"(largest of {len(resident.samples)} samples)")
