"""A driver publishing many slices on one node (docs/dra.md, "Churn"): the extender's CPU for a burst
of slice events, re-applying the node after every event against once per coalesced batch.

    python bench/dra_churn.py --slices 800 --devices 128
"""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.table import Table

from app.base.catalog import GpuCatalog
from app.base.objects import node_object
from app.cluster.cache import apply_node
from app.config.settings import Settings
from app.dra.index import DRIVER
from app.snapshot.store import ClusterSnapshot

console = Console()


def slice_of(i: int, devices: int) -> dict[str, object]:
    devs = [{"name": f"gpu-{i}-{j}", "attributes": {"type": {"string": "gpu"},
                                                   "productName": {"string": "NVIDIA H100 80GB HBM3"}},
             "capacity": {"memory": {"value": "81559Mi"}}} for j in range(devices)]
    return {"metadata": {"name": f"big-{i}"},
            "spec": {"driver": DRIVER, "nodeName": "big", "devices": devs,
                     "pool": {"name": f"big-{i}", "generation": 1, "resourceSliceCount": 1}}}


def run(slices: int, devices: int, every_event: bool) -> float:
    settings, catalog = Settings(cluster_source="none", metrics_port=0), GpuCatalog.load()
    snap, node = ClusterSnapshot(), node_object("big", gpus=0)
    objs = [slice_of(i, devices) for i in range(slices)]
    t0 = time.perf_counter()
    for obj in objs:
        snap.dra.put_slice(obj)
        if every_event:
            apply_node(snap, catalog, settings, node)
    apply_node(snap, catalog, settings, node)
    return time.perf_counter() - t0


def main(slices: int = 800, devices: int = 128) -> None:
    coalesced = run(slices, devices, every_event=False)
    per_event = run(slices, devices, every_event=True)
    table = Table(title=f"{slices} slices of {devices} devices on one node: extender CPU for the burst")
    for col in ("re-apply the node", "seconds", "vs coalesced"):
        table.add_column(col, justify="right")
    table.add_row("once per coalesced batch (the watch's flush)", f"{coalesced:.2f}", "1.0x")
    table.add_row("after every slice event", f"{per_event:.2f}", f"{per_event / coalesced:.0f}x")
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
