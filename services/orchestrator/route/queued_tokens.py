"""`fornax_orchestrator_route_queued_tokens{route}`: the work each installed route still owes.

The gauge an autoscaler drives stage-worker pool replicas from (helm/fornax/README.md, "Scaling
pools"): per route, the tokens admitted and not yet computed (prompt tokens still to prefill
plus output tokens still to decode, `Scheduler.queued_tokens`), the figure the replica routes
are balanced by (`engine/route_choice.py`). A route is named by its stage workers' hosts in
stage order (`alpha>beta`); an in-process route, which has none, by its index.

Read when Prometheus scrapes, never kept: a route that is replaced or retired leaves the
series with it, and the serving loop does no work for the metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.serving import ServingEngine
from services.orchestrator.route.lifecycle import InstalledRoute

NAME = "fornax_orchestrator_route_queued_tokens"
HELP = ("Tokens admitted on the route and not yet computed: prompt tokens still to prefill plus "
        "output tokens still to decode")


def route_label(route: InstalledRoute, index: int) -> str:
    hosts = [stage.worker_address.rpartition(":")[0] or stage.worker_address for stage in route.stages]
    return ">".join(hosts) if hosts else str(index)


def queued_tokens_by_route(installed: InstalledRoute | None) -> tuple[tuple[str, int], ...]:
    """(route label, queued tokens) of each route serving now, route order."""
    if installed is None:
        return ()
    routes = installed.members or (installed,)
    return tuple((route_label(route, index), _queued(route.engine)) for index, route in enumerate(routes))


def _queued(engine: ServingEngine | MultiRouteEngine) -> int:
    engines = engine.engines if isinstance(engine, MultiRouteEngine) else (engine,)
    return sum(e.load(i).queued_tokens for i, e in enumerate(engines))


Source = Callable[[], InstalledRoute | None]


class QueuedTokensCollector(Collector):
    """Reads the installed route at scrape time from its source (RouteManager.current)."""

    def __init__(self) -> None:
        self.source: Source | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(NAME, HELP, labels=["route"])
        for label, tokens in queued_tokens_by_route(self.source() if self.source else None):
            family.add_metric([label], tokens)
        yield family


_COLLECTOR = QueuedTokensCollector()
REGISTRY.register(_COLLECTOR)


def publish_queued_tokens(source: Source) -> Callable[[], None]:
    """Exports `source`'s routes on /metrics (one orchestrator per process: the latest wins);
    the returned call stops it."""
    _COLLECTOR.source = source

    def stop() -> None:
        if _COLLECTOR.source is source:
            _COLLECTOR.source = None

    return stop
