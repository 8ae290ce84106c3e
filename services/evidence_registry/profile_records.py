"""Stage and link profiles as registry records (labels per libs/profiles/schema.py). Pure.

The blob is the profile's canonical JSON; the record states the same facts as provenance, so a
registry query and a reader of the record see where, on what and how each profile was measured.
"""

from __future__ import annotations

from libs.common.kinds import DType
from libs.profiles.schema import (
    LABEL_BACKEND,
    LABEL_FROM_HOST,
    LABEL_HOST,
    LABEL_MAX_ACTIVATIONS,
    LABEL_PROFILE,
    LABEL_TO_HOST,
    LinkProfile,
    StageProfile,
    to_json,
)
from services.evidence_registry.domain import (
    EvidenceClass,
    LayerRange,
    Provenance,
    RecordContent,
    RecordType,
    ValidityWindow,
)

NS_PER_S = 10**9
LABEL_SNAPSHOT = "model_snapshot"
LABEL_WORKER = "worker"


def _window(measured_unix_ns: int, valid_for_s: int) -> ValidityWindow:
    return ValidityWindow(measured_unix_ns, measured_unix_ns + valid_for_s * NS_PER_S)


def stage_shapes(profile: StageProfile, shapes: str) -> str:
    """What ran: the measured grid, the context and concurrency, then the model's shapes."""
    kinds = profile.kinds[0] if profile.kinds else None
    grid = ""
    if kinds is not None:
        grid = (f"prefill S in {sorted(kinds.prefill_s_per_token)}, decode batch in "
                f"{sorted(kinds.decode_s_per_microbatch)}, ")
    return (f"kinds {','.join(k.kind for k in profile.kinds)}; {grid}decode past in {list(profile.decode_contexts)} "
            f"tokens (context {profile.context_tokens}), "
            f"concurrency {profile.concurrency}; {shapes}")


def profiled_build(profile: StageProfile) -> str:
    """The backend build a profile timed, with a max profile's block-format activations."""
    return f"{profile.backend_build} ({profile.activations_label})" if profile.max_activations else \
        profile.backend_build


def stage_profile_record(profile: StageProfile, layer_range: tuple[int, int],
                         shapes: str) -> tuple[RecordContent, bytes]:
    """An unsigned stage-profile record; `layer_range` covers the layers that were timed."""
    content = RecordContent(
        type=RecordType.MEASUREMENT,
        evidence_class=EvidenceClass.PHYSICAL,
        validity=_window(profile.measured_unix_ns, profile.valid_for_s),
        provenance=Provenance(
            hardware=profile.host.describe(), backend_build=profiled_build(profile),
            model_snapshot=profile.model_snapshot, command=profile.command,
            layer_range=LayerRange(*layer_range), dtype=DType(profile.dtype),
            shapes=stage_shapes(profile, shapes)),
        labels=tuple(sorted({
            LABEL_PROFILE: "stage", LABEL_HOST: profile.host.host, LABEL_BACKEND: profile.backend,
            LABEL_SNAPSHOT: profile.model_snapshot, LABEL_WORKER: profile.worker,
            **({LABEL_MAX_ACTIVATIONS: profile.max_activations} if profile.max_activations else {}),
        }.items())),
        subject=f"stage-profile:{profile.host.host}",
    )
    return content, to_json(profile)


def link_profile_record(profile: LinkProfile, hardware: str, build: str, shapes: str) -> tuple[RecordContent, bytes]:
    """An unsigned link-profile record. A link runs no model layers: its model snapshot is the
    transport itself, and it names no layer range (see validation.TRANSPORT_MEASUREMENT)."""
    content = RecordContent(
        type=RecordType.MEASUREMENT,
        evidence_class=EvidenceClass.PHYSICAL,
        validity=_window(profile.measured_unix_ns, profile.valid_for_s),
        provenance=Provenance(hardware=hardware, backend_build=build, model_snapshot=f"none ({profile.transport} link)",
                              command=profile.command, dtype=DType.BF16, shapes=shapes),
        labels=tuple(sorted({LABEL_PROFILE: "link", LABEL_FROM_HOST: profile.from_host,
                             LABEL_TO_HOST: profile.to_host}.items())),
        subject=f"link-profile:{profile.from_host}->{profile.to_host}",
    )
    return content, to_json(profile)


def label(content: RecordContent, key: str) -> str:
    return dict(content.labels).get(key, "")
