"""The simulator against the real thing: the same ~200 pods through app.sim and through kube-scheduler.

Cluster: 25 nodes (6 H100 and 4 A100 boxes of 8 GPUs, 6 L4 and 4 T4 nodes of 4, 3 CPU and 2 storage
nodes; 120 GPUs). Workload: 200 pods drawn with a fixed seed, every lifecycle stage, 0-8 GPUs, about
as many GPUs in all as the cluster has, so the later pods compete and some cannot be placed while the
cluster is fragmented. Pods go one at a time
(created, then bound or marked Unschedulable; an unschedulable pod is deleted at once), so the real
scheduler never retries a pod later and both sides see the same sequence.

Two comparisons:
1. Lock-step: before each real decision, the simulator runs the same cycle on a mirror of the real
   cluster state (the real bindings so far) with the profile kube-scheduler was started with. The node
   kube-scheduler binds must be one of the simulator's highest-scoring nodes, and unschedulable must
   agree. The random tie-break cannot be compared by name, so the set of equal best nodes is.
2. Independent replay: the simulator alone, from an empty cluster, with its own seeded tie-break.
   Where ties are random the names differ, so the outcomes are compared by value: per pod, the chosen
   node's (GPU model, GPU count, node class, free GPUs left); every 10 pods, GPUs placed, whole free
   GPU nodes and stranded GPUs (free GPUs on partly used GPU nodes); at the end, the hourly cost.
   Tolerance: values are expected identical (ties here are between nodes of identical shape and
   usage, which leave isomorphic clusters), and the test allows at most 2 % of pods to differ, each
   sample within 2 % of GPUs placed, 1 whole node and 4 stranded GPUs, the cost within 2 %.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from app.base.catalog import GpuCatalog
from app.config.settings import Settings
from app.placement.feasibility import pod_hourly_cost
from app.placement.placer import Placer
from app.sim.profile import load_profile
from app.sim.scheduler import SimScheduler
from app.snapshot.nodes import node_facts
from app.snapshot.store import ClusterSnapshot
from kubeharness import cpu_node, create_pod, get_pod, gpu_node, list_nodes, llm_pod

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

SEED = 7
PODS = 200
AGREEMENT = 0.99  # issue target: kube-scheduler binds one of our best nodes in >= 99 % of decisions
MAX_VALUE_MISMATCH = 0.02

# (weight, stage, model-params, precision, GPUs, extra annotations, cpu, memory)
MIX: list[tuple[int, str, str | None, str | None, int, dict[str, str], str, str]] = [
    (12, "serving", "7B", "int8", 1, {}, "4", "16Gi"),
    (8, "serving", "13B", "bf16", 1, {}, "8", "32Gi"),
    (1, "serving", "70B", "bf16", 4, {"max-ms-per-token": "30"}, "16", "128Gi"),
    (10, "alignment", "1B", None, 1, {}, "8", "64Gi"),
    (5, "alignment", "3B", None, 2, {}, "16", "128Gi"),
    (2, "alignment", "7B", None, 4, {}, "32", "256Gi"),
    (1, "pretraining", "7B", None, 8, {}, "64", "512Gi"),
    (30, "data-prep", None, None, 0, {"input-data-gb": "200"}, "2", "8Gi"),
    (31, "deployment", "7B", "bf16", 0, {}, "2", "8Gi"),
]

def _workload(prefix: str) -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    weights = [m[0] for m in MIX]
    pods = []
    for i in range(PODS):
        _, stage, params, precision, gpus, extra, cpu, mem = rng.choices(MIX, weights)[0]
        pods.append(llm_pod(
            f"{prefix}-{i:03d}-{stage}", stage=stage, model_params=params, precision=precision, gpus=gpus,
            cpu=cpu, memory=mem, annotations={"llm-placement.io/" + k: v for k, v in extra.items()},
        ))
    return pods


@pytest.fixture(scope="module")
def nodes(cluster: ClusterScope) -> list[dict[str, Any]]:
    n = cluster.node_name
    manifests: list[dict[str, Any]] = []
    for i in range(6):
        manifests.append(gpu_node(n(f"h100-{i}"), "H100", clique=n(f"clq-h{i}"), tier0=f"leaf-{i // 3}",
                                  tier1="spine-1", rdma=True, index=len(manifests)))
    for i in range(4):
        manifests.append(gpu_node(n(f"a100-{i}"), "A100", tier0="leaf-2", tier1="spine-1", rdma=True,
                                  index=len(manifests)))
    for gpu, count in (("L4", 6), ("T4", 4)):
        for i in range(count):
            manifests.append(gpu_node(n(f"{gpu.lower()}-{i}"), gpu, gpus=4, cpu="48", memory="192Gi",
                                      zone="zone-b", index=len(manifests)))
    for i in range(3):
        manifests.append(cpu_node(n(f"cpu-{i}"), "cpu", cpu="64", memory="512Gi", index=len(manifests)))
    for i in range(2):
        manifests.append(cpu_node(n(f"storage-{i}"), "storage", cpu="32", memory="256Gi", index=len(manifests)))
    cluster.add_nodes(manifests)
    mine = set(cluster.nodes)
    api_nodes = list_nodes(cluster.core)
    others = sorted(x["metadata"]["name"] for x in api_nodes if x["metadata"]["name"] not in mine)
    assert not others, f"other modules' nodes would take part in scheduling: {others[:5]}"
    return api_nodes


class Model:
    """A snapshot + placer built from the API's own node objects, as the extender builds its cache."""

    def __init__(self, api_nodes: list[dict[str, Any]]) -> None:
        self.settings = Settings(cluster_source="none", metrics_port=0)
        catalog = GpuCatalog.load()
        self.snapshot = ClusterSnapshot()
        for node in api_nodes:
            self.snapshot.upsert_node(node_facts(node, catalog, self.settings.labels,
                                                 self.settings.default_cpu_hourly_cost))
        self.placer = Placer(self.settings.policies().placement, self.snapshot)

    def value(self, node: str) -> tuple[str, int, str, int]:
        f = self.snapshot.nodes[node]
        return (f.gpu_product or "-", f.gpu_count, f.node_class.value, self.snapshot.free_gpus(node))

    def quality(self) -> dict[str, float]:
        whole = stranded = placed = 0
        for name, f in self.snapshot.nodes.items():
            if not f.gpu_count:
                continue
            free = self.snapshot.free_gpus(name)
            placed += f.gpu_count - free
            whole += free == f.gpu_count
            stranded += free if 0 < free < f.gpu_count else 0
        return {"gpus_placed": placed, "whole_free_gpu_nodes": whole, "stranded_gpus": stranded}


