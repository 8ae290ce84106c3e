"""Measured evidence the planner plans from: stage and link profiles and route calibrations.

Pure values. Records arrive as the registry holds them (id, type, labels, blob, class); the
blob is parsed with `libs.profiles.schema`. A record's standing says whether the registry
vouches for it now (active, inside its window, blob hash as stated) and whether the blob's own
validity (`measured_unix_ns + valid_for_s`) still holds; only usable records feed a plan.

Label conventions relied on (see `libs.profiles.schema`): stage profiles are `measurement`
records labelled `profile=stage`, `host=<name>`; link profiles `profile=link`, `from_host`,
`to_host`; calibrations are `calibration` records labelled `route_key=<key>`, `passed=true|false`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from libs.profiles import schema
from libs.service.errors import InvalidArgument
from services.planner import domain as d

PHYSICAL = "physical"


@dataclass(frozen=True)
class ProfileRecordInput:
    """One registry record as fetched: what the planner is handed."""

    record_id: str
    record_type: str  # "measurement" or "calibration"
    blob: bytes
    labels: tuple[tuple[str, str], ...] = ()
    evidence_class: str = PHYSICAL

    def label(self, key: str) -> str:
        return dict(self.labels).get(key, "")

    @property
    def blob_sha256(self) -> str:
        return "sha256:" + hashlib.sha256(self.blob).hexdigest()


@dataclass(frozen=True)
class Standing:
    """Whether the registry vouches for a record now (`reason` is its stable code when not)."""

    ok: bool = True
    reason: str = ""
    detail: str = ""
    evidence_class: str = PHYSICAL


@dataclass(frozen=True)
class StageRecord:
    record_id: str
    profile: schema.StageProfile
    standing: Standing = Standing()


@dataclass(frozen=True)
class LinkRecord:
    record_id: str
    profile: schema.LinkProfile
    standing: Standing = Standing()


@dataclass(frozen=True)
class CalibrationRecord:
    record_id: str
    calibration: schema.Calibration
    passed_label: bool
    standing: Standing = Standing()


@dataclass(frozen=True)
class Problem:
    """Why a record cannot back a term: a stable reason and what it is about."""

    reason: str
    subject: str
    record_id: str
    detail: str

    def describe(self) -> str:
        return f"{self.reason} {self.subject}" + (f" (record {self.record_id})" if self.record_id else "") + \
            f": {self.detail}"


def _expired_at(measured_unix_ns: int, valid_for_s: int) -> int:
    return measured_unix_ns + valid_for_s * 10**9 if valid_for_s > 0 else 0


def _standing_problem(record_id: str, subject: str, standing: Standing, until_ns: int, now_ns: int,
                      *, calibration: bool = False) -> Problem | None:
    if not standing.ok:
        if calibration:
            reason = d.CALIBRATION_EXPIRED if standing.reason == "EXPIRED" else d.CALIBRATION_UNRESOLVED
        else:
            reason = {"EXPIRED": d.PROFILE_EXPIRED, "REVOKED": d.PROFILE_REVOKED}.get(
                standing.reason, d.PROFILE_UNRESOLVED)
        return Problem(reason, subject, record_id, f"registry: {standing.reason} {standing.detail}".strip())
    if standing.evidence_class != PHYSICAL:
        return Problem(d.PROFILE_NOT_PHYSICAL if not calibration else d.CALIBRATION_UNRESOLVED, subject, record_id,
                       f"evidence class is {standing.evidence_class or 'unstated'}, not physical")
    if until_ns and now_ns >= until_ns:
        return Problem(d.CALIBRATION_EXPIRED if calibration else d.PROFILE_EXPIRED, subject, record_id,
                       f"measured with a validity of its own that ended at {until_ns} ns (now {now_ns} ns)")
    return None


@dataclass(frozen=True)
class ProfileBook:
    """The newest stage profile per host, link profile per (from, to), calibration per route."""

    stages: tuple[StageRecord, ...] = ()
    links: tuple[LinkRecord, ...] = ()
    calibrations: tuple[CalibrationRecord, ...] = ()

    @property
    def record_ids(self) -> tuple[str, ...]:
        return (tuple(r.record_id for r in self.stages) + tuple(r.record_id for r in self.links)
                + tuple(r.record_id for r in self.calibrations))

    def stage_record(self, host: str, max_activations: str | None = None) -> StageRecord | None:
        """The host's newest stage profile; given the host's `max_activations` (its MAX stage's
        block-format activations, "" on numpy), the newest timed in that mode where one is: a
        profile of the other mode stands aside (`stage_problem` names it when no other is)."""
        found = [r for r in self.stages if r.profile.host.host == host]
        same = [r for r in found if r.profile.max_activations == max_activations]
        return max(same or found, key=lambda r: r.profile.measured_unix_ns, default=None)

    def link_record(self, from_host: str, to_host: str) -> LinkRecord | None:
        """The link measured in this direction; else the reverse direction (links are symmetric)."""
        for a, b in ((from_host, to_host), (to_host, from_host)):
            found = [r for r in self.links if (r.profile.from_host, r.profile.to_host) == (a, b)]
            if found:
                return max(found, key=lambda r: r.profile.measured_unix_ns)
        return None

    def calibration_record(self, route_key: str) -> CalibrationRecord | None:
        """The route's newest gate (a profile's serving window is a measurement, not a verdict)."""
        found = [r for r in self.calibrations
                 if r.calibration.route_key == route_key and r.calibration.purpose == schema.GATE]
        return max(found, key=lambda r: r.calibration.measured_unix_ns, default=None)

    def stage_problem(self, host: str, model_snapshot: str, backend: str, now_ns: int,
                      weights_policy: str = "", max_activations: str | None = None) -> Problem | None:
        """Why the host's stage profile cannot be used (None: it can). `max_activations`: the
        mode the host's stage runs (`node_activations`); None checks no mode."""
        record = self.stage_record(host, max_activations)
        if record is None:
            return Problem(d.MISSING_PROFILE, f"host {host}", "", "no stage profile record for this host")
        p = record.profile
        problem = _standing_problem(record.record_id, f"host {host}", record.standing,
                                    _expired_at(p.measured_unix_ns, p.valid_for_s), now_ns)
        if problem is not None:
            return problem
        if p.model_snapshot != model_snapshot:
            return Problem(d.PROFILE_MISMATCH, f"host {host}", record.record_id,
                           f"measured on model {p.model_snapshot}, planning {model_snapshot}")
        if p.backend != backend:
            return Problem(d.PROFILE_MISMATCH, f"host {host}", record.record_id,
                           f"measured on backend {p.backend}, the node runs {backend}")
        if weights_policy and p.weights_policy != weights_policy:
            return Problem(d.PROFILE_MISMATCH, f"host {host}", record.record_id,
                           f"measured with {p.weights_policy} weights, planning {weights_policy} weights")
        if max_activations is not None and p.max_activations != max_activations:
            return Problem(d.PROFILE_MISMATCH, f"host {host}", record.record_id,
                           f"timed with {p.activations_label or 'no max activations'}, the node runs "
                           f"{max_activations or 'none'} activations")
        return None

    def link_problem(self, from_host: str, to_host: str, now_ns: int) -> Problem | None:
        record = self.link_record(from_host, to_host)
        subject = f"link {from_host}->{to_host}"
        if record is None:
            return Problem(d.MISSING_PROFILE, subject, "", "no link profile record for this pair of hosts")
        p = record.profile
        return _standing_problem(record.record_id, subject, record.standing,
                                 _expired_at(p.measured_unix_ns, p.valid_for_s), now_ns)

    def calibration_problem(self, route_key: str, now_ns: int, profile_ids: Sequence[str] = ()) -> Problem | None:
        """`profile_ids`: the profile records the plan rests on; a calibration that names the
        records it qualified must cover them (newer profiles need a new qualification)."""
        record = self.calibration_record(route_key)
        subject = f"route {route_key}"
        if record is None:
            return Problem(d.MISSING_CALIBRATION, subject, "", "no calibration record for this route "
                           "(run `fornax qualify` on this placement)")
        c = record.calibration
        problem = _standing_problem(record.record_id, subject, record.standing,
                                    _expired_at(c.measured_unix_ns, c.valid_for_s), now_ns, calibration=True)
        if problem is not None:
            return problem
        if not (record.passed_label and c.passed):
            why = "; ".join(c.failures) or (f"bottleneck prediction error {c.bottleneck_prediction_error:.1%} "
                                            f"over the {c.tolerance:.0%} bound")
            return Problem(d.CALIBRATION_FAILED, subject, record.record_id, f"the gate did not pass: {why}")
        uncovered = [x for x in profile_ids if c.evidence_ids and x not in c.evidence_ids]
        if uncovered:
            return Problem(d.CALIBRATION_STALE, subject, record.record_id,
                           f"qualified on profiles {', '.join(c.evidence_ids)}; the plan now rests on "
                           f"{', '.join(uncovered)} too (run `fornax qualify` again)")
        return None

    def with_standings(self, standings: dict[str, Standing]) -> ProfileBook:
        """The same records, each with the standing the registry gave it (absent: unresolved)."""
        missing = Standing(False, "NO_ANSWER", "the registry returned no resolution")
        return ProfileBook(
            stages=tuple(replace(r, standing=standings.get(r.record_id, missing)) for r in self.stages),
            links=tuple(replace(r, standing=standings.get(r.record_id, missing)) for r in self.links),
            calibrations=tuple(replace(r, standing=standings.get(r.record_id, missing)) for r in self.calibrations),
        )


