"""Which hosts of a netns fleet get a numpy reference stage worker, so the fleet serves at once.

A MAX host whose graphs are not compiled yet serves nothing until they are. With a reference
worker (the float32-math numpy backend) started inside the same host (its network namespace,
cgroup CPU quota and memory limit), the orchestrator serves on the reference route at once,
compiles, then moves the route to the MAX workers (`services.orchestrator.route.coldstart`).
A numpy host's own worker is its stage's reference: it holds the reference route's generation
and the MAX route's beside it for the moment of the switch.

Memory is never overcommitted. During the switch a MAX host holds its reference worker and its
MAX worker; where a MAX host's memory limit cannot hold both, no reference route is started at
all (a route needs every stage), and every MAX host serves once its graphs compiled, as with
`--no-serve-while-compiling`. A numpy host holds two generations of its stage for the switch,
and its worker refuses the second where they do not fit its limit. Pure: figures in, the
decision and its explanation out.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.common.kinds import Backend

GIB = 2**30
# Prediction (not measured on the host it describes): wall seconds of one cold MAX graph compile
# per core of quota. About a minute per graph kind on `tiny` at one core of a 2-core AMD EPYC;
# `small`'s took 31-305 s each on one core of that box under load, DeepSeek-V2-Lite's shapes
# 35-362 s (README): larger models and busier hosts wait longer than this says.
COLD_COMPILE_S_PER_GRAPH_CORE = 60.0


@dataclass(frozen=True)
class HostStageMemory:
    """One stage host's figures: what its stage holds, what a reference stage of the same layers
    would hold, and what is left to compile (contract and declared figures of the planner)."""

    host: str
    backend: Backend
    limit_bytes: int  # the host's cgroup memory limit (contract)
    stage_bytes: int  # the host's own stage: weights as stored for its backend, KV, activations, reserve
    reference_bytes: int  # a numpy stage of the same layers (numpy-stored weights, decode scratch, ...)
    uncompiled_graphs: int  # MAX graph kinds of the stage missing from the compile cache
    cpu_cores: float
    # What else the host holds meanwhile: on the control host, the control services and the
    # background compiles, which run in the orchestrator's host.
    other_bytes: int = 0

    @property
    def switch_bytes(self) -> int:
        """What the host holds while the route moves: a reference stage beside its own stage (a
        numpy host: two generations of its stage, each as large as a reference stage)."""
        return self.reference_bytes + self.stage_bytes + self.other_bytes

    @property
    def fits(self) -> bool:
        return self.switch_bytes <= self.limit_bytes

    @property
    def compile_wait_s(self) -> float:
        """Prediction: its MAX graphs one after another on its own quota."""
        return self.uncompiled_graphs * COLD_COMPILE_S_PER_GRAPH_CORE / max(min(self.cpu_cores, 1.0), 0.05)


@dataclass(frozen=True)
class ReferenceDecision:
    reference_hosts: frozenset[str]  # MAX hosts that start a reference worker; empty: none
    lines: tuple[str, ...]  # what `fornax up` prints, one line per host that explains something

    @property
    def serves_at_once(self) -> bool:
        return bool(self.reference_hosts)


NO_REFERENCE = ReferenceDecision(frozenset(), ())


def decide_references(hosts: tuple[HostStageMemory, ...]) -> ReferenceDecision:
    """Reference workers on every MAX host when each of them can hold both workers; else none,
    and each MAX host's line says why it serves only after compiling and the expected wait.

    A numpy host does not decide: its worker refuses a second generation that does not fit its
    limit (INSUFFICIENT_MEMORY_FOR_OVERLAP), so the switch fails and the route stays on numpy,
    saying so, rather than overcommit; its line says when that may happen."""
    max_hosts = [h for h in hosts if h.backend is not Backend.NUMPY]
    if not max_hosts:
        return NO_REFERENCE
    short = [h for h in max_hosts if not h.fits]
    if short:
        blocker = ", ".join(h.host for h in short)
        return ReferenceDecision(frozenset(), tuple(_wait_line(h, blocker) for h in max_hosts))
    lines = tuple(f"{h.host}: serves at once on a numpy reference worker inside the host while "
                  f"{_meanwhile(h)}; then the route moves to MAX per --max-switch ({_fit_figures(h)})"
                  for h in max_hosts)
    lines += tuple(f"{h.host}: may not hold its stage twice for the switch ({_fit_figures(h)}, at the widest "
                   "range it could be given); its worker then refuses the second generation and the route "
                   "stays on numpy (switch_failed)" for h in hosts if h.backend is Backend.NUMPY and not h.fits)
    return ReferenceDecision(frozenset(h.host for h in max_hosts), lines)


def _meanwhile(host: HostStageMemory) -> str:
    if host.uncompiled_graphs:
        return f"its {host.uncompiled_graphs} uncompiled MAX graph(s) compile"
    return "its MAX graphs load from the compile cache"


def _wait_line(host: HostStageMemory, blocker: str) -> str:
    if host.fits:
        why = f"the route needs every stage and {blocker} cannot hold the switch"
    else:
        why = (f"no numpy reference worker: its memory limit cannot hold a reference stage beside its MAX stage "
               f"({_fit_figures(host)})")
    wait = (f"about {host.compile_wait_s / 60:.0f} min for {host.uncompiled_graphs} uncompiled MAX graph(s) "
            f"at {host.cpu_cores:g} cores (prediction, {COLD_COMPILE_S_PER_GRAPH_CORE:.0f} s per graph per core)"
            if host.uncompiled_graphs else "no graph to compile: it serves once its stage loads")
    return f"{host.host}: serves only after compiling, {why}; expected wait {wait}"


def _fit_figures(host: HostStageMemory) -> str:
    reference = "a second generation" if host.backend is Backend.NUMPY else "numpy reference"
    other = (f" + control services and background compiles {host.other_bytes / GIB:.2f} GiB"
             if host.other_bytes else "")
    return (f"{reference} {host.reference_bytes / GIB:.2f} GiB + {host.backend.value} stage "
            f"{host.stage_bytes / GIB:.2f} GiB{other} = {host.switch_bytes / GIB:.2f} GiB of its "
            f"{host.limit_bytes / GIB:.2f} GiB limit")
