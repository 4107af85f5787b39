"""Facts of the extender image, measured on the built image run as the chart runs it.

    python -m bench.image_facts   # size, layers, start to ready (3 starts), RSS idle and at 5,000 nodes
    python -m bench.image_facts --nodes 500 --starts 1

The image is scripts/build-image.sh --base debian (the Dockerfile on the Python 3.11 base made from
Debian packages), started with the flags testkit.container derives from the chart's Deployment, next
to a harness control plane (etcd + kube-apiserver; no kube-scheduler: nothing is scheduled here).
Start to ready: ``docker run`` until the chart's readiness probe (an exec in the container) passes,
which needs the watch cache synced. RSS: VmRSS of the container's main process, idle 10 s after ready,
and again once its cache holds ``--nodes`` nodes. Figures go to bench/results/image.json.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import typer

from kubeharness import ControlPlane, create_nodes, find_binaries, gpu_node, wait_until
from kubeharness.container import chart_container, docker, run_script

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "bench" / "results"


def main(nodes: int = 5000, starts: int = 3, out: Path = RESULTS / "image.json") -> None:
    started = run_script("start-dockerd.sh", timeout=120)
    try:
        image = run_script("build-image.sh", "--base", "debian", timeout=2400)
        size = int(docker("image", "inspect", "-f", "{{.Size}}", image).stdout)
        layers = json.loads(docker("image", "inspect", "-f", "{{json .RootFS.Layers}}", image).stdout)
        facts: dict[str, object] = {"image": image, "size_mb": round(size / 1e6), "layers": len(layers)}
        with tempfile.TemporaryDirectory(prefix="llmp-image-facts-") as tmp:
            cp = ControlPlane(Path(tmp), find_binaries())
            cp.start(extender=False, scheduler=False)
            c = chart_container(cp, image, Path(tmp), f"llmp-facts-{os.getpid()}")
            try:
                times = [c.start() for _ in range(starts)]
                facts["start_to_ready_s"] = [round(t, 2) for t in times]
                facts["start_to_ready_median_s"] = round(statistics.median(times), 2)
                time.sleep(10)
                facts["rss_idle_mb"] = round(c.rss_bytes() / 2**20)
                t0 = time.monotonic()
                create_nodes(cp.core, [gpu_node(f"n{i}", "H100", index=i) for i in range(nodes)], workers=8)
                wait_until(lambda: cp.metric_value("llm_placement_cache_nodes") == nodes, 600,
                           f"the container's cache to hold {nodes} nodes", interval=1)
                facts["nodes"] = nodes
                facts["nodes_create_s"] = round(time.monotonic() - t0)
                time.sleep(10)
                facts["rss_at_nodes_mb"] = round(c.rss_bytes() / 2**20)
                t1 = time.monotonic()
                c.start()  # a fresh start lists all those nodes before it is ready
                facts["start_to_ready_at_nodes_s"] = round(time.monotonic() - t1, 2)
            finally:
                c.remove()
                cp.stop()
        out.write_text(json.dumps(facts, indent=2) + "\n")
        print(json.dumps(facts, indent=2))
    finally:
        if started.startswith("started"):
            run_script("start-dockerd.sh", "--stop", timeout=60)


if __name__ == "__main__":
    typer.run(main)
