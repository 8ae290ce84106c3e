"""Pool discovery through headless Services: naming, stage order, and the watcher's re-plans with a
fake resolver and clock."""

from __future__ import annotations

import asyncio
import socket

import pytest

from services.orchestrator.route.pool_discovery import (
    DiscoveryFailed,
    DnsResolver,
    PoolWatcher,
    StagePool,
    external_workers,
    planned_set,
    stage_order,
    worker_name,
)
from services.orchestrator.route.replan_policy import ReplanPolicy, ReplanSettings

GPU, CPU = StagePool("fx-fornax-stage-worker-gpu", 50051), StagePool("fx-fornax-stage-worker-cpu", 50051)
ZONE = "fornax.svc.cluster.local"


def pod(pool: StagePool, index: int) -> str:
    return f"{pool.service}-{index}.{pool.service}:{pool.port}"


class FakeResolver:
    """Each pool's pods as (ip, ordinal); a pod's PTR names it as CoreDNS does."""

    def __init__(self) -> None:
        self.pods: dict[str, list[tuple[str, int]]] = {}
        self.failing = False

    async def addresses(self, host: str) -> frozenset[str]:
        if self.failing:
            raise DiscoveryFailed("SERVFAIL")
        return frozenset(ip for ip, _ in self.pods.get(host, ()))

    async def name_of(self, address: str) -> str | None:
        for service, pods in self.pods.items():
            for ip, index in pods:
                if ip == address:
                    return f"{service}-{index}.{service}.{ZONE}."
        return None


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_stage_pool_parses_service_and_port():
    assert StagePool.parse("fx-fornax-stage-worker-gpu:50051") == GPU
    assert GPU.format() == "fx-fornax-stage-worker-gpu:50051"
    for bad in ("nameonly", ":50051", "svc:0", "svc:http"):
        with pytest.raises(ValueError):
            StagePool.parse(bad)


def test_a_pod_is_named_by_its_stable_name_and_an_unnamed_address_by_itself():
    reverse = f"fx-fornax-stage-worker-gpu-3.fx-fornax-stage-worker-gpu.{ZONE}."
    assert worker_name(GPU, "10.0.0.7", reverse) == pod(GPU, 3)
    assert worker_name(GPU, "10.0.0.7", None) == "10.0.0.7:50051"
    assert worker_name(GPU, "fd00::7", None) == "[fd00::7]:50051"
    # A name under another Service is not this pool's pod name.
    assert worker_name(GPU, "10.0.0.7", f"x-0.other.{ZONE}") == "10.0.0.7:50051"


def test_stage_order_is_pool_order_then_ordinal_not_text_order():
    found = (frozenset({pod(GPU, 10), pod(GPU, 2), "10.0.0.9:50051"}), frozenset({pod(CPU, 0)}))
    assert stage_order(found) == (pod(GPU, 2), pod(GPU, 10), "10.0.0.9:50051", pod(CPU, 0))


def test_the_configured_workers_are_grouped_by_pool_and_external_ones_kept_in_order():
    configured = (pod(GPU, 0), pod(GPU, 1), pod(CPU, 0), "mac-studio.lan:50051")
    assert planned_set((GPU, CPU), configured) == (frozenset({pod(GPU, 0), pod(GPU, 1)}), frozenset({pod(CPU, 0)}))
    assert external_workers((GPU, CPU), configured) == ("mac-studio.lan:50051",)


def _watcher(resolver, clock, calls, fail=False, planned=None):
    async def replan(workers):
        calls.append(workers)
        if fail:
            raise RuntimeError("install refused")

    configured = planned or (pod(GPU, 0), pod(GPU, 1), pod(CPU, 0), "mac-studio.lan:50051")
    policy = ReplanPolicy(ReplanSettings(settle_s=30, min_interval_s=120), planned_set((GPU, CPU), configured))
    return PoolWatcher((GPU, CPU), resolver, policy, replan, interval_s=10,
                       external=external_workers((GPU, CPU), configured), clock=clock), policy


def _rounds(watcher, clock, times):
    async def main():
        verdicts = []
        for t in times:
            clock.now_s = t
            decision = await watcher.observe_once()
            verdicts.append(decision.verdict.value if decision else None)
        return verdicts

    return asyncio.run(main())


