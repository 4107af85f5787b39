"""A planned pipeline on the real control plane: each pod lands where `llm-placement plan` said.

The plan is made from the API server's own Node objects (as ``plan --live`` reads them); its pods carry
the plan (``plan.llm-placement.io/slot`` and a required node affinity on the planned node, see
docs/planner.md) plus the usual workload annotations, so kube-scheduler offers the extender only the
planned node and the extender's hard rules still judge it. A workflow engine would create each pod
when its producers finish; the test plays that part, and producers "finish" by a status patch (there
are no kubelets).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.base.catalog import GpuCatalog
from app.config.settings import Settings
from app.plan.manifest import planned_node, planned_pods
from app.plan.problem import build_problem, node_facts_of
from app.plan.run import plan_problem
from app.plan.workflow import Workflow
from kubeharness import (
    ControlPlane,
    cpu_node,
    create_pod,
    gpu_node,
    list_nodes,
    wait_for_node_name,
    wait_until,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration


def test_planned_pipeline_lands_where_the_plan_said(
    cluster: ClusterScope, control_plane: ControlPlane, unique: Callable[[str], str]
) -> None:
    n = cluster.node_name
    cluster.add_nodes([
        cpu_node(n("cpu"), index=1),
        gpu_node(n("h100"), "H100", gpus=4, clique=n("h100"), tier0="leaf-1", index=2),
        gpu_node(n("a100"), "A100", gpus=8, clique=n("a100"), tier0="leaf-1", index=3),
        gpu_node(n("l4"), "L4", gpus=4, zone="zone-b", clique=n("l4"), index=4),
    ])
    names = {k: unique(k) for k in ("prep", "sft", "eval", "quantize")}
    wf = Workflow.model_validate({"name": "it-plan", "namespace": cluster.namespace, "tasks": [
        {"name": names["prep"], "stage": "data-prep", "cpu": "8", "duration": "20m", "output_gb": 200},
        {"name": names["sft"], "stage": "sft", "model_params": "7B", "gpus": 4, "tokens": "20M",
         "after": [names["prep"]], "output_gb": 14},
        {"name": names["eval"], "stage": "eval", "model_params": "7B", "gpus": 1, "tokens": "500K",
         "after": [names["sft"]], "output_gb": 0.1,
         "annotations": {"llm-placement.io/latency-class": "batch"}},
        {"name": names["quantize"], "stage": "quantize", "model_params": "7B", "cpu": "8",
         "duration": "10m", "after": [names["eval"]], "output_gb": 7},
    ]})
    settings = Settings()
    ours = [x for x in list_nodes(cluster.core) if x["metadata"]["name"].startswith(cluster.prefix)]
    assert len(ours) == 4
    problem = build_problem(wf, node_facts_of(ours, settings, GpuCatalog.load()), settings)
    run = plan_problem(problem, settings, time_limit=2.0)
    assert run.result.status == "optimal"
    assert not run.problems[run.plan.method]

    cp = control_plane
    for pod in planned_pods(problem, run.plan, run.result):  # in planned start order
        name = pod["metadata"]["name"]
        create_pod(cluster.core, cluster.namespace, pod)
        landed = wait_for_node_name(cluster.core, cluster.namespace, name, timeout=60)
        assert landed == planned_node(pod) == run.plan.slots[name].node, name
        before = cp.metric_value("llm_placement_cache_pods") or 0.0
        cluster.core.patch_namespaced_pod_status(name, cluster.namespace, {"status": {"phase": "Succeeded"}})
        wait_until(lambda b=before: (cp.metric_value("llm_placement_cache_pods") or 0.0) < b, 30,
                   f"the extender to see {name} finish")
    # The stage rules held on the way: CPU stages on the CPU node, GPU stages on GPU nodes.
    assert run.plan.slots[names["prep"]].node == n("cpu")
    assert run.plan.slots[names["quantize"]].node == n("cpu")
    assert run.plan.slots[names["sft"]].node != n("cpu")
