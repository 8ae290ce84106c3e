"""Cost tables from stage and link profiles: per node, per layer, per route.

Every time here is a prediction computed from physical measurements (the profiles' medians),
never a measurement of the plan itself:
- a decoder layer's decode time at `r` microbatch rows and `c` tokens of past per row
  interpolates its kind's measured seconds per microbatch over the measured batches (1, 8, 32)
  at each measured past, then over the measured pasts (32, 128, 512), linearly, extrapolating
  the last segment beyond them (`interpolate_grid`); the past is the target's decode context
  (`Target.decode_context`: the configured context unless a decode context is given). Attention
  reads rows x past, so on a host where it dominates a short past costs far less than the
  longest. A profile measured at one past only (an older record) stands at that past for every
  context. MoE layers use the `moe` kind, whose measurement already routes sparsely, and between
  its measured batches follow the distinct experts their rows reach (`expert_rows`), not a line;
- a layer's prefill time is its kind's measured seconds per token at the target prompt length
  (interpolated over S = 16, 128, 512) times the prompt length;
- the first stage adds the `embed` kind, the last the `head` kind (one row of logits for a prefill);
- every stage adds its host's measured per-microbatch step overhead of a served decode step
  (executor KV bookkeeping, mask, sampling, the data plane's unpack and pack), interpolated to the
  rows and past like the layers (never below 0): its own `step` term. Prefill predictions do not add it;
- memory is each kind's resident bytes, plus its KV bytes per token times context times
  concurrency, plus the activation buffers the checkpoint's config implies, plus the host's
  reserve: the runtime's own resident memory its profile measured (`reserve.choose_reserve`),
  else the node's declared reserve (its own `reserve` term says which);
- a route carries one frame per microbatch: half the measured 32 KiB round trip plus the frame's
  bytes over the measured throughput. The link profile times real FNX2 frames end to end, so
  packing and unpacking are inside that wire term and read 0 on their own.

Gaps (a host, kind or link without a usable profile) are filled with the declared roofline of
`costs.py` and every such term says so; deployment mode refuses plans that have any.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from libs.profiles import schema
from services.planner import domain as d
from services.planner.costs import CostTables, _edge_terms, build_tables, build_workload
from services.planner.expert_rows import expected_distinct, expert_shaped
from services.planner.inventory import Inventory, Node, Target
from services.planner.model import ModelDescription
from services.planner.profiles import Problem, ProfileBook
from services.planner.reserve import ReserveChoice, choose_reserve
from services.planner.route_feedback import Correction, borrowed, compute_correction, wire_correction

DECLARED = ""  # the source of a term filled with a declared figure
STEP = "step"  # the sources key of a node's per-microbatch step overhead


def interpolate(table: dict[int, schema.Figure], x: float) -> float:
    """Median at `x`, linear between measured points, the end segment's slope beyond them
    (never below the smallest measured value); one point: that value."""
    points = sorted((float(k), f.median) for k, f in table.items())
    if not points:
        raise ValueError("no measured points")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if len(points) == 1 or x <= xs[0]:
        return ys[0]
    if x <= xs[-1]:
        return float(np.interp(x, xs, ys))
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return max(ys[-1] + slope * (x - xs[-1]), min(ys))


RowCurve = Callable[[dict[int, schema.Figure], float], float]


def interpolate_grid(grid: dict[int, dict[int, schema.Figure]], rows: float, context: float,
                     row_curve: RowCurve = interpolate) -> float:
    """Median at (`rows`, `context`): each measured past's table taken to `rows` by `row_curve`,
    then those values interpolated to `context` as `interpolate` does (linear inside, the end
    segment's slope beyond, never below the smallest value; a single past stands for every one)."""
    if not grid:
        raise ValueError("no measured points")
    at_rows = {c: schema.Figure(row_curve(table, rows), 0.0, 0.0, 1, "") for c, table in grid.items()}
    return interpolate(at_rows, context)


@dataclass(frozen=True)
class NodeCosts:
    """One node's decode/prefill seconds and resident bytes, and where each kind came from."""

    decode_layer_s: np.ndarray  # (L,)
    prefill_layer_s: np.ndarray  # (L,)
    layer_bytes: np.ndarray  # (L,) resident weights
    layer_kv_bytes: np.ndarray  # (L,) KV for context * concurrency
    embed_decode_s: float
    head_decode_s: float
    embed_prefill_s: float
    head_prefill_s: float
    copy_decode_s: float  # pack or unpack of one decode boundary frame
    copy_prefill_s: float
    step_decode_s: float  # per served decode microbatch beyond its layers (0 when declared)
    embed_bytes: int
    head_bytes: int
    sources: dict[str, str]  # kind -> record id, DECLARED when filled
    problem: Problem | None  # why the host's profile was not used (None: it was)
    # Kind (embed, dense, moe, head, step) -> the route calibration that scaled its decode compute
    # on this host (absent: layer profiles alone).
    compute_corrections: dict[str, Correction] = field(default_factory=dict)
    # The runtime's own resident memory held back on the host: measured or declared.
    reserve: ReserveChoice | None = None

    @property
    def reserve_bytes(self) -> int:
        return self.reserve.reserve_bytes if self.reserve is not None else 0


@dataclass(frozen=True)
class MeasuredTables:
    model: ModelDescription
    target: Target
    nodes: tuple[Node, ...]
    costs: tuple[NodeCosts, ...]
    usable_bytes: np.ndarray  # (n,)
    activation_bytes: int
    logits_bytes: int
    boundary_row_bytes: int
    link_decode_s: np.ndarray  # (n, n), inf where no route
    link_prefill_s: np.ndarray
    link_sources: dict[tuple[int, int], str]  # (i, j) -> link record id, DECLARED when filled
    link_corrections: dict[tuple[int, int], Correction]  # (i, j) -> route calibration of its wire term

    @property
    def num_layers(self) -> int:
        return self.model.num_layers


def host_of(node: Node) -> str:
    return node.host or node.name


def stage_kinds(model: ModelDescription, a: int, b: int) -> frozenset[str]:
    """The kinds of decode compute a stage of layers [a, b) runs, its step overhead included."""
    kinds = {"moe" if x.is_moe else "dense" for x in model.layers[a:b]} | {STEP}
    return frozenset(kinds | ({"embed"} if a == 0 else set()) | ({"head"} if b == model.num_layers else set()))


def moe_row_curve(model: ModelDescription) -> RowCurve:
    """How a MoE layer's decode time runs between its measured batches (`expert_rows`)."""
    if model.routed_experts <= 0:
        return interpolate
    distinct = expected_distinct(model.routed_experts, model.experts_per_token)
    return partial(expert_shaped, distinct=distinct, straight=interpolate)


def route_corrections(book: ProfileBook, model: ModelDescription, host: str, record_id: str) -> dict[str, Correction]:
    """Per kind, the newest route calibration of `host` predicted from `record_id` whose stage ran
    that kind; for a kind none ran, the newest of the host where it raises the kind (`borrowed`)."""
    def ran_kind(kind: str) -> Callable[[schema.StageCalibration], bool]:
        return lambda stage: kind in stage_kinds(model, stage.layer_start, stage.layer_end)

    found: dict[str, Correction] = {}
    for kind in (*schema.LAYER_KINDS, STEP):
        correction = compute_correction(book, model.model_snapshot, host, record_id, ran_kind(kind))
        if correction is not None:
            found[kind] = correction
    if len(found) < len(schema.LAYER_KINDS) + 1:
        newest = compute_correction(book, model.model_snapshot, host, record_id)
        ran = tuple(sorted(k for k, c in found.items() if newest is not None and c.record_id == newest.record_id))
        stand_in = borrowed(newest, ran)
        if stand_in is not None:
            found = {k: found.get(k, stand_in) for k in (*schema.LAYER_KINDS, STEP)}
    return found


def _scaled(costs: NodeCosts, model: ModelDescription, corrections: dict[str, Correction]) -> NodeCosts:
    """`costs` with each kind's decode compute at its route calibration's level (`route_feedback`)."""
    def factor(kind: str) -> float:
        return corrections[kind].factor if kind in corrections else 1.0

    per_layer = np.array([factor("moe" if x.is_moe else "dense") for x in model.layers])
    return replace(costs, decode_layer_s=costs.decode_layer_s * per_layer, embed_decode_s=costs.embed_decode_s *
                   factor("embed"), head_decode_s=costs.head_decode_s * factor("head"),
                   step_decode_s=costs.step_decode_s * factor(STEP), compute_corrections=corrections)


def _node_costs(tables: CostTables, target: Target, i: int, book: ProfileBook, now_ns: int) -> NodeCosts:
    model, work, node = tables.model, tables.workload, tables.nodes[i]
    rows, prompt, past = work.decode_rows, work.prefill_tokens, target.decode_context
    per_seq_kv = work.context_tokens * work.concurrency
    decode, prefill = tables.decode_layer_s[i].copy(), tables.prefill_layer_s[i].copy()
    layer_bytes, kv = work.layer_weight_bytes.copy(), work.layer_kv_bytes.copy()
    embed_d, head_d, copy_d = _edge_terms(tables, i, rows, prefill=False)
    embed_p, head_p, copy_p = _edge_terms(tables, i, prompt, prefill=True)
    embed_bytes, head_bytes = model.embedding_bytes, model.head_bytes
    sources = dict.fromkeys((*schema.LAYER_KINDS, STEP), DECLARED)
    step_d = 0.0
    problem = book.stage_problem(host_of(node), model.model_snapshot, str(node.backend), now_ns,
                                 model.weights_policy, node.activations)
    record = None if problem is not None else book.stage_record(host_of(node), node.activations)
    if record is not None:
        moe_curve = moe_row_curve(model)
        for layer in model.layers:
            kind = record.profile.kind("moe" if layer.is_moe else "dense")
            if kind is None:
                continue
            curve = moe_curve if layer.is_moe else interpolate
            decode[layer.index] = interpolate_grid(record.profile.decode_grid(kind), rows, past, curve)
            prefill[layer.index] = interpolate(kind.prefill_s_per_token, prompt) * prompt
            layer_bytes[layer.index] = kind.resident_bytes
            kv[layer.index] = kind.kv_bytes_per_token * per_seq_kv
            sources[kind.kind] = record.record_id
        embed, head = record.profile.kind("embed"), record.profile.kind("head")
        if embed is not None:
            embed_d = interpolate(embed.decode_s_per_microbatch, rows)
            embed_p = interpolate(embed.prefill_s_per_token, prompt) * prompt
            embed_bytes, sources["embed"] = embed.resident_bytes, record.record_id
        if head is not None:
            head_d = interpolate(head.decode_s_per_microbatch, rows)
            head_p = interpolate(head.decode_s_per_microbatch, 1)
            head_bytes, sources["head"] = head.resident_bytes, record.record_id
        copy_d = copy_p = 0.0  # inside the measured FNX2 frame time of the links, or the step term
        if record.profile.step_grid():
            # An overhead measured below zero (whole steps faster than their parts timed alone) is
            # inside the host's noise: the prediction takes 0, the record keeps what was measured.
            step_d = max(0.0, interpolate_grid(record.profile.step_grid(), rows, past))
            sources[STEP] = record.record_id
    reserve = choose_reserve(node, host_of(node), book, model.model_snapshot, model.weights_policy, now_ns)
    costs = NodeCosts(decode, prefill, layer_bytes, kv, embed_d, head_d, embed_p, head_p, copy_d, copy_p, step_d,
                      embed_bytes, head_bytes, sources, problem, reserve=reserve)
    if record is None:
        return costs
    return _scaled(costs, model, route_corrections(book, model, host_of(node), record.record_id))


def _link_tables(tables: CostTables, book: ProfileBook, now_ns: int):
    n = len(tables.nodes)
    decode, prefill = tables.link_decode_s.copy(), tables.link_prefill_s.copy()
    frame = tables.workload.boundary_row_bytes
    sources: dict[tuple[int, int], str] = {}
    corrections: dict[tuple[int, int], Correction] = {}
    for i, a in enumerate(tables.nodes):
        for j, b in enumerate(tables.nodes):
            if i == j:
                continue
            sources[(i, j)] = DECLARED
            if book.link_problem(host_of(a), host_of(b), now_ns) is not None:
                continue
            link = book.link_record(host_of(a), host_of(b))
            assert link is not None
            decode[i, j] = link.profile.seconds_for(frame * tables.workload.decode_rows)
            prefill[i, j] = link.profile.seconds_for(frame * tables.workload.prefill_tokens)
            sources[(i, j)] = link.record_id
            found = wire_correction(book, tables.model.model_snapshot, host_of(a), host_of(b), link.record_id)
            if found is not None:
                decode[i, j] *= found.factor
                corrections[(i, j)] = found
    assert decode.shape == (n, n)
    return decode, prefill, sources, corrections


def build_measured(model: ModelDescription, inventory: Inventory, nodes: tuple[Node, ...], target: Target,
                   book: ProfileBook, now_ns: int) -> MeasuredTables:
    declared = build_tables(model, inventory, nodes, target)
    work = build_workload(model, target)
    link_decode, link_prefill, link_sources, link_corrections = _link_tables(declared, book, now_ns)
    costs = tuple(_node_costs(declared, target, i, book, now_ns) for i in range(len(nodes)))
    usable = np.array([n.memory_bytes - c.reserve_bytes for n, c in zip(nodes, costs, strict=True)], dtype=np.int64)
    return MeasuredTables(
        model=model, target=target, nodes=nodes, costs=costs,
        usable_bytes=usable, activation_bytes=work.activation_bytes, logits_bytes=work.logits_bytes,
        boundary_row_bytes=work.boundary_row_bytes, link_decode_s=link_decode, link_prefill_s=link_prefill,
        link_sources=link_sources, link_corrections=link_corrections)


def stage_memory(t: MeasuredTables, i: int, a: int, b: int) -> tuple[int, int, int]:
    """(weight, kv, activation) bytes of layers [a, b) on node i."""
    c, last = t.costs[i], b == t.num_layers
    weights = int(c.layer_bytes[a:b].sum()) + (c.embed_bytes if a == 0 else 0) + (c.head_bytes if last else 0)
    return weights, int(c.layer_kv_bytes[a:b].sum()), t.activation_bytes + (t.logits_bytes if last else 0)


def service_matrix(t: MeasuredTables) -> np.ndarray:
    """(n, L+1, L+1): decode service seconds of stage [a, b) on node i; inf if a >= b or it doesn't fit."""
    n, L = len(t.nodes), t.num_layers
    a = np.arange(L + 1)[:, None]
    b = np.arange(L + 1)[None, :]
    out = np.full((n, L + 1, L + 1), np.inf)
    for i, c in enumerate(t.costs):
        held = np.concatenate([[0], np.cumsum(c.layer_bytes + c.layer_kv_bytes)])
        memory = (held[b] - held[a]) + t.activation_bytes + np.where(a == 0, c.embed_bytes, 0)
        memory = memory + np.where(b == L, c.head_bytes + t.logits_bytes, 0)
        prefix = np.concatenate([[0.0], np.cumsum(c.decode_layer_s)])
        service = (prefix[b] - prefix[a] + np.where(a == 0, c.embed_decode_s, c.copy_decode_s)
                   + np.where(b == L, c.head_decode_s, c.copy_decode_s) + c.step_decode_s)
        out[i] = np.where((b > a) & (memory <= t.usable_bytes[i]), service, np.inf)
    return out


def stage_costs(t: MeasuredTables, i: int, a: int, b: int, nxt: int | None) -> tuple[d.StageCost, d.StageCost]:
    """(decode, prefill) predicted terms of layers [a, b) on node i, sending to node `nxt`."""
    c, first, last = t.costs[i], a == 0, b == t.num_layers
    out = []
    for prefill in (False, True):
        layers = c.prefill_layer_s if prefill else c.decode_layer_s
        compute = float(layers[a:b].sum())
        compute += (c.embed_prefill_s if prefill else c.embed_decode_s) if first else 0.0
        compute += (c.head_prefill_s if prefill else c.head_decode_s) if last else 0.0
        compute += 0.0 if prefill else c.step_decode_s
        copy = c.copy_prefill_s if prefill else c.copy_decode_s
        links = t.link_prefill_s if prefill else t.link_decode_s
        wire = 0.0 if nxt is None else float(links[i, nxt])
        out.append(d.StageCost(compute, 0.0 if last else copy, wire, 0.0 if first else copy))
    return out[0], out[1]


def _kinds_used(t: MeasuredTables, a: int, b: int) -> list[str]:
    """The layer kinds a stage of layers [a, b) runs, in stage order (`stage_kinds` less the step)."""
    ran = stage_kinds(t.model, a, b)
    return [k for k in ("embed", "dense", "moe", "head") if k in ran]


def _term(name: str, value: float, unit: str, sources: list[tuple[str, str]], physical_note: str,
          declared_note: str) -> d.TermEvidence:
    """`sources`: (what, record id or DECLARED) behind the term; any declared part makes it declared."""
    gaps = [what for what, rid in sources if rid == DECLARED]
    ids = tuple(dict.fromkeys(rid for _, rid in sources if rid != DECLARED))
    if gaps:
        return d.TermEvidence(name, d.TERM_DECLARED, ids, f"{declared_note}; declared for {', '.join(gaps)} "
                              "(declared, exploratory)", value, unit)
    return d.TermEvidence(name, d.TERM_PHYSICAL, ids, f"prediction computed from physical measurements: "
                          f"{physical_note}", value, unit)


def _calibrated(term: d.TermEvidence, scaled: dict[str, Correction]) -> d.TermEvidence:
    """A term scaled by route calibrations (kind -> calibration) names each (record id, measured,
    predicted, factor) and the kinds it scaled."""
    if not scaled:
        return term
    kinds_by_record: dict[str, list[str]] = {}
    for kind, correction in scaled.items():
        kinds_by_record.setdefault(correction.record_id, []).append(kind)
    by_record = {c.record_id: c for c in scaled.values()}
    notes = [f"{by_record[rid].describe()} to {', '.join(kinds)}" for rid, kinds in kinds_by_record.items()]
    return replace(term, record_ids=tuple(dict.fromkeys((*term.record_ids, *by_record))),
                   calibration_id=", ".join(by_record), note=f"{term.note}; scaled by {'; '.join(notes)}")


def _past_basis(target: Target) -> str:
    if target.decode_context_tokens:
        return "the target's decode context"
    return "the target's configured context"


def stage_terms(t: MeasuredTables, i: int, a: int, b: int, nxt: int | None, prev: int | None,
                decode: d.StageCost, memory_bytes: int) -> tuple[d.TermEvidence, ...]:
    c = t.costs[i]
    host = host_of(t.nodes[i])
    kinds = _kinds_used(t, a, b)
    kind_sources = [(f"{host} {k}", c.sources[k]) for k in kinds]
    rows, prompt, past = t.target.microbatch_rows, max(t.target.prefill_tokens, 1), t.target.decode_context
    at = f"{rows} row(s) at {past} tokens of past per row ({_past_basis(t.target)})"
    mode = f" timed in {t.nodes[i].activations} activations" if t.nodes[i].activations else ""
    compute = _term("compute", decode.compute_s - c.step_decode_s, "s", kind_sources,
                    f"per-layer decode seconds of kinds {kinds} on {host}{mode} interpolated to {at}",
                    f"roofline of declared FLOP/s and bandwidth (prefill at {prompt} tokens likewise)")
    step = _term(STEP, c.step_decode_s, "s", [(f"{host} step overhead", c.sources[STEP])],
                 f"measured per-microbatch step overhead of a served decode step on {host} (executor, KV, "
                 f"unpack/pack) interpolated to {at}; the plan's decode compute includes it",
                 "no measured step overhead: 0 s")
    scaled = c.compute_corrections
    out = [_calibrated(compute, {k: scaled[k] for k in kinds if k in scaled}),
           _calibrated(step, {STEP: scaled[STEP]} if STEP in scaled else {})]
    for name, value, other in (("pack", decode.pack_s, nxt), ("unpack", decode.unpack_s, prev)):
        if other is None:
            out.append(d.TermEvidence(name, d.TERM_PHYSICAL if c.sources["dense"] != DECLARED else d.TERM_DECLARED,
                                      (), "none: this end of the route has no boundary frame", 0.0, "s"))
            continue
        pair = (i, other) if name == "pack" else (other, i)
        link_id = t.link_sources.get(pair, DECLARED)
        out.append(_term(name, value, "s", [(f"{host} frame copy", link_id)],
                         f"inside the measured FNX2 frame time of link record {link_id}",
                         "one copy of the boundary frame at declared memory bandwidth"))
    if nxt is None:
        out.append(d.TermEvidence("wire", d.TERM_PHYSICAL if c.sources["dense"] != DECLARED else d.TERM_DECLARED,
                                  (), "none: the last stage sends no boundary frame", 0.0, "s"))
    else:
        other_host = host_of(t.nodes[nxt])
        wire = _term("wire", decode.wire_s, "s", [(f"link {host}->{other_host}", t.link_sources[(i, nxt)])],
                     f"half the measured 32 KiB round trip plus {t.boundary_row_bytes * rows} bytes over the "
                     f"measured throughput, {host}->{other_host}",
                     "declared link bandwidth and latency")
        link = t.link_corrections.get((i, nxt))
        out.append(_calibrated(wire, {"wire": link} if link is not None else {}))
    out.append(_term("memory", float(memory_bytes), "bytes", kind_sources,
                     f"resident bytes and KV bytes per token of kinds {kinds} on {host} at "
                     f"{t.target.context_tokens} tokens x {t.target.concurrency} sequences, plus activation buffers "
                     "from the checkpoint config",
                     "exact bookkeeping from the checkpoint config"))
    out.append(reserve_term(c.reserve))
    return tuple(out)


def reserve_term(reserve: ReserveChoice | None) -> d.TermEvidence:
    """The runtime's own resident memory inside the stage's memory: physical where measured."""
    if reserve is None:
        return d.TermEvidence("reserve", d.TERM_DECLARED, (), "no reserve", 0.0, "bytes")
    if reserve.measured:
        return d.TermEvidence("reserve", d.TERM_PHYSICAL, (reserve.record_id,), reserve.detail,
                              float(reserve.reserve_bytes), "bytes")
    return d.TermEvidence("reserve", d.TERM_DECLARED, (), f"{reserve.detail} (declared, exploratory)",
                          float(reserve.reserve_bytes), "bytes")


def route_stages(t: MeasuredTables, placement_nodes: tuple[int, ...], cuts: tuple[int, ...]) -> list[schema.RouteStage]:
    return [schema.RouteStage(host_of(t.nodes[v]), str(t.nodes[v].backend), cuts[k], cuts[k + 1])
            for k, v in enumerate(placement_nodes)]


def deployment_problems(t: MeasuredTables, book: ProfileBook, placement_nodes: tuple[int, ...],
                        cuts: tuple[int, ...], route_key: str, now_ns: int) -> list[Problem]:
    """Everything deployment needs that this placement lacks: a usable profile for every host,
    every layer kind it runs, every link it uses, and a passing calibration of the route."""
    out: list[Problem] = []
    for k, v in enumerate(placement_nodes):
        c, host = t.costs[v], host_of(t.nodes[v])
        if c.problem is not None:
            out.append(c.problem)
            continue
        record = book.stage_record(host, t.nodes[v].activations)
        for kind in _kinds_used(t, cuts[k], cuts[k + 1]):
            if c.sources[kind] == DECLARED:
                out.append(Problem(d.MISSING_PROFILE, f"host {host} kind {kind}", record.record_id if record else "",
                                   f"the stage profile of {host} does not measure layer kind {kind!r}"))
        if c.sources[STEP] == DECLARED:
            out.append(Problem(d.MISSING_PROFILE, f"host {host} step overhead", record.record_id if record else "",
                               f"the stage profile of {host} predates the per-microbatch step overhead "
                               "(run `fornax profile` again)"))
        if c.reserve is not None and not c.reserve.measured:
            out.append(Problem(d.MISSING_PROFILE, f"host {host} runtime reserve", record.record_id if record else "",
                               f"the stage profile of {host} predates the measured runtime reserve "
                               "(run `fornax profile` again)"))
    for u, v in zip(placement_nodes, placement_nodes[1:], strict=False):
        problem = book.link_problem(host_of(t.nodes[u]), host_of(t.nodes[v]), now_ns)
        if problem is not None:
            out.append(problem)
    used = [rid for v in placement_nodes for rid in t.costs[v].sources.values() if rid != DECLARED]
    used += [t.link_sources[(u, v)] for u, v in zip(placement_nodes, placement_nodes[1:], strict=False)]
    problem = book.calibration_problem(route_key, now_ns, tuple(rid for rid in dict.fromkeys(used) if rid))
    return out + ([problem] if problem is not None else [])