def _outcome(core: Any, namespace: str, name: str, timeout: float = 30.0) -> str | None:
    """The node kube-scheduler bound the pod to, or None once it marked the pod Unschedulable."""
    deadline = time.monotonic() + timeout
    while True:
        pod = get_pod(core, namespace, name)
        if pod["spec"].get("nodeName"):
            return str(pod["spec"]["nodeName"])
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                return None
        if time.monotonic() >= deadline:
            raise AssertionError(f"{namespace}/{name}: neither bound nor Unschedulable within {timeout:.0f}s")
        time.sleep(0.02)


def _delete_now(core: Any, namespace: str, name: str) -> None:
    # Gone before the next pod is created, so kube-scheduler cannot retry it on a later event.
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0, _preload_content=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            get_pod(core, namespace, name)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.02)
    raise AssertionError(f"{namespace}/{name} still present 30s after delete")


def test_simulator_predicts_kube_scheduler(
    cluster: ClusterScope, control_plane: Any, nodes: list[dict[str, Any]], unique: Callable[[str], str]
) -> None:
    t0 = time.monotonic()
    assert control_plane.scheduler_config_file is not None
    profile = load_profile(control_plane.scheduler_config_file, "llm-placement")
    assert profile.extender_weight is not None
    pods = _workload(unique("sim"))
    ns = cluster.namespace

    # --- the real run, with the simulator predicting each decision from the mirrored state ---------
    mirror = Model(nodes)
    predictor = SimScheduler(mirror.placer, profile, seed=SEED)
    real: list[str | None] = []
    real_values: list[tuple[str, int, str, int] | None] = []
    disagreements: list[str] = []
    ties = not_first_by_name = 0
    real_series: list[dict[str, float]] = []
    for i, manifest in enumerate(pods):
        created = create_pod(cluster.core, ns, manifest)
        name = created["metadata"]["name"]
        cyc = predictor.cycle(created)
        best = {c.node for c in cyc.best()}
        ties += len(best) > 1
        node = _outcome(cluster.core, ns, name)
        real.append(node)
        if node is None:
            _delete_now(cluster.core, ns, name)
            real_values.append(None)
            if best:
                disagreements.append(f"{name}: unschedulable, simulator would bind to one of {sorted(best)[:3]}")
        else:
            not_first_by_name += len(best) > 1 and node != min(best)
            if node not in best:
                disagreements.append(f"{name}: bound to {node}, simulator's best {sorted(best)[:3] or 'none'}")
            assert cyc.spec is not None
            mirror.snapshot.assume(cyc.spec, node)
            real_values.append(mirror.value(node))
        if (i + 1) % 10 == 0:
            real_series.append(mirror.quality())
    agreement = 1 - len(disagreements) / len(pods)
    assert agreement >= AGREEMENT, f"agreement {agreement:.3f}: " + "; ".join(disagreements[:5])

    # --- the simulator alone, its own tie-break, the same pods -----------------------------------
    alone = Model(nodes)
    sim = SimScheduler(alone.placer, profile, seed=SEED + 1)
    sim_values: list[tuple[str, int, str, int] | None] = []
    sim_cost = 0.0
    sim_series: list[dict[str, float]] = []
    for i, manifest in enumerate(pods):
        pod = {**manifest, "metadata": {**manifest["metadata"], "namespace": ns, "uid": f"sim-{i}"}}
        placed = sim.schedule(pod)
        if placed.node is None:
            sim_values.append(None)
        else:
            sim_values.append(alone.value(placed.node))
            sim_cost += pod_hourly_cost(alone.placer.parse(pod), alone.snapshot.nodes[placed.node])
        if (i + 1) % 10 == 0:
            sim_series.append(alone.quality())
    real_cost = sum(
        pod_hourly_cost(mirror.placer.parse(m), mirror.snapshot.nodes[n]) for m, n in zip(pods, real, strict=True)
        if n is not None
    )
    mismatched = [i for i, (a, b) in enumerate(zip(real_values, sim_values, strict=True)) if a != b]

    def mean(series: list[dict[str, float]], key: str) -> float:
        return round(sum(x[key] for x in series) / len(series), 2)

    keys = ("gpus_placed", "whole_free_gpu_nodes", "stranded_gpus")
    figures = {
        side: {"pods_placed": sum(v is not None for v in values), "hourly_cost": round(cost, 2),
               **{f"{k} (mean of samples)": mean(series, k) for k in keys}, "final": series[-1]}
        for side, values, cost, series in (("real", real_values, real_cost, real_series),
                                            ("sim", sim_values, sim_cost, sim_series))
    }
    report = (f"figures {figures}; per-pod value mismatches {len(mismatched)}/{len(pods)} "
              f"(first at pod {mismatched[0] if mismatched else '-'}); decisions with ties {ties}, real choice "
              f"not the first by name in {not_first_by_name}; agreement {agreement:.3f}; "
              f"{time.monotonic() - t0:.0f}s")
    print(report)
    r = figures["real"]
    # The workload must exercise what is compared: competition, failures, fragmentation, random ties.
    assert 0 < int(r["pods_placed"]) < len(pods) and ties > 0, report
    # kube-scheduler's ties really are random, which is why names are not compared.
    assert not_first_by_name > 0, report
    assert any(x["stranded_gpus"] for x in real_series) and any(x["whole_free_gpu_nodes"] for x in real_series)
    assert len(mismatched) <= MAX_VALUE_MISMATCH * len(pods), report
    for a, b in zip(real_series, sim_series, strict=True):
        assert abs(a["gpus_placed"] - b["gpus_placed"]) <= 0.02 * max(1, a["gpus_placed"]), report
        assert abs(a["whole_free_gpu_nodes"] - b["whole_free_gpu_nodes"]) <= 1, report
        assert abs(a["stranded_gpus"] - b["stranded_gpus"]) <= 4, report
    assert abs(real_cost - sim_cost) <= 0.02 * real_cost, report
