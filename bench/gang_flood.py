"""What an incomplete gang's member costs the extender per filter, against the full evaluation.

kube-scheduler retries every pending pod; a tenant with thousands of two-member gangs that never
complete sends a filter per member per retry. The extender answers such a member without looking at
any node ("waiting for gang members", docs/gangs.md): this script times that answer, in the same
process, against (a) the full per-node evaluation the same member would get once its gang is
complete (the work it used to cost), and (b) a plain GPU pod's filter, at N nodes.

    python bench/gang_flood.py --nodes 5000
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson
import typer
from rich.console import Console
from rich.table import Table

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.config.settings import Settings
from app.extender.wiring import build_core

console = Console()


def timed(fn: Callable[[], object], runs: int) -> float:
    """Median milliseconds of ``runs`` calls."""
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return sorted(out)[len(out) // 2]


def main(nodes: int = 5000, gangs: int = 4000, runs: int = 100) -> None:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    names = [f"n-{i}" for i in range(nodes)]
    for n in names:
        svc.absorb_node(node_object(n, gpus=8, product="NVIDIA-H100-80GB-HBM3", rdma=True))
    # The flood: one member of each two-member gang, pending.
    members = []
    for g in range(gangs):
        pod = pod_object(f"flood-{g}-0", namespace="tenant-a", stage="pretraining", gpus=8,
                         labels={"scheduling.x-k8s.io/pod-group": f"flood-{g}"},
                         annotations={"llm-placement.io/gang-size": "2"}, uid=f"flood-{g}-0")
        svc.snapshot.track_spec(parse_workload(pod))
        members.append(pod)
    other = pod_object("other", namespace="tenant-b", stage="serving", gpus=1,
                       annotations={"llm-placement.io/model-params": "8B"}, uid="other")

    def body(pod: dict[str, object]) -> bytes:
        return orjson.dumps({"Pod": pod, "NodeNames": names})

    flood_body, other_body = body(members[0]), body(other)
    spec = parse_workload(members[0])
    placer = svc.placer
    early = timed(lambda: svc.filter(flood_body), runs)
    gangs_hook = placer.gangs
    assert gangs_hook is not None
    # The path before the early answer: every node classified, then the gang hook rejects them all.
    real = gangs_hook.undecidable
    placer.gangs.undecidable = lambda s: None  # type: ignore[method-assign]
    try:
        full = timed(lambda: svc.filter(flood_body), runs)
    finally:
        placer.gangs.undecidable = real  # type: ignore[method-assign]
    rows = [
        ("incomplete gang member: filter, answered without the nodes", early),
        ("the same filter with every node evaluated first (before)", full),
        ("  of which the node evaluation", timed(lambda: placer.evaluate_nodes(spec, names), runs)),
        ("another tenant's GPU pod: filter", timed(lambda: svc.filter(other_body), runs)),
    ]
    table = Table(title=f"filter at {nodes} nodes, {gangs} incomplete gangs pending (median of {runs})")
    table.add_column("request")
    table.add_column("ms", justify="right")
    table.add_column("vs the waiting answer", justify="right")
    for what, ms in rows:
        table.add_row(what, f"{ms:.2f}", f"{ms / rows[0][1]:.1f}x")
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
