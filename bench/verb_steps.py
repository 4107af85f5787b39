"""Where the extender's own CPU goes per pod, step by step, in process (no API server, no HTTP).

    python -m bench.verb_steps --nodes 500 --pods 600 --rounds 5
    cd <other checkout> && PYTHONPATH=$PWD python /path/to/bench/verb_steps.py   # another build

Replays bench/scheduler_throughput.py's nodes and pods through the extender's core and watch cache as
bench/build_cpu.py does (watch ADDED, filter, bind, watch MODIFIED per pod), with a timer around each
step of the verbs: decoding the request, parsing the pod, the filter's node classes, scoring and
narrowing, the decision memory, metrics, the bind gate, the bind's bookkeeping, the Placed message
and event (built and queued as the real binder does; no API write). Prints microseconds per pod
for each step, the minimum over rounds (the least disturbed). Steps nest (a verb includes its steps).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import queue
import time
from collections.abc import Callable
from typing import Any

import app.api.wire as wire
import app.bind.binding as binding_mod
import app.cluster.cache as cache_mod
import app.extender.service as service_mod
from app.bind.binding import PodBinding
from app.bind.decisions import DecisionMemory
from app.bind.gate import BindGate
from app.cluster.binder import Binder
from app.placement.placer import Placer
from bench import build_cpu

ACC: dict[str, float] = {}

STEPS: list[tuple[Any, str, str]] = [
    (service_mod.ExtenderService, "filter", "filter: the whole verb"),
    (wire, "parse_extender_args", "filter: decode the request (orjson, checks)"),
    (Placer, "parse", "filter: parse the pod into its spec"),
    (Placer, "classify", "filter: node classes and their verdicts"),
    (Placer, "narrow", "filter: score and narrow to the best node"),
    (DecisionMemory, "remember_filter", "filter: decision memory"),
    (DecisionMemory, "remember_scores", "filter: decision memory"),
    (service_mod.ExtenderService, "_count_filter", "filter: metrics"),
    (wire, "filter_result", "filter: encode the answer"),
    (wire, "parse_binding_args", "bind: decode the request"),
    (BindGate, "assume_at_start", "bind: gate (count at start, spec, refuse)"),
    (BindGate, "spec_for", "bind: gate (count at start, spec, refuse)"),
    (BindGate, "refuse", "bind: gate (count at start, spec, refuse)"),
    (PodBinding, "bind_one", "bind: the worker's part (API write a no-op here)"),
    (PodBinding, "_fit_now", "bind: evaluate the chosen node again"),
    (PodBinding, "_observe_bound", "bind: metrics, Placed message and event"),
    (binding_mod, "placed_message", "bind: the Placed message's text"),
    (cache_mod.ClusterCache, "_apply_pod", "watch: one pod event"),
    (cache_mod, "parse_workload", "watch: parse the pod into its spec"),
]


def _timed(f: Callable[..., Any], label: str) -> Callable[..., Any]:
    @functools.wraps(f)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            ACC[label] = ACC.get(label, 0.0) + time.perf_counter() - t
    return timed


class EventBinder(build_cpu.NullBinder):
    """Builds and queues each event as the real binder does; nothing is written."""

    def __init__(self) -> None:
        self._events: queue.Queue[Any] = queue.Queue()

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None:
        t = time.perf_counter()
        Binder.event(self, namespace, name, uid, reason, message, warning)  # type: ignore[arg-type]
        label = "bind: build and queue the event"
        ACC[label] = ACC.get(label, 0.0) + time.perf_counter() - t
        while not self._events.empty():
            self._events.get_nowait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    for owner, name, label in STEPS:
        if hasattr(owner, name):  # older builds may lack a step
            setattr(owner, name, _timed(getattr(owner, name), label))
    build_cpu.NullBinder = EventBinder  # type: ignore[misc]
    build_cpu.replay(args.nodes, min(args.pods, 200), "warm")
    best: dict[str, float] = {}
    for r in range(args.rounds):
        ACC.clear()
        build_cpu.replay(args.nodes, args.pods, f"r{r}")
        for k, v in ACC.items():
            best[k] = min(best.get(k, float("inf")), v * 1e6 / args.pods)
    import app
    print(f"build: {os.path.dirname(app.__file__)}; {args.nodes} nodes, {args.pods} pods; "
          f"us per pod, min of {args.rounds} rounds")
    for k in sorted(best):
        print(f"{best[k]:9.1f}  {k}")


if __name__ == "__main__":
    main()
