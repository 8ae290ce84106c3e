"""Which CPUs each host of a one-box fleet runs on, as plain values. Pure.

A host declares CPU cores (fractions allowed); its cgroup gets a cpuset and a CFS quota. Two
hosts whose cpusets overlap slow each other down in a way no profile of one host alone shows:
a parallel kernel waits for its thread on the shared CPU while the other host runs there. So:

1. When every host can have ceil(cores) CPUs of its own, each gets a disjoint contiguous block.
2. Otherwise each host gets floor(cores) whole CPUs of its own, and the fractional parts are
   packed onto the CPUs left over (first fit, largest fraction first, at most one core per CPU).
   A host that has whole CPUs drops a fraction that would land on a CPU another host uses: it
   runs on its own CPUs only, and its usable cores (the quota written) fall to that count. A
   host with a fraction only must run somewhere; when no free CPU is left it shares one.
3. When even the whole CPUs do not fit, CPUs are handed out round robin and shared.

Every host's share states what it shares and with whom (`shared_with`), and what it gave up
(`usable_cores` below `declared_cores`), so a plan or profile can say so instead of hiding it.
Math thread pools are sized to `threads`: ceil(usable cores), never more than the cpuset, as
the stage worker pins itself (so a 1.5-core host on two CPUs of its own still runs two threads
under a 1.5-core quota: CFS throttling, not another host, is then what it waits on).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CAPACITY_CORES = 1.0
EPSILON = 1e-9


@dataclass(frozen=True)
class CpuShare:
    host: str
    declared_cores: float
    usable_cores: float  # what the quota is written as: never more than the cpuset holds
    cpuset: tuple[int, ...]
    shared_cpus: tuple[int, ...]  # CPUs of the cpuset that another host's cpuset also holds
    shared_with: tuple[str, ...]  # those hosts

    @property
    def threads(self) -> int:
        """What the stage worker's pool runs (it pins itself to ceil(quota) CPUs of its cpuset,
        `libs.service.affinity.quota_cpus`), and what BLAS/OpenMP pools are sized to."""
        return max(1, min(len(self.cpuset), math.ceil(self.usable_cores - EPSILON)))

    def describe(self) -> str:
        cpus = ",".join(str(c) for c in self.cpuset)
        line = f"{self.host}: cpuset {cpus}, quota {self.usable_cores:g} cores, {self.threads} math thread(s)"
        if self.usable_cores + EPSILON < self.declared_cores:
            line += (f"; declared {self.declared_cores:g} cores, but the rest would share a CPU with another "
                     f"host, so it runs on the {len(self.cpuset)} CPU(s) it holds alone")
        if self.shared_cpus:
            line += (f"; SHARES CPU {','.join(str(c) for c in self.shared_cpus)} with "
                     f"{', '.join(self.shared_with)} (the box has too few CPUs for the declared quotas)")
        return line


def assign_cpus(hosts: Sequence[tuple[str, float]], cpus: Sequence[int]) -> list[CpuShare]:
    """(name, declared cores) per host, in fleet order -> one share per host, same order."""
    if not cpus:
        raise ValueError("no CPUs to assign")
    cpus = tuple(sorted(cpus))
    if sum(max(1, math.ceil(c - EPSILON)) for _, c in hosts) <= len(cpus):
        sets = _disjoint_blocks([max(1, math.ceil(c - EPSILON)) for _, c in hosts], cpus)
        return _shares(hosts, sets, [min(c, len(s)) for (_, c), s in zip(hosts, sets, strict=True)])
    whole = [math.floor(c + EPSILON) for _, c in hosts]
    if sum(whole) <= len(cpus):
        return _whole_then_fractions(hosts, whole, cpus)
    sets, start = [], 0
    for _, cores in hosts:
        count = min(len(cpus), max(1, math.ceil(cores - EPSILON)))
        sets.append(tuple(sorted({cpus[(start + k) % len(cpus)] for k in range(count)})))
        start += count
    return _shares(hosts, sets, [min(c, len(s)) for (_, c), s in zip(hosts, sets, strict=True)])


def _disjoint_blocks(sizes: list[int], cpus: tuple[int, ...]) -> list[tuple[int, ...]]:
    out, start = [], 0
    for size in sizes:
        out.append(cpus[start:start + size])
        start += size
    return out


def _whole_then_fractions(hosts: Sequence[tuple[str, float]], whole: list[int],
                          cpus: tuple[int, ...]) -> list[CpuShare]:
    sets = [list(block) for block in _disjoint_blocks(whole, cpus)]
    free = list(cpus[sum(whole):])
    load = dict.fromkeys(free, 0.0)
    users: dict[int, list[int]] = {c: [] for c in free}
    fractions = sorted(((c - w, i) for i, ((_, c), w) in enumerate(zip(hosts, whole, strict=True)) if c - w > EPSILON),
                       key=lambda x: (whole[x[1]] > 0, -x[0], x[1]))  # fraction-only hosts first
    usable = [float(w) for w in whole]
    for fraction, i in fractions:
        fits = [c for c in free if load[c] + fraction <= CAPACITY_CORES + EPSILON]
        alone = [c for c in fits if not users[c]]
        if whole[i] > 0:
            if alone:  # a whole-CPU host takes a fraction only on a CPU nobody else uses
                _place(sets, load, users, alone[0], i, fraction, usable)
            continue
        target = (fits or free or [min(cpus, key=lambda c: (sum(1 for s in sets if c in s), c))])[0]
        _place(sets, load, users, target, i, fraction, usable)
    return _shares(hosts, [tuple(sorted(s)) for s in sets], usable)


def _place(sets: list[list[int]], load: dict[int, float], users: dict[int, list[int]], cpu: int, i: int,
           fraction: float, usable: list[float]) -> None:
    sets[i].append(cpu)
    load[cpu] = load.get(cpu, 0.0) + fraction
    users.setdefault(cpu, []).append(i)
    usable[i] += fraction


def _shares(hosts: Sequence[tuple[str, float]], sets: list[tuple[int, ...]], usable: list[float]) -> list[CpuShare]:
    out = []
    for i, ((name, cores), cpuset) in enumerate(zip(hosts, sets, strict=True)):
        others = [(j, set(s) & set(cpuset)) for j, s in enumerate(sets) if j != i and set(s) & set(cpuset)]
        shared = tuple(sorted(set().union(*(c for _, c in others)))) if others else ()
        out.append(CpuShare(name, cores, round(min(usable[i], len(cpuset)), 6), cpuset, shared,
                            tuple(hosts[j][0] for j, _ in others)))
    return out
