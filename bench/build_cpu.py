"""Extender CPU per pod of the throughput benchmark's workload, in process, for one build.

    python -m bench.build_cpu --nodes 5000 --pods 400 --rounds 3       # from the root: this tree
    cd <checkout or git worktree of any commit> && PYTHONPATH=$PWD python /path/to/bench/build_cpu.py

Why: through the real kube-scheduler (bench/scheduler_throughput.py) the extender's rate moves with
the machine (kube-scheduler alone ranged 84-260 pods/s on the 2-core VM), so two builds are best
compared by what the extender itself spends. This replays bench/scheduler_throughput.py's own nodes
and pods through the extender's core and its watch cache, with the API server replaced by a binder
that records nothing: per pod the watch's ADDED event, a filter over the nodes whose GPUs still fit
(what kube-scheduler's in-tree filters would pass), the bind, and the watch's MODIFIED event with
the node set. It prints process CPU per phase per pod for each round and the minimum over rounds
(the least disturbed). Run the builds alternately; compare the minimums.

The script imports the build found first on sys.path (set PYTHONPATH to the tree to measure) and
adapts to the cache's constructor of older builds, so one copy can measure every commit.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from app.base.catalog import GpuCatalog
from app.cluster.cache import ClusterCache
from app.config.settings import Settings
from app.extender.wiring import build_core
from bench.scheduler_throughput import bench_nodes, bench_pods

GPU = "nvidia.com/gpu"


class NullBinder:
    """The API writes of a bind (binding, annotations, events) as no-ops that succeed."""

    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: dict[str, str] | None = None) -> bool:
        return True

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None:
        return None

    def read_pod(self, namespace: str, name: str) -> None:
        return None

    def __getattr__(self, name: str) -> Callable[..., None]:
        # Whatever else one build's binder protocol has (annotate, ungate, ...): nothing to write.
        return lambda *args, **kwargs: None


def _cache(svc: Any, catalog: GpuCatalog, settings: Settings, binder: NullBinder) -> ClusterCache:
    """The watch cache with the followers the live wiring gives it, in this build's signature."""
    params = inspect.signature(ClusterCache.__init__).parameters
    kw: dict[str, Any] = {"on_change": None, "events": binder}
    try:
        from app.gang.takeover import PlannedPods
        planned: Any = PlannedPods()
    except ImportError:
        planned = None
    if "followers" in params:
        followers = [planned] if planned is not None else []
        try:
            from app.gang.admission import HeldMembers
            from app.gang.persist import BackgroundWriter
            gangs = svc.gang_binder
            if isinstance(getattr(gangs, "writer", None), BackgroundWriter):
                followers.append(HeldMembers(gangs.book, gangs.writer))
        except ImportError:
            pass
        kw["followers"] = tuple(followers)
    elif "planned" in params:
        kw["planned"] = planned
    return ClusterCache(client.ApiClient(), svc.snapshot, svc.lock, catalog, settings, svc.metrics, **kw)


def _gpus(pod: dict[str, Any]) -> int:
    return int(pod["spec"]["containers"][0]["resources"]["requests"].get(GPU, "0"))


def replay(n_nodes: int, n_pods: int, tag: str) -> dict[str, float]:
    settings = Settings(cluster_source="none", metrics_port=0)
    catalog = GpuCatalog.load()
    binder = NullBinder()
    svc = build_core(settings, catalog, None, binder, live_gangs=True)
    cache = _cache(svc, catalog, settings, binder)
    svc.ready.set()
    free: dict[str, int] = {}
    for node in bench_nodes(n_nodes, tag):
        node["metadata"].update({"uid": "uid-" + node["metadata"]["name"], "resourceVersion": "1"})
        cache._apply("nodes", "ADDED", node)
        free[node["metadata"]["name"]] = int((node.get("status", {}).get("allocatable") or {}).get(GPU, "0"))
    loop = asyncio.new_event_loop()
    cpu = {"watch": 0.0, "filter": 0.0, "bind": 0.0}
    bound = 0
    version = 10
    for i, pod in enumerate(bench_pods(n_pods)):
        pod["metadata"].update({"namespace": "bench", "uid": f"uid-{tag}-{i}",
                                "resourceVersion": str(version), "creationTimestamp": "2026-01-01T00:00:00Z"})
        pod.setdefault("status", {"phase": "Pending"})
        version += 1
        t = time.process_time()
        cache._apply("pods", "ADDED", pod)
        cpu["watch"] += time.process_time() - t
        need = _gpus(pod)
        names = [n for n, f in free.items() if f >= need] if need else list(free)
        body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        t = time.process_time()
        passed = json.loads(svc.filter(body)).get("NodeNames") or []
        cpu["filter"] += time.process_time() - t
        if not passed:
            continue
        node_name = passed[0]
        request = json.dumps({"PodName": pod["metadata"]["name"], "PodNamespace": "bench",
                              "PodUID": pod["metadata"]["uid"], "Node": node_name}).encode()
        t = time.process_time()
        answer = json.loads(loop.run_until_complete(svc.bind(request)))
        cpu["bind"] += time.process_time() - t
        if answer.get("Error"):
            continue
        bound += 1
        free[node_name] -= need
        placed = json.loads(json.dumps(pod))
        placed["spec"]["nodeName"] = node_name
        placed["metadata"]["resourceVersion"] = str(version)
        version += 1
        t = time.process_time()
        cache._apply("pods", "MODIFIED", placed)
        cpu["watch"] += time.process_time() - t
    loop.close()
    out = {f"{k}_ms": v * 1000 / n_pods for k, v in cpu.items()}
    out["total_ms"] = sum(cpu.values()) * 1000 / n_pods
    out["bound"] = bound
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    import app
    print(f"build: {os.path.dirname(app.__file__)}; {args.nodes} nodes, {args.pods} pods; CPU ms per pod")
    replay(args.nodes, min(args.pods, 200), "warm")  # imports, caches
    rows = [replay(args.nodes, args.pods, f"r{r}") for r in range(args.rounds)]
    for r in rows:
        print(json.dumps({k: round(v, 3) for k, v in r.items()}))
    print("min " + json.dumps({k: round(min(r[k] for r in rows), 3) for k in rows[0] if k != "bound"}))


if __name__ == "__main__":
    main()
