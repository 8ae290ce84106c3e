"""Stage workers found through each pool's headless Service, and the re-plan when they change.

In Kubernetes each stage-worker pool is a StatefulSet behind a headless Service
(`helm/fornax/templates/stage-worker.yaml`): the Service's name resolves to one A/AAAA record
per pod, and each pod's address resolves back (PTR) to its stable name
`<pod>.<service>.<namespace>.svc.<zone>`. A worker is named by that stable name, as
FORNAX_STAGE_WORKERS names it (`<pod>.<service>:<port>`), so a pod that restarts with a new IP
is the same worker; an address with no name back is named by the address itself.

The pure part names, orders and groups workers; `PoolWatcher` is the thin loop that resolves
every pool on an interval, feeds `replan_policy.ReplanPolicy` and calls the re-plan hook when
it fires. The resolver is injected: tests pass a fake one, the service `DnsResolver`
(`asyncio` getaddrinfo/getnameinfo, the system resolver with its search domains).
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from services.orchestrator.route.replan_policy import Decision, ReplanPolicy, WorkerSet

_log = structlog.get_logger()
_ORDINAL = re.compile(r"-(\d+)$")


@dataclass(frozen=True)
class StagePool:
    """A pool's headless Service (as the orchestrator's resolver finds it) and its gRPC port."""

    service: str
    port: int

    @classmethod
    def parse(cls, raw: str) -> StagePool:
        """`<service>:<port>`, e.g. `fx-fornax-stage-worker-gpu:50051`."""
        service, _, port = raw.rpartition(":")
        if not service or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(raw)
        return cls(service, int(port))

    def format(self) -> str:
        return f"{self.service}:{self.port}"


class DiscoveryFailed(Exception):
    """The resolver could not answer (not: the answer was no workers); the round is skipped."""


class Resolver(Protocol):
    async def addresses(self, host: str) -> frozenset[str]:
        """The host's A/AAAA addresses; empty when the name has none. DiscoveryFailed otherwise."""
        ...

    async def name_of(self, address: str) -> str | None:
        """The address's name (PTR), or None when it has none."""
        ...


def worker_name(pool: StagePool, address: str, reverse_name: str | None) -> str:
    """`<pod>.<service>:<port>` when the address names a pod of this pool's Service, else the
    address itself (`[v6]:<port>` for IPv6)."""
    service = pool.service.split(".", 1)[0]
    if reverse_name:
        labels = reverse_name.rstrip(".").split(".")
        if len(labels) >= 2 and labels[1] == service:
            return f"{labels[0]}.{service}:{pool.port}"
    host = f"[{address}]" if ":" in address else address
    return f"{host}:{pool.port}"


def _ordinal_key(worker: str) -> tuple[int, int, str]:
    pod = worker.split(".", 1)[0]
    found = _ORDINAL.search(pod)
    return (0, int(found.group(1)), worker) if found else (1, 0, worker)


def stage_order(workers: WorkerSet) -> tuple[str, ...]:
    """Every worker in stage order: pools in their order, each pool's pods by ordinal (a
    StatefulSet scales its highest ordinals in and out), addresses without a name last."""
    return tuple(w for pool in workers for w in sorted(pool, key=_ordinal_key))


def planned_set(pools: Sequence[StagePool], stage_workers: Sequence[str]) -> WorkerSet:
    """The configured FORNAX_STAGE_WORKERS grouped by pool: a worker `<pod>.<service>:<port>`
    belongs to the pool of that service; one no pool names belongs to none (an external worker)."""
    grouped: list[set[str]] = [set() for _ in pools]
    for worker in stage_workers:
        host = worker.rpartition(":")[0]
        service = host.split(".")[1] if host.count(".") >= 1 else ""
        for index, pool in enumerate(pools):
            if service == pool.service.split(".", 1)[0]:
                grouped[index].add(worker)
    return tuple(frozenset(group) for group in grouped)


def external_workers(pools: Sequence[StagePool], stage_workers: Sequence[str]) -> tuple[str, ...]:
    """The configured workers no pool holds (outside Kubernetes), in their order: they follow
    the pools' workers in every re-plan, as they follow them in FORNAX_STAGE_WORKERS."""
    pooled = {worker for pool in planned_set(pools, stage_workers) for worker in pool}
    return tuple(worker for worker in stage_workers if worker not in pooled)


async def discover(pools: Sequence[StagePool], resolver: Resolver) -> WorkerSet:
    """Each pool's workers now. DiscoveryFailed when any pool could not be resolved."""
    found: list[frozenset[str]] = []
    for pool in pools:
        addresses = sorted(await resolver.addresses(pool.service))
        names = await asyncio.gather(*(resolver.name_of(address) for address in addresses))
        found.append(frozenset(worker_name(pool, a, n) for a, n in zip(addresses, names, strict=True)))
    return tuple(found)


class DnsResolver:
    """The system resolver: A/AAAA by getaddrinfo, PTR by getnameinfo."""

    async def addresses(self, host: str) -> frozenset[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return frozenset()  # a headless Service with no endpoints has no records
            raise DiscoveryFailed(f"{host}: {exc}") from exc
        return frozenset(str(info[4][0]) for info in infos)

    async def name_of(self, address: str) -> str | None:
        loop = asyncio.get_running_loop()
        try:
            host, _ = await loop.getnameinfo((address, 0), socket.NI_NAMEREQD)
        except (socket.gaierror, OSError):
            return None
        return host


ReplanHook = Callable[[tuple[str, ...]], Awaitable[None]]


class PoolWatcher:
    """Resolves the pools every `interval_s`, asks the policy, calls `replan` with every worker
    in stage order (the pools', then the `external` ones) when it fires."""

    def __init__(self, pools: Sequence[StagePool], resolver: Resolver, policy: ReplanPolicy,
                 replan: ReplanHook, interval_s: float, external: Sequence[str] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._pools = tuple(pools)
        self._external = tuple(external)
        self._resolver = resolver
        self._policy = policy
        self._replan = replan
        self._interval_s = interval_s
        self._clock = clock

    async def observe_once(self) -> Decision | None:
        """One round: None when discovery failed (the round does not count as an observation)."""
        try:
            workers = await discover(self._pools, self._resolver)
        except DiscoveryFailed as exc:
            _log.warning("pool_discovery_failed", error=str(exc))
            return None
        decision = self._policy.observe(self._clock(), workers)
        if decision.replan:
            await self._call_replan(stage_order(workers) + self._external)
        return decision

    async def _call_replan(self, workers: tuple[str, ...]) -> None:
        _log.info("replan_on_change", workers=",".join(workers))
        try:
            await self._replan(workers)
        except Exception as exc:  # noqa: BLE001  (the serving route is kept; tried again later)
            self._policy.replan_failed()
            _log.warning("replan_on_change_failed", error=f"{type(exc).__name__}: {exc}"[:300])

    async def run(self) -> None:
        while True:
            await self.observe_once()
            await asyncio.sleep(self._interval_s)
