"""Instructions the extender executes per pod (callgrind), in process: a measure the machine's load
does not move, for comparing two builds on a shared machine.

    valgrind --tool=callgrind --instr-atstart=no python -m bench.verb_instructions --until bind
    valgrind --tool=callgrind --instr-atstart=no python -m bench.verb_instructions --until filter
    valgrind --tool=callgrind --instr-atstart=no python -m bench.verb_instructions --until watch

Sets up bench/scheduler_throughput.py's nodes (500 by default) in the extender's core and watch
cache, warms up on 10 pods, then switches callgrind's instrumentation on (``callgrind_control -i
on``) for ``--pods`` more pods of its mix and off again; valgrind's ``Collected`` line is the count
for those pods. Per pod: the watch's ADDED event, then (``--until filter``) the filter call over
every node, then (``--until bind``) the bind. Differences between the three runs give each verb's
share. The filter requests are encoded before counting starts (the bind requests, ~100 bytes, are
encoded inside). Without valgrind the script just runs (no counts).

To count another build with this script: ``cd <its checkout> && valgrind ... python
/path/to/this/bench/verb_instructions.py`` (the build in the current directory is imported).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import subprocess
from typing import Any

from app.base.catalog import GpuCatalog
from app.config.settings import Settings
from app.extender.wiring import build_core
from bench import build_cpu
from bench.scheduler_throughput import bench_nodes, bench_pods


def _instrument(on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   capture_output=True, check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=50)
    ap.add_argument("--until", choices=("watch", "filter", "bind"), default="bind")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    settings = Settings(cluster_source="none", metrics_port=0)
    catalog = GpuCatalog.load()
    binder = build_cpu.NullBinder()
    svc = build_core(settings, catalog, None, binder, live_gangs=True)
    cache = build_cpu._cache(svc, catalog, settings, binder)
    svc.ready.set()
    names = []
    for node in bench_nodes(args.nodes, "ir"):
        node["metadata"].update({"uid": "uid-" + node["metadata"]["name"], "resourceVersion": "1"})
        cache._apply("nodes", "ADDED", node)
        names.append(node["metadata"]["name"])
    pods = bench_pods(args.pods + 10)
    for i, pod in enumerate(pods):
        pod["metadata"].update({"namespace": "bench", "uid": f"u{i}", "resourceVersion": "5"})
        pod.setdefault("status", {"phase": "Pending"})
    loop = asyncio.new_event_loop()
    # kube-scheduler's side of the protocol, encoded before counting starts: the count is the
    # extender's own work (encoding 500 names per request in this script was ~9 % of it).
    bodies = {pod["metadata"]["uid"]: json.dumps({"Pod": pod, "NodeNames": names}).encode() for pod in pods}

    def one(pod: dict[str, Any]) -> None:
        cache._apply("pods", "ADDED", pod)
        if args.until == "watch":
            return
        out = json.loads(svc.filter(bodies[pod["metadata"]["uid"]]))
        node = (out.get("NodeNames") or [None])[0]
        if node and args.until == "bind":
            meta = pod["metadata"]
            loop.run_until_complete(svc.bind(json.dumps(
                {"PodName": meta["name"], "PodNamespace": "bench", "PodUID": meta["uid"], "Node": node}
            ).encode()))

    for pod in pods[:10]:
        one(pod)
    gc.collect()
    gc.freeze()  # as the live extender does once its cache is synced (app/extender/wiring.py)
    _instrument(True)
    for pod in pods[10:]:
        one(pod)
    _instrument(False)
    loop.close()


if __name__ == "__main__":
    main()
