"""The deployment-mode `Resolver` backed by the evidence registry's ResolveRecords RPC."""

from __future__ import annotations

from collections.abc import Sequence

from services.evidence_registry.client import ClientOptions, RegistryClient, expectation
from services.planner.evidence import Resolution
from services.planner.inventory import EvidenceRef


class RegistryResolver:
    """Blocking; the server calls it from a worker thread, the CLI directly."""

    def __init__(self, address: str, options: ClientOptions = ClientOptions()) -> None:
        self.address = address
        self._options = options

    def resolve(self, refs: Sequence[EvidenceRef]) -> list[Resolution]:
        expectations = [expectation(r.record_id, r.record_type, r.sha256) for r in refs]
        with RegistryClient(self.address, self._options) as client:
            outcome = client.resolve_records(expectations)
        return [Resolution(x.record_id, x.ok, x.reason_code, x.detail,
                           x.record.content.evidence_class.value if x.record is not None else "")
                for x in outcome.resolutions]
