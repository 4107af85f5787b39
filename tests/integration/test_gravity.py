"""Data gravity on the real control plane: a five-stage pipeline follows its data, falls back one tier
at a time when the producer's node is full, and a missing producer is reported, never fatal.

Cluster (one per module). "home" is zone-a: leaf-1 holds the CPU node cpu-home and the H100 boxes h1
and h2, which share one multi-node NVLink domain (as GB200 NVL racks do); leaf-2, under the same
spine, holds the H100 box h3. "away" is zone-b: cpu-away and the H100 boxes a1 and a2, identical
hardware at the same price. cpu-home is priced above cpu-away, so without gravity the deployment
stage would leave home. The stage rules put data-prep and deployment on CPU nodes and the GPU stages
on GPU nodes, so "next to" a CPU producer means sharing a fabric tier with it (zone-a's spine here).

kube-scheduler only sees our 0-10 integer score (plus its own near-equal in-tree scores and a random
tie-break), so every assertion below is one the rules decide by at least a whole point on this
cluster, or is stated as a set ("on or next to"). Producers "finish" by a status patch to Succeeded:
there are no kubelets, and a finished producer is exactly what a consumer follows in practice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from kubeharness import (
    ControlPlane,
    cpu_node,
    create_pod,
    delete_all_pods,
    ensure_namespace,
    gpu_node,
    llm_pod,
    scheduling_messages,
    wait_for_event,
    wait_for_node_name,
    wait_until,
)
from kubeharness.tokens import pod_reader_token

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

ANN = "llm-placement.io/"
HOME_LEAF = {"fabric.topograph.run/tier-0": "leaf-1", "fabric.topograph.run/tier-1": "spine-1"}
AWAY_LEAF = {"fabric.topograph.run/tier-0": "leaf-9", "fabric.topograph.run/tier-1": "spine-9"}


@pytest.fixture(scope="module")
def nodes(cluster: ClusterScope) -> dict[str, str]:
    """Create the cluster; return short name -> node name."""
    n = cluster.node_name
    short = ["cpu-home", "h1", "h2", "h3", "cpu-away", "a1", "a2"]
    cluster.add_nodes(
        [
            cpu_node(n("cpu-home"), labels=HOME_LEAF, annotations={ANN + "hourly-cost": "0.10"}, index=1),
            gpu_node(n("h1"), "H100", clique=n("nvl-1"), tier0="leaf-1", tier1="spine-1", rdma=True, index=2),
            gpu_node(n("h2"), "H100", clique=n("nvl-1"), tier0="leaf-1", tier1="spine-1", rdma=True, index=3),
            gpu_node(n("h3"), "H100", clique=n("h3"), tier0="leaf-2", tier1="spine-1", rdma=True, index=4),
            cpu_node(n("cpu-away"), zone="zone-b", labels=AWAY_LEAF, index=5),
            gpu_node(
                n("a1"), "H100", zone="zone-b", clique=n("a1"), tier0="leaf-9", tier1="spine-9", index=6
            ),
            gpu_node(
                n("a2"), "H100", zone="zone-b", clique=n("a2"), tier0="leaf-9", tier1="spine-9", index=7
            ),
        ]
    )
    return {s: n(s) for s in short}


@pytest.fixture
def clean(cluster: ClusterScope) -> Iterator[None]:
    """Each test starts on an empty cluster (capacity decides fallbacks)."""
    yield
    delete_all_pods(cluster.core, cluster.namespace)


def _pod(
    name: str,
    stage: str,
    *,
    depends: str | None = None,
    gb: float | None = None,
    pin: str | None = None,
    **kw: Any,
) -> dict[str, Any]:
    ann: dict[str, str] = dict(kw.pop("annotations", {}))
    if depends is not None:
        ann[ANN + "depends-on"] = depends
    if gb is not None:
        ann[ANN + "input-data-gb"] = f"{gb:g}"
    pod = llm_pod(name, stage=stage, annotations=ann, **kw)
    if pin is not None:
        # In-tree NodeAffinity narrows kube-scheduler to one node: a producer placed by hand.
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": pin}
    return pod


def _run(cluster: ClusterScope, pod: dict[str, Any], namespace: str | None = None) -> str:
    ns = namespace or cluster.namespace
    create_pod(cluster.core, ns, pod)
    return wait_for_node_name(cluster.core, ns, pod["metadata"]["name"], timeout=60)


def _finish(cp: ControlPlane, cluster: ClusterScope, name: str, namespace: str | None = None) -> None:
    """Mark a bound pod Succeeded and wait until the extender's cache has released it."""
    before = cp.metric_value("llm_placement_cache_pods") or 0.0
    cluster.core.patch_namespaced_pod_status(
        name, namespace or cluster.namespace, {"status": {"phase": "Succeeded"}}
    )
    wait_until(
        lambda: (cp.metric_value("llm_placement_cache_pods") or 0.0) < before,
        30,
        f"the extender to see {name} finish",
    )


