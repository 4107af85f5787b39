"""The embedded default: place the bundled workload on the bundled cluster, no cluster needed."""

from __future__ import annotations

from pathlib import Path

from app.config import Settings
from app.core.catalog import GpuCatalog
from app.service import ExtenderService
from app.sim.fleet import expand_cluster, expand_workload, load_yaml
from app.sim.scheduler import Placement, SimScheduler
from app.wiring import build_core


def run_demo(
    settings: Settings, cluster: str | Path | None = None, workload: str | Path | None = None
) -> tuple[ExtenderService, list[Placement]]:
    service = build_core(settings, GpuCatalog.load())
    for node in expand_cluster(load_yaml(cluster, "cluster.yaml")):
        service.absorb_node(node)
    pods = expand_workload(load_yaml(workload, "workload.yaml"))
    sim = SimScheduler(service.placer)
    sim.admit(pods)
    return service, [sim.schedule(p) for p in pods]
