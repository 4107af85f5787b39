"""Filter/prioritize latency and memory of the extender at cluster scale (targets: docs/extender-protocol.md).

Names-only requests (nodeCacheCapable: true) against a snapshot of N nodes and P cached pods, through
the same ExtenderService the HTTP layer calls. Baseline in the same process: the least any extender
must do for that request (parse the JSON body and echo the names back), so the ratio says what the
placement logic itself costs on this machine.

    python bench/extender_latency.py --nodes 5000 --pods 100000
"""

from __future__ import annotations

import dataclasses
import gc
import random
import resource
import time
import tracemalloc
from collections.abc import Callable

import orjson
import typer
from rich.console import Console
from rich.progress import track
from rich.table import Table

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import Stage
from app.config.settings import Settings
from app.extender.wiring import build_core
from app.snapshot.store import PlacedPod

PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4", "Tesla-T4", "NVIDIA-H200"]
console = Console()


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timeit(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return sorted(out)


def pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(nodes: int = 5000, pods: int = 100_000, runs: int = 200, heap: bool = False,
         varied: bool = True) -> None:
    """--heap traces Python allocations (slower, inflates RSS); leave it off for the RSS figure.

    --varied (default) gives nodes different GPU usage (0-7 GPUs busy, training or serving), the
    realistic case; --no-varied leaves every node's GPUs free, the best case for per-shape memos.
    """
    gc.collect()
    base_rss = rss_mb()
    if heap:
        tracemalloc.start()
    # The service exactly as `serve` wires it: gang coordinator and data gravity attached.
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    for i in track(range(nodes), description="nodes", console=console):
        labels = {"nvidia.com/gpu.clique": f"c{i // 4}", "fabric.topograph.run/tier-0": f"leaf-{i // 32}"}
        svc.absorb_node(node_object(f"n{i:05d}", gpus=8, product=PRODUCTS[i % 5], labels=labels))
    stages = list(Stage)
    for i in track(range(pods), description="pods", console=console):
        # Pods as the watch stores them: a PlacedPod for usage plus the parsed spec.
        node = f"n{i % nodes:05d}"
        p = pod_object(f"p{i}", namespace=f"ns{i % 50}", stage=stages[i % 5].value, gpus=0, cpu="100m",
                       memory="128Mi", annotations={"llm-placement.io/model-params": "7B"})
        p["spec"]["nodeName"] = node
        spec = svc.placer.parse(p)
        svc.snapshot.place(PlacedPod(spec.uid, spec.key, node, 0, 100, 128 * 2**20, spec.stage, None, None))
    if varied:
        rng = random.Random(7)
        for i in range(nodes):
            busy = (i * 7) % 8  # 0..7 GPUs in use, spread over every GPU model
            if busy:
                stage = Stage.PRETRAINING if i % 3 == 0 else Stage.SERVING
                # CPU requests vary per node as in a real cluster, so nodes rarely share usage.
                cpu = 1000.0 * busy + 100 * rng.randrange(0, 120)
                svc.snapshot.place(PlacedPod(f"g{i}", f"gpu/g{i}", f"n{i:05d}", busy, cpu,
                                             8 * 2**30 * busy, stage, None, None))
    traced_now, _ = tracemalloc.get_traced_memory() if heap else (0, 0)
    tracemalloc.stop()
    gc.collect()
    gc.freeze()  # what the service does after its cache syncs
    cache_rss = rss_mb()

    names = [f"n{i:05d}" for i in range(nodes)]
    # A soft in-tree preference: filter keeps every equal-best node and prioritize is called.
    soft = pod_object("sft", stage="alignment", gpus=2, annotations={"llm-placement.io/model-params": "7B"})
    soft["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}}]}}
    cases = {
        "serving 70B, SLO 30 ms (2/5 pass)": pod_object("chat", stage="serving", gpus=4, annotations={
            "llm-placement.io/model-params": "70B", "llm-placement.io/max-ms-per-token": "30"}),
        "plain 1-GPU pod (all pass)": pod_object("plain", gpus=1),
        "alignment 7B, 2 GPUs, preferred affinity": soft,
        "data-prep CPU pod (none pass)": pod_object("prep", stage="data-prep", cpu="4"),
    }
    usage = "varied GPU usage" if varied else "all GPUs free"
    table = Table(title=f"extender latency, {nodes} nodes ({usage}), {pods} cached pods, {runs} runs (ms)")
    for col in ("request", "verb", "p50", "p99", "baseline p50", "p99 / baseline p99"):
        table.add_column(col, justify="right" if col != "request" else "left")
    for label, pod in cases.items():
        fbody = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
        # prioritize at its worst: every feasible node (filter_to_best off, or a pod with a soft
        # preference whose feasible nodes all tie); with filter_to_best it is usually not called.
        narrowing = svc.placer.policy
        svc.placer.policy = dataclasses.replace(narrowing, filter_to_best=False)
        survivors = orjson.loads(svc.filter(fbody))["NodeNames"] or names[:1]
        svc.placer.policy = narrowing
        pbody = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": survivors})
        for verb, body, fn in (("filter", fbody, svc.filter), ("prioritize", pbody, svc.prioritize)):
            if verb == "prioritize":
                svc.filter(fbody)  # kube-scheduler calls filter first, in the same cycle
            ours = timeit(lambda fn=fn, body=body: fn(body), runs)  # type: ignore[misc]
            def echo(body: bytes = body) -> bytes:
                return orjson.dumps({"NodeNames": orjson.loads(body)["NodeNames"]})

            base = timeit(echo, runs)
            table.add_row(label, verb, f"{pct(ours, .5):.2f}", f"{pct(ours, .99):.2f}",
                          f"{pct(base, .5):.3f}", f"{pct(ours, .99) / pct(base, .99):.0f}x")
    console.print(table)
    heap_note = f"; Python heap of the cache {traced_now / 2**20:.0f} MB" if heap else ""
    console.print(
        f"memory: peak RSS {cache_rss:.0f} MB (process before the cache: {base_rss:.0f} MB){heap_note}"
    )
    console.print(f"p99 target 5 ms; RSS target 300 MB with {nodes} nodes + {pods} pods")


if __name__ == "__main__":
    typer.run(main)
