"""A prefill/decode pair of one serving-group on the real control plane (docs/data-gravity.md).

Three nodes, kept to this module's pods by a nodeSelector: an H100 box and an L4 box under leaf
switch A, and a cheaper, bigger L4 box under leaf switch B. The prefill pod's time-to-first-token
target only the H100 meets; the decode pod is cheapest on an L4, and without its group it would take
the cheaper L4 under leaf B. With the group it must land under the prefill pod's leaf switch, and a
decode pod that asks for the rule (`colocation: leaf`) stays there even when only the expensive
H100 box has room.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kubeharness import create_pod, gpu_node, llm_pod, wait_for_node_name, wait_until

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

ANN = "llm-placement.io/"
GROUP = "llm-placement.io/it-group"
AGREEMENT = "llm_placement_scheduler_agreement_total"
# 3B int8, one sequence of 2,048 tokens: ~3 GB read per token, ~18 ms on an L4, well within the
# interactive default. An 8,000-token prompt is 48 TFLOP: ~0.1 s on an H100, ~0.8 s on an L4
# (dense BF16 from the data sheets at prefill_efficiency 0.5), so a 300 ms target needs the H100.
MODEL = {ANN + "model-params": "3B", ANN + "precision": "int8", ANN + "concurrency": "1",
         ANN + "context-tokens": "2048"}


def _pod(name: str, role: str, group: str | None, gpus: int = 1, **ann: str) -> dict[str, Any]:
    annotations = {**MODEL, ANN + "serving-role": role, **{ANN + k: v for k, v in ann.items()}}
    if group is not None:
        annotations[ANN + "serving-group"] = group
    pod = llm_pod(name, stage="serving", gpus=gpus, annotations=annotations)
    pod["spec"]["nodeSelector"] = {GROUP: "pd"}
    return pod


def test_prefill_and_decode_of_one_group_share_a_leaf(
    cluster: ClusterScope, unique: Callable[[str], str]
) -> None:
    n = cluster.node_name
    h100, l4_near, l4_far = n("pd-h100"), n("pd-l4-a"), n("pd-l4-b")
    leaf_a, leaf_b = n("pd-leaf-a"), n("pd-leaf-b")
    cluster.add_nodes([
        gpu_node(h100, "H100", gpus=8, clique=n("pd-nvl-a"), tier0=leaf_a, tier1=n("pd-spine-a"),
                 labels={GROUP: "pd"}, index=90),
        gpu_node(l4_near, "L4", gpus=4, cpu="48", memory="192Gi", tier0=leaf_a, tier1=n("pd-spine-a"),
                 labels={GROUP: "pd"}, index=91),
        # 7 % below the catalog price of 4 L4 and twice the CPU and memory: the decoy.
        gpu_node(l4_far, "L4", gpus=4, cpu="96", memory="768Gi", tier0=leaf_b, tier1=n("pd-spine-b"),
                 labels={GROUP: "pd"}, annotations={ANN + "hourly-cost": "3.00"}, index=92),
    ])
    cluster.wait_extender_sees_nodes()
    core, ns = cluster.core, cluster.namespace
    lower_before = cluster.cp.metric_value(AGREEMENT, {"outcome": "lower"}) or 0.0
    group = unique("chat")

    # A decode pod outside any group shows where the price alone sends it (then it goes away).
    loner = unique("decode-alone")
    create_pod(core, ns, _pod(loner, "decode", None))
    assert wait_for_node_name(core, ns, loner) == l4_far
    cached = cluster.cp.metric_value("llm_placement_cache_pods") or 0.0
    core.delete_namespaced_pod(loner, ns, grace_period_seconds=0)
    wait_until(lambda: (cluster.cp.metric_value("llm_placement_cache_pods") or 0.0) < cached, 30,
               "the extender to see the ungrouped decode pod go")

    prefill = unique("prefill")
    create_pod(core, ns, _pod(prefill, "prefill", group, **{"prompt-tokens": "8000", "context-tokens": "8192",
                                                           "max-ttft-ms": "300"}))
    assert wait_for_node_name(core, ns, prefill) == h100  # the only GPU meeting the TTFT target

    decode = unique("decode")
    create_pod(core, ns, _pod(decode, "decode", group))
    assert wait_for_node_name(core, ns, decode) == l4_near, "decode left its prefill partner's leaf"

    # As a rule: four GPUs no longer fit the near L4 (one is taken), only the partner's own box has
    # room in the leaf; the far L4 is far cheaper but outside it.
    required = unique("decode-required")
    create_pod(core, ns, _pod(required, "decode", group, gpus=4, colocation="leaf"))
    assert wait_for_node_name(core, ns, required) == h100
    assert (cluster.cp.metric_value(AGREEMENT, {"outcome": "lower"}) or 0.0) == lower_before