def test_a_scaled_up_pool_is_replanned_onto_once_in_stage_order_with_external_workers_last():
    resolver, clock, calls = FakeResolver(), Clock(), []
    resolver.pods = {GPU.service: [("10.0.0.1", 0), ("10.0.0.2", 1)], CPU.service: [("10.0.1.1", 0)]}
    watcher, _ = _watcher(resolver, clock, calls)
    assert _rounds(watcher, clock, [0.0]) == ["steady"]
    resolver.pods[GPU.service].append(("10.0.0.3", 2))
    assert _rounds(watcher, clock, [10.0, 20.0, 40.0, 50.0]) == ["settling", "settling", "replan", "steady"]
    assert calls == [(pod(GPU, 0), pod(GPU, 1), pod(GPU, 2), pod(CPU, 0), "mac-studio.lan:50051")]


def test_a_restarted_pod_with_a_new_address_is_the_same_worker():
    resolver, clock, calls = FakeResolver(), Clock(), []
    resolver.pods = {GPU.service: [("10.0.0.1", 0), ("10.0.0.2", 1)], CPU.service: [("10.0.1.1", 0)]}
    watcher, _ = _watcher(resolver, clock, calls)
    resolver.pods[GPU.service] = [("10.0.0.1", 0)]  # pod 1 is restarting
    verdicts = _rounds(watcher, clock, [0.0, 10.0])
    resolver.pods[GPU.service] = [("10.0.0.1", 0), ("10.0.0.99", 1)]  # back, new IP
    verdicts += _rounds(watcher, clock, [20.0, 500.0])
    assert verdicts == ["settling", "settling", "steady", "steady"] and calls == []


def test_a_failed_lookup_is_no_observation_and_does_not_restart_the_window():
    resolver, clock, calls = FakeResolver(), Clock(), []
    resolver.pods = {GPU.service: [("10.0.0.1", 0), ("10.0.0.2", 1), ("10.0.0.3", 2)],
                     CPU.service: [("10.0.1.1", 0)]}
    watcher, _ = _watcher(resolver, clock, calls)
    assert _rounds(watcher, clock, [0.0]) == ["settling"]
    resolver.failing = True
    assert _rounds(watcher, clock, [10.0, 20.0]) == [None, None]
    resolver.failing = False
    assert _rounds(watcher, clock, [30.0]) == ["replan"] and len(calls) == 1


def test_a_failed_replan_keeps_the_plan_and_is_tried_again_after_the_interval():
    resolver, clock, calls = FakeResolver(), Clock(), []
    resolver.pods = {GPU.service: [("10.0.0.1", 0)], CPU.service: [("10.0.1.1", 0)]}
    watcher, policy = _watcher(resolver, clock, calls, fail=True)
    assert _rounds(watcher, clock, [0.0, 30.0]) == ["settling", "replan"]
    assert policy.planned == planned_set((GPU, CPU), (pod(GPU, 0), pod(GPU, 1), pod(CPU, 0)))
    assert _rounds(watcher, clock, [40.0, 70.0, 150.0]) == ["settling", "held", "replan"]
    assert len(calls) == 2


def test_the_system_resolver_reads_a_name_with_no_records_as_no_workers(monkeypatch):
    async def no_name(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    async def try_again(*args, **kwargs):
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    async def main():
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(loop, "getaddrinfo", no_name)
        empty = await DnsResolver().addresses("fx-fornax-stage-worker-gpu")
        monkeypatch.setattr(loop, "getaddrinfo", try_again)
        with pytest.raises(DiscoveryFailed):
            await DnsResolver().addresses("fx-fornax-stage-worker-gpu")
        return empty

    assert asyncio.run(main()) == frozenset()


def test_the_system_resolver_answers_for_localhost():
    async def main():
        resolver = DnsResolver()
        addresses = await resolver.addresses("localhost")
        return addresses, await resolver.name_of("127.0.0.1")

    addresses, name = asyncio.run(main())
    assert "127.0.0.1" in addresses or "::1" in addresses
    assert name is None or isinstance(name, str)
