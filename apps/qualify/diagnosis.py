"""What to do when the gate fails: the term that missed most, and the likely cause. Pure.

From a calibration's term-by-term figures (predicted: the plan's cost model; measured: this
route, physical) it names the stage and term with the largest miss in seconds, the ratio of
measured to predicted, and what the facts of the hosts suggest. Causes are stated as likely,
never as proven: a shared CPU (two stage hosts' cpusets overlap), a compute term far above the
layer profile (the profile times the layers and the served step with the worker's data plane idle;
in the route the stage shares its CPU with its data plane and, on MAX, MAX's worker thread), or a wire term far
above the link profile (the gate's wire is the next hop's round trip less its own work, so a
next stage waiting for CPU shows here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libs.profiles.schema import Calibration, HostFacts
from libs.service.affinity import parse_cpu_set

RATIO_WORTH_NAMING = 1.5


@dataclass(frozen=True)
class Miss:
    stage_index: int
    host: str
    term: str
    predicted_s: float  # prediction
    measured_s: float  # physical, median over runs

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else float("inf")


def shared_cpus(hosts: Sequence[HostFacts]) -> dict[str, tuple[str, ...]]:
    """Host -> the other stage hosts whose cpuset overlaps its own (unreadable cpusets: none)."""
    def cpus(f: HostFacts) -> set[int]:
        try:
            return set(parse_cpu_set(f.cpuset)) if f.cpuset else set()
        except ValueError:
            return set()
    sets = {f.host: cpus(f) for f in hosts}
    return {h: tuple(o for o, s in sets.items() if o != h and s & mine) for h, mine in sets.items()}


def worst_miss(c: Calibration) -> Miss | None:
    misses = [Miss(s.stage_index, s.host, term, s.predicted_terms.get(term, 0.0), figure.median)
              for s in c.stages for term, figure in s.measured_terms.items()]
    return max(misses, key=lambda m: abs(m.measured_s - m.predicted_s), default=None)


def likely_cause(miss: Miss, shared: dict[str, tuple[str, ...]]) -> str:
    if shared.get(miss.host):
        return (f"host {miss.host} shares a CPU with {', '.join(shared[miss.host])} (overlapping cpusets): a "
                "profile timed while the other host was idle never saw it")
    if miss.term == "compute" and miss.ratio >= RATIO_WORTH_NAMING:
        return ("the profile times this stage's layers and its served step in the worker with its data plane "
                "idle; in the route the stage shares its CPU with its own data plane (FNX2 receive and send, TLS, "
                "relay) and, on a MAX host, MAX's worker thread between graph launches. Profiling the hosts at "
                "once (`fornax profile --all-at-once`) does not remove this; a failed gate feeds nothing back, so "
                "the next plan predicts from the same profiles")
    if miss.term == "wire" and miss.ratio >= RATIO_WORTH_NAMING:
        return ("the gate's wire is the next hop's round trip less its own work: a next stage waiting for CPU "
                "(quota throttling, a shared CPU, hypervisor steal) shows here, not in the link profile")
    return "no single cause stands out; compare the stages' terms above"


def miss_lines(c: Calibration, hosts: Sequence[HostFacts] = ()) -> list[str]:
    """The failed gate's advice: which term missed most, by how much, and the likely cause."""
    miss = worst_miss(c)
    if miss is None:
        return []
    return [f"missed most: stage {miss.stage_index} {miss.host} {miss.term}: measured {miss.measured_s * 1e3:.4g} ms "
            f"(physical) against {miss.predicted_s * 1e3:.4g} ms predicted (prediction), {miss.ratio:.2g}x",
            f"likely cause: {likely_cause(miss, shared_cpus(hosts))}"]