def _explain(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    # explain answers only callers who may get the pod (docs/extender-protocol.md).
    token = pod_reader_token(cp.api, namespace, "gravity-reader")
    r = httpx.get(f"{cp.extender_base}/explain/{namespace}/{name}",
                  headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _edges(cp: ControlPlane, stage: str, distance: str) -> float:
    return (
        cp.metric_value("llm_placement_dependency_edges_total", {"stage": stage, "distance": distance}) or 0.0
    )


def test_five_stage_pipeline_follows_its_data(
    cluster: ClusterScope,
    control_plane: ControlPlane,
    nodes: dict[str, str],
    unique: Callable[[str], str],
    clean: None,
) -> None:
    cp, ns = control_plane, cluster.namespace
    home_gpus = {nodes["h1"], nodes["h2"], nodes["h3"]}
    nvlink = {
        nodes["h1"]: {nodes["h1"], nodes["h2"]},
        nodes["h2"]: {nodes["h1"], nodes["h2"]},
        nodes["h3"]: {nodes["h3"]},
    }
    # The corpus comes from another team's namespace: a cross-namespace edge.
    data_ns = f"{ns}-data"
    ensure_namespace(cluster.core, data_ns)
    # The curated data lives in another namespace, which shares it with the pipeline's (opt-in:
    # docs/data-gravity.md); without it the cross-namespace edge is never followed.
    cluster.core.patch_namespace(data_ns, {"metadata": {"annotations": {"llm-placement.io/share-with": ns}}})
    prep, pretrain, sft, quant, serve = (unique(s) for s in ("prep", "pretrain", "sft", "quantize", "serve"))
    edges_before = {
        s: _edges(cp, s, "fabric") + _edges(cp, s, "node") + _edges(cp, s, "nvlink")
        for s in ("pretraining", "alignment", "deployment", "serving")
    }
    try:
        at = _run(cluster, _pod(prep, "data-prep", pin=nodes["cpu-home"], cpu="1", memory="1Gi"), data_ns)
        assert at == nodes["cpu-home"]
        _finish(cp, cluster, prep, data_ns)

        # CPU -> GPU: a box sharing zone-a's fabric with the corpus, never the other zone.
        at = _run(
            cluster,
            _pod(pretrain, "pretraining", depends=f"{data_ns}/{prep}", gb=280, gpus=8, model_params="7B"),
        )
        assert at in home_gpus, f"pretraining left the corpus's fabric for {at}"
        pretrain_node = at
        _finish(cp, cluster, pretrain)

        # GPU -> GPU with the producer's box free again: on it, or on its NVLink sibling.
        at = _run(cluster, _pod(sft, "alignment", depends=pretrain, gb=14, gpus=4, model_params="7B"))
        assert at in nvlink[pretrain_node], f"alignment went to {at}, its checkpoint is on {pretrain_node}"
        sft_node = at
        _finish(cp, cluster, sft)

        # GPU -> CPU: the CPU node of the same fabric, although cpu-away is cheaper.
        at = _run(
            cluster, _pod(quant, "deployment", depends=sft, gb=14, model_params="7B", cpu="4", memory="32Gi")
        )
        assert at == nodes["cpu-home"], f"quantisation left the checkpoint's fabric for {at}"
        _finish(cp, cluster, quant)

        # CPU -> GPU again: serving stays in zone-a's fabric (a1/a2 are the same hardware and price).
        at = _run(
            cluster, _pod(serve, "serving", depends=quant, gb=7, gpus=1, model_params="7B", precision="int8")
        )
        assert at in home_gpus, f"serving went to {at}, away from its quantised weights"

        # Explain shows the edge, where the producer ran and the cost per node.
        detail = _explain(cp, ns, sft)
        [edge] = detail["gravity"]["edges"]
        assert edge["producer"] == f"{ns}/{pretrain}"
        assert [(s["node"], s["state"]) for s in edge["sites"]] == [(pretrain_node, "finished")]
        per_node = {e["node"]: e["gravity"] for e in detail["nodes"]}
        assert per_node[sft_node]["edges"][0]["distance"] in ("node", "nvlink")
        assert per_node[nodes["a1"]]["edges"][0]["distance"] == "cross-zone"
        assert per_node[nodes["a1"]]["seconds"] > per_node[pretrain_node]["seconds"]

        # Bind-time metrics: every consumer's edge was counted at a near distance.
        for stage, before in edges_before.items():
            after = _edges(cp, stage, "fabric") + _edges(cp, stage, "node") + _edges(cp, stage, "nvlink")
            assert after == before + 1, stage
    finally:
        delete_all_pods(cluster.core, data_ns)


def test_consumer_keeps_a_whole_node_whole_when_a_same_shape_node_has_room(
    cluster: ClusterScope,
    control_plane: ControlPlane,
    nodes: dict[str, str],
    unique: Callable[[str], str],
    clean: None,
) -> None:
    """The whole-node guard (docs/scoring.md) through the real kube-scheduler: the producer's box is
    whole again after it finished, and h3 (same hardware, same price) already runs a small job, so the
    consumer goes to h3 instead of opening the producer's box for the next 8-GPU job. The consumer
    asks for 2 GPUs, and gravity opens no node of more than twice a pod's GPUs while another
    candidate fits it (docs/data-gravity.md): explain says so on h1."""
    cp, ns = control_plane, cluster.namespace
    pretrain, busy, sft = unique("pretrain"), unique("busy"), unique("sft")
    assert _run(cluster, _pod(pretrain, "pretraining", pin=nodes["h1"], gpus=8, model_params="1B")) == nodes["h1"]
    _finish(cp, cluster, pretrain)
    assert _run(cluster, _pod(busy, "alignment", pin=nodes["h3"], gpus=1, model_params="1B")) == nodes["h3"]
    # 2 TB: reading it off the producer's box saves minutes, so the pull alone would open h1.
    at = _run(cluster, _pod(sft, "alignment", depends=pretrain, gb=2000, gpus=2, model_params="1B"))
    assert at == nodes["h3"], f"the consumer opened {at} although h3 had room"
    detail = _explain(cp, ns, sft)
    per_node = {e["node"]: e for e in detail["nodes"]}
    note = per_node[nodes["h1"]].get("gravity_not_counted")
    assert note and "8-GPU node for 2 GPU(s)" in note
    # The producer's box is still the nearest: only its pull was capped at h3's.
    assert per_node[nodes["h1"]]["gravity"]["seconds"] < per_node[nodes["h3"]]["gravity"]["seconds"]
    assert per_node[nodes["h1"]]["terms"]["gravity"] == per_node[nodes["h3"]]["terms"]["gravity"]


def test_consumer_falls_back_one_tier_at_a_time(
    cluster: ClusterScope,
    control_plane: ControlPlane,
    nodes: dict[str, str],
    unique: Callable[[str], str],
    clean: None,
) -> None:
    trainer, first, filler, second = (unique(s) for s in ("trainer", "eval", "filler", "eval8"))
    # The producer keeps running on h1 and holds all 8 GPUs.
    assert (
        _run(cluster, _pod(trainer, "alignment", pin=nodes["h1"], gpus=8, model_params="7B")) == nodes["h1"]
    )

    # Node full -> the next tier: h2, h1's NVLink domain, not h3 (same spine) nor the other zone.
    at = _run(cluster, _pod(first, "alignment", depends=trainer, gb=100, gpus=4, model_params="7B"))
    assert at == nodes["h2"], f"expected h1's NVLink sibling, got {at}"

    # NVLink domain full too -> the fabric: h3 shares zone-a's spine; a1/a2 are in another zone.
    assert _run(cluster, _pod(filler, "alignment", pin=nodes["h2"], gpus=4, model_params="7B")) == nodes["h2"]
    at = _run(cluster, _pod(second, "alignment", depends=trainer, gb=100, gpus=8, model_params="7B"))
    assert at == nodes["h3"], f"expected the same fabric (h3), got {at}"

    detail = _explain(control_plane, cluster.namespace, second)
    per_node = {e["node"]: e.get("gravity") for e in detail["nodes"]}
    assert per_node[nodes["h3"]]["edges"][0]["distance"] == "fabric"
    assert per_node[nodes["a1"]]["edges"][0]["distance"] == "cross-zone"


def test_missing_producer_is_reported_not_fatal(
    cluster: ClusterScope,
    control_plane: ControlPlane,
    nodes: dict[str, str],
    unique: Callable[[str], str],
    clean: None,
) -> None:
    cp, ns = control_plane, cluster.namespace
    name, ghost = unique("orphan"), unique("ghost")
    missing_before = _edges(cp, "alignment", "missing")
    at = _run(cluster, _pod(name, "alignment", depends=ghost, gb=50, gpus=4, model_params="7B"))
    assert at in nodes.values()
    msg = wait_for_event(cluster.core, ns, name, "ProducerNotFound", ghost, timeout=30)
    assert msg.startswith("llm-placement: ") and "not found" in msg
    assert _edges(cp, "alignment", "missing") == missing_before + 1
    detail = _explain(cp, ns, name)
    assert any(f"{ns}/{ghost} not found" in note for note in detail["gravity"]["notes"])


def test_required_colocation_waits_for_its_producer_then_follows_it(
    cluster: ClusterScope,
    control_plane: ControlPlane,
    nodes: dict[str, str],
    unique: Callable[[str], str],
    clean: None,
) -> None:
    ns = cluster.namespace
    consumer, producer = unique("follower"), unique("leader")
    create_pod(
        cluster.core,
        ns,
        _pod(
            consumer,
            "alignment",
            depends=producer,
            gb=20,
            gpus=4,
            model_params="7B",
            annotations={ANN + "colocation": "nvlink"},
        ),
    )
    deadline = time.monotonic() + 60
    want = f"producer {ns}/{producer} not found; colocation required"
    while not any(want in m for m in scheduling_messages(cluster.core, ns, consumer)):
        assert time.monotonic() < deadline, f"no FailedScheduling with {want!r}"
        time.sleep(0.5)
    assert not cluster.core.read_namespaced_pod(consumer, ns).spec.node_name

    # The producer appears on h3; the consumer may only join it in h3's NVLink domain (h3 itself).
    assert (
        _run(cluster, _pod(producer, "alignment", pin=nodes["h3"], gpus=4, model_params="7B")) == nodes["h3"]
    )
    at = wait_for_node_name(cluster.core, ns, consumer, timeout=120)
    assert at == nodes["h3"]
