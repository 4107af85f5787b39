"""CPU time of one filter and one prioritize, in process, for comparing two commits of the extender.

Process CPU time (not wall time) of the same requests on the same generated cluster: on a machine
shared with other work the wall clock says more about the neighbours than about the code. Run it on
each commit (a second checkout made with ``git worktree add``, put first on ``PYTHONPATH``) and
compare the rows.

    python bench/verb_cpu.py --nodes 5000
    PYTHONPATH=/tmp/prev python /tmp/prev/bench/verb_cpu.py --nodes 5000   # the other commit
"""

from __future__ import annotations

import random
import time

import orjson
import typer
from rich.console import Console
from rich.table import Table

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import LatencyClass, Stage
from app.config.settings import Settings
from app.extender.wiring import build_core
from app.snapshot.store import PlacedPod

PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4", "Tesla-T4", "NVIDIA-H200"]


def main(nodes: int = 5000, runs: int = 60, seed: int = 1) -> None:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    rnd = random.Random(seed)
    names = []
    for i in range(nodes):
        name = f"n{i}"
        names.append(name)
        svc.absorb_node(node_object(name, gpus=8, product=PRODUCTS[i % len(PRODUCTS)], cpu="96"))
        busy = rnd.randint(0, 7)
        if busy:  # varied usage: partly used nodes of every shape, training and serving
            svc.snapshot.place(PlacedPod(f"u{i}", f"ns/u{i}", name, busy, 1000.0 * busy, 2**30,
                                         rnd.choice([Stage.PRETRAINING, Stage.SERVING]),
                                         LatencyClass.INTERACTIVE, None))
    pods = {"serving 7B, 1 GPU": pod_object("p1", stage="serving", gpus=1, uid="u1",
                                            annotations={"llm-placement.io/model-params": "7B"}),
            "alignment 7B, 2 GPUs": pod_object("p2", stage="alignment", gpus=2, uid="u2",
                                               annotations={"llm-placement.io/model-params": "7B"}),
            "pretraining, 8 GPUs": pod_object("p3", stage="pretraining", gpus=8, uid="u3")}
    table = Table(title=f"CPU ms per request, {nodes} nodes (varied usage), {runs} runs")
    for col in ("request", "filter", "prioritize"):
        table.add_column(col, justify="left" if col == "request" else "right")
    for label, pod in pods.items():
        body = orjson.dumps({"Pod": pod, "NodeNames": names})
        for _ in range(5):  # warm: caches of node classes and specs
            svc.filter(body)
            svc.prioritize(body)
        t = time.process_time()
        for _ in range(runs):
            svc.filter(body)
        f = (time.process_time() - t) / runs * 1e3
        t = time.process_time()
        for _ in range(runs):
            svc.prioritize(body)
        p = (time.process_time() - t) / runs * 1e3
        table.add_row(label, f"{f:.2f}", f"{p:.2f}")
    Console().print(table)


if __name__ == "__main__":
    typer.run(main)