class ProfileRecordError(InvalidArgument):
    default_reason = "BAD_PROFILE_RECORD"


def book_from_records(records: Iterable[ProfileRecordInput]) -> ProfileBook:
    """Parses each record by its type and labels; a record whose blob is not what its labels
    say is refused (InvalidArgument BAD_PROFILE_RECORD, naming it)."""
    stages: list[StageRecord] = []
    links: list[LinkRecord] = []
    calibrations: list[CalibrationRecord] = []
    for r in records:
        standing = Standing(evidence_class=r.evidence_class)
        try:
            if r.record_type == "calibration":
                calibrations.append(CalibrationRecord(r.record_id, schema.calibration_from_json(r.blob),
                                                      r.label(schema.LABEL_PASSED) == "true", standing))
            elif r.label(schema.LABEL_PROFILE) == "stage":
                stages.append(StageRecord(r.record_id, schema.stage_profile_from_json(r.blob), standing))
            elif r.label(schema.LABEL_PROFILE) == "link":
                links.append(LinkRecord(r.record_id, schema.link_profile_from_json(r.blob), standing))
            else:
                raise schema.ProfileFormatError(
                    f"type {r.record_type!r} with profile label {r.label(schema.LABEL_PROFILE)!r} is neither a "
                    "stage or link profile nor a calibration")
        except schema.ProfileFormatError as exc:
            raise ProfileRecordError(f"record {r.record_id}: {exc}", field="profiles.records") from exc
    return ProfileBook(tuple(stages), tuple(links), tuple(calibrations))


def expectations(records: Sequence[ProfileRecordInput]) -> list[tuple[str, str, str]]:
    """(record_id, type, expected blob sha256) per record: what deployment re-resolves."""
    return [(r.record_id, r.record_type, r.blob_sha256) for r in records]
