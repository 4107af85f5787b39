"""Who may bind, and the count taken at bind start (docs/extender-protocol.md, "Who may bind").

The bind verb creates Bindings with our service account, so anyone who can reach it could place any
pod anywhere. This gate lets through only kube-scheduler's binds for pods of our profile that this
extender filtered for that node and that still fit.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from app.binding import BinderLike
from app.core.placer import Placer
from app.core.snapshot import ClusterSnapshot
from app.core.workload import WorkloadError, WorkloadSpec
from app.decisions import DecisionMemory
from app.wire import BindingArgs


@dataclass(eq=False)
class BindGate:
    scheduler_name: str
    snapshot: ClusterSnapshot
    lock: threading.RLock
    memory: DecisionMemory
    placer: Placer
    binder: BinderLike | None

    def spec_for(self, namespace: str, name: str, uid: str) -> WorkloadSpec | None:
        """The pod as the API server has it: the watch's copy, else a read (never a request body)."""
        with self.lock:
            spec = self.snapshot.specs.get(uid) if uid else None
        if spec is None and self.binder is not None:
            pod = self.binder.read_pod(namespace, name)
            if pod is not None:
                try:
                    spec = self.placer.parse(pod)
                except WorkloadError:
                    spec = None
        return spec

    def refuse(self, args: BindingArgs, spec: WorkloadSpec | None, assumed_now: bool) -> str:
        """Why this bind must not happen, or ''.

        The pod must be known from the API server (watch or a read, never from a request body), use
        our scheduler, have been filtered by this extender for exactly that node, and the node must
        still have its GPUs.
        """
        where = f"{args.pod_namespace}/{args.pod_name}"
        if spec is None or (args.pod_uid and spec.uid != args.pod_uid):
            return f"bind refused: pod {where} (uid {args.pod_uid or '?'}) is not known to the API server"
        if spec.scheduler_name != self.scheduler_name:
            theirs = spec.scheduler_name or "default-scheduler"
            return f"bind refused: pod {where} uses scheduler {theirs!r}, not {self.scheduler_name!r}"
        gangs = self.placer.gangs
        with self.lock:
            facts = self.snapshot.nodes.get(args.node)
            remembered = self.memory.get(spec.uid)
            usage = self.placer.usage(args.node)
            # Counted on the node already: by a bind that went through (a retry), or just now by
            # assume_at_start, whose count must not be held against the pod itself.
            already_here = spec.uid in usage.pods and not assumed_now
            mine = usage.pods.get(spec.uid) if assumed_now else None
            used = usage.gpus - (mine.gpus if mine is not None else 0)
            # GPUs of claims kube-scheduler allocated in PreBind are held already (docs/dra.md).
            need = self.snapshot.new_gpus(spec)
            reserved = 0
            if gangs is not None and not already_here:
                reserved = gangs.reserved_gpus(args.node, spec.gang.key if spec.gang else None)
        if facts is None:
            return f"bind refused: node {args.node!r} is not known to the extender"
        if already_here:
            return ""  # a retry of a bind that went through: idempotent
        if remembered is None or remembered.fits is None or args.node not in remembered.fits:
            return (f"bind refused: pod {where} was not filtered by this extender for node {args.node} "
                    "(kube-scheduler retries it through filter)")
        free = facts.gpu_count - used - reserved
        if need > free:
            return f"bind refused: node {args.node} has {max(free, 0)} free GPUs; {where} needs {need}"
        return ""

    def assume_at_start(self, uid: str, node: str) -> bool:
        """Count the pod on its node before the first await of bind.

        kube-scheduler starts the next pod's cycle while this bind is in flight (~20 ms of API
        calls); without this, that cycle is scored on a snapshot missing this pod, and a burst of
        pods on identical nodes spreads instead of packing. Gang members are counted by their plan.
        """
        remembered = self.memory.get(uid)
        if remembered is None or remembered.fits is None or node not in remembered.fits:
            return False
        with self.lock:
            # Identity from the watch, not from the request body the filter call carried.
            spec = self.snapshot.specs.get(uid)
            ours = spec is not None and spec.scheduler_name == self.scheduler_name
            if (spec is None or not ours or spec.gang is not None or uid in self.snapshot.pods
                    or node not in self.snapshot.nodes):
                return False
            self.snapshot.assume(spec, node)
        return True
