"""The embedded default: place the bundled workload on the bundled cluster, no cluster needed.

What-if only: the placements come from the simulator (``app.sim.scheduler``), which replays
kube-scheduler's cycle with the chart's shipped profile and our extender in-process. On a cluster,
kube-scheduler makes the final choice; ``llm-placement explain`` shows what it did.
"""

from __future__ import annotations

from pathlib import Path

from app.config import Settings
from app.core.catalog import GpuCatalog
from app.service import ExtenderService
from app.sim.fleet import expand_cluster, expand_workload, load_yaml
from app.sim.profile import SchedulerProfile, shipped_profile
from app.sim.scheduler import WHAT_IF, Placement, SimScheduler
from app.wiring import build_core


def demo_header(profile: SchedulerProfile | None = None) -> str:
    """The first line of the demo's output: what produced these placements."""
    p = profile or shipped_profile()
    return (f"{WHAT_IF}: kube-scheduler's cycle replayed in-process, not a cluster's decisions. "
            f"Profile {p.describe()}")


def run_demo(
    settings: Settings, cluster: str | Path | None = None, workload: str | Path | None = None,
    *, seed: int = 0,
) -> tuple[ExtenderService, list[Placement]]:
    service = build_core(settings, GpuCatalog.load())
    for node in expand_cluster(load_yaml(cluster, "cluster.yaml")):
        service.absorb_node(node)
    pods = expand_workload(load_yaml(workload, "workload.yaml"))
    sim = SimScheduler(service.placer, shipped_profile(), seed=seed)
    sim.admit(pods)
    return service, [sim.schedule(p) for p in pods]
