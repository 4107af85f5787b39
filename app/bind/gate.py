"""Who may bind, and the count taken at bind start (docs/extender-protocol.md, "Who may bind").

The bind verb creates Bindings with our service account, so anyone who can reach it could place any
pod anywhere. This gate lets through only kube-scheduler's binds for pods of our profile that this
extender filtered for that node and that still fit: its GPUs by our rules, and the node rules
kube-scheduler's own filters apply (cordon, taints, node selector and affinity, CPU and memory;
app/base/bind_checks.py), since a filter call proves nothing about who sent it.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.api.wire import BindingArgs
from app.base.bind_checks import NODE_REASONS, PodRules, Refusal, node_refusal, node_rules
from app.base.workload import WorkloadError, WorkloadSpec
from app.bind.binding import BinderLike
from app.bind.decisions import DecisionMemory
from app.placement.placer import Placer
from app.snapshot.access import SnapshotAccess

# The ``reason`` label of llm_placement_bind_refusals_total (docs/metrics.md): who and what the
# request names, then the node rules of app/base/bind_checks.py.
UNKNOWN_POD = "unknown_pod"
OTHER_SCHEDULER = "other_scheduler"
UNKNOWN_NODE = "unknown_node"
NOT_FILTERED = "not_filtered"
GPUS = "gpus"
REFUSAL_REASONS = (UNKNOWN_POD, OTHER_SCHEDULER, UNKNOWN_NODE, NOT_FILTERED, GPUS, *NODE_REASONS)


@dataclass(eq=False)
class BindGate:
    scheduler_name: str
    access: SnapshotAccess
    memory: DecisionMemory
    placer: Placer
    binder: BinderLike | None

    def spec_for(self, namespace: str, name: str, uid: str) -> WorkloadSpec | None:
        """The pod as the API server has it: the watch's copy, else a read (never a request body)."""
        with self.access.view() as snap:
            spec = snap.specs.get(uid) if uid else None
        if spec is None and self.binder is not None:
            pod = self.binder.read_pod(namespace, name)
            if pod is not None:
                try:
                    spec = self.placer.parse(pod)
                except WorkloadError:
                    spec = None
        return spec

    def refuse(self, args: BindingArgs, spec: WorkloadSpec | None, assumed_now: bool) -> Refusal | None:
        """Why this bind must not happen, or None.

        The pod must be known from the API server (watch or a read, never from a request body), use
        our scheduler, have been filtered by this extender for exactly that node, the node must
        still have its GPUs, and it must pass kube-scheduler's node rules by the watch's copy of
        the node and of the pods counted on it.
        """
        where = f"{args.pod_namespace}/{args.pod_name}"
        if spec is None or (args.pod_uid and spec.uid != args.pod_uid):
            return Refusal(UNKNOWN_POD, f"bind refused: pod {where} (uid {args.pod_uid or '?'}) is not "
                                        "known to the API server")
        if spec.scheduler_name != self.scheduler_name:
            theirs = spec.scheduler_name or "default-scheduler"
            return Refusal(OTHER_SCHEDULER, f"bind refused: pod {where} uses scheduler {theirs!r}, "
                                            f"not {self.scheduler_name!r}")
        gangs = self.placer.gangs
        with self.access.view() as snap:
            facts = snap.nodes.get(args.node)
            inputs = snap.node_inputs.get(args.node)
            remembered = self.memory.get(spec.uid)
            usage = self.placer.usage(args.node)
            # Counted on the node already: by a bind that went through (a retry), or just now by
            # assume_at_start, whose count must not be held against the pod itself.
            already_here = spec.uid in usage.pods and not assumed_now
            mine = usage.pods.get(spec.uid) if assumed_now else None
            used = usage.gpus - (mine.gpus if mine is not None else 0)
            used_cpu = usage.cpu_millis - (mine.cpu_millis if mine is not None else 0.0)
            used_memory = usage.memory_bytes - (mine.memory_bytes if mine is not None else 0.0)
            # GPUs of claims kube-scheduler allocated in PreBind are held already (docs/dra.md).
            need = snap.new_gpus(spec)
            reserved = 0
            if gangs is not None and not already_here:
                reserved = gangs.reserved_gpus(args.node, spec.gang.key if spec.gang else None)
        if facts is None or inputs is None:
            return Refusal(UNKNOWN_NODE, f"bind refused: node {args.node!r} is not known to the extender")
        if already_here:
            return None  # a retry of a bind that went through: idempotent
        if remembered is None or remembered.fits is None or args.node not in remembered.fits:
            return Refusal(NOT_FILTERED,
                           f"bind refused: pod {where} was not filtered by this extender for node "
                           f"{args.node} (kube-scheduler retries it through filter)")
        free = facts.gpu_count - used - reserved
        if need > free:
            return Refusal(GPUS, f"bind refused: node {args.node} has {max(free, 0)} free GPUs; {where} "
                                 f"needs {need}")
        pod = PodRules(spec.node_selector, spec.tolerations, spec.required_terms, spec.cpu_millis,
                       spec.memory_bytes)
        refusal = node_refusal(pod, node_rules(inputs), facts.cpu_millis, facts.memory_bytes, used_cpu,
                               used_memory)
        if refusal is not None:
            return Refusal(refusal.reason, f"bind refused: {refusal.message} ({where})")
        return None

    def assume_at_start(self, uid: str, node: str) -> bool:
        """Count the pod on its node before the first await of bind.

        kube-scheduler starts the next pod's cycle while this bind is in flight (~20 ms of API
        calls); without this, that cycle is scored on a snapshot missing this pod, and a burst of
        pods on identical nodes spreads instead of packing. Gang members are counted by their plan.
        """
        remembered = self.memory.get(uid)
        if remembered is None or remembered.fits is None or node not in remembered.fits:
            return False
        with self.access.view() as snap:
            # Identity from the watch, not from the request body the filter call carried.
            spec = snap.specs.get(uid)
            ours = spec is not None and spec.scheduler_name == self.scheduler_name
            if (spec is None or not ours or spec.gang is not None or uid in snap.pods
                    or node not in snap.nodes):
                return False
            self.access.assume(spec, node)
        return True
