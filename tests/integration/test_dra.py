"""GPUs through Dynamic Resource Allocation on the real control plane (docs/dra.md).

ResourceSlices are created exactly as NVIDIA's DRA driver (``gpu.nvidia.com``) publishes them, one
pool per node; no driver process runs (there is no kubelet to prepare devices). Pods ask for GPUs
with ResourceClaims and ResourceClaimTemplates against the driver's DeviceClass; kube-scheduler's
DynamicResources plugin allocates devices and writes ``status.allocation`` in PreBind, and the
extender filters, prioritizes and binds. The assertions are where pods really land and what the
claims really hold.

Nothing runs kube-controller-manager (docs/control-plane.md), so what its resourceclaim controller
does is done here by the test, the same way: the claim of a template is created with the pod as its
controlling owner and named in the pod's ``status.resourceClaimStatuses``; at the end the finalizer
kube-scheduler puts on allocated claims is removed before the claims are deleted.

Every pod selects its group of nodes by label, so tests in this module cannot take each other's
devices. DRA nodes carry no GPU label and no ``nvidia.com/gpu`` allocatable: whatever the extender
knows about their GPUs comes from the slices.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi
from kubernetes.client.rest import ApiException

from kubeharness import (
    assert_stays_unbound,
    cpu_node,
    create_pod,
    delete_all_pods,
    get_pod,
    gpu_node,
    list_nodes,
    llm_pod,
    scheduling_messages,
    wait_for_node_name,
    wait_until,
)
from kubeharness.claims import admission_problems
from kubeharness.objects import bare_node
from kubeharness.slowwrite import slow_status_writes

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

GROUP, VERSION = "resource.k8s.io", "v1"
DRIVER = "gpu.nvidia.com"
CLASS = "gpu.nvidia.com"  # the DeviceClass the driver's Helm chart installs
SET = "llm-placement.io/it-group"  # which nodes a test's pods may use
TIER0 = "fabric.topograph.run/tier-0"
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"


# What the driver publishes per GPU model: productName, architecture, compute capability and the
# memory capacity in MiB as nvidia-smi reports it.
MODELS: dict[str, tuple[str, str, str, str]] = {
    "H100": ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "81559Mi"),
    "L4": ("NVIDIA L4", "Ada Lovelace", "8.9.0", "23034Mi"),
}
CATALOG_NAME = {"H100": "H100-SXM-80GB", "L4": "L4"}


def device(node: str, i: int, model: str) -> dict[str, Any]:
    """One full GPU as the driver's ResourceSlice lists it (resource.k8s.io/v1 device)."""
    product, arch, cc, memory = MODELS[model]
    return {
        "name": f"gpu-{i}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.{i}')}"},
            "productName": {"string": product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": arch},
            "cudaComputeCapability": {"version": cc},
            "driverVersion": {"version": "570.124.6"},
            "cudaDriverVersion": {"version": "12.8.0"},
            "pcieBusID": {"string": f"0000:{0x18 + i:02x}:00.0"},
            "index": {"int": i},
            "minor": {"int": i},
        },
        "capacity": {"memory": {"value": memory}},
    }


def resource_slice(node: str, model: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [device(node, i, model) for i in range(count)],
        },
    }


def device_class() -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": (
            f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'")}}]},
    }


def claim_spec(count: int | None) -> dict[str, Any]:
    """A request for ``count`` GPUs of the class; None: every matching device of the node (mode All)."""
    exactly: dict[str, Any] = {"deviceClassName": CLASS, "allocationMode": "All"} if count is None else \
        {"deviceClassName": CLASS, "allocationMode": "ExactCount", "count": count}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


class Dra:
    """The module's DRA objects: the DeviceClass, the slices, and each test's claims."""

    def __init__(self, cluster: ClusterScope) -> None:
        self.cluster = cluster
        self.api = CustomObjectsApi(cluster.cp.api)
        self.ns = cluster.namespace
        self.published: dict[str, int] = {}  # node -> devices its slice lists

    def create(self, plural: str, body: dict[str, Any], namespaced: bool = False) -> dict[str, Any]:
        if namespaced:
            out = self.api.create_namespaced_custom_object(GROUP, VERSION, self.ns, plural, body)
        else:
            out = self.api.create_cluster_custom_object(GROUP, VERSION, plural, body)
        return dict(out)

    def publish(self, node: str, model: str, count: int) -> None:
        self.create("resourceslices", resource_slice(node, model, count))
        self.published[node] = count

    def claims(self) -> list[dict[str, Any]]:
        out = self.api.list_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims")
        return list(out["items"])

    def claim(self, name: str, count: int) -> None:
        self.create("resourceclaims", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim",
                                       "metadata": {"name": name}, "spec": claim_spec(count)}, True)

    def template(self, name: str, count: int | None) -> None:
        self.create("resourceclaimtemplates", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name}, "spec": {"spec": claim_spec(count)}}, True)

    def claim_for_template(self, pod: dict[str, Any], template: str) -> str:
        """What kube-controller-manager's resourceclaim controller does for a pod's template entry.

        The claim is owned by the pod (kube-scheduler refuses a generated claim that is not) and its
        name is published in the pod's status, where kube-scheduler and the extender look it up.
        """
        pod_name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        tmpl = self.api.get_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaimtemplates", template)
        ref = "gpus"
        name = f"{pod_name}-{ref}"
        self.create("resourceclaims", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "annotations": {POD_CLAIM_NAME: ref},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": uid,
                                     "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": tmpl["spec"]["spec"],
        }, True)
        self.cluster.core.patch_namespaced_pod_status(
            pod_name, self.ns, {"status": {"resourceClaimStatuses": [{"name": ref, "resourceClaimName": name}]}})
        return name

    def allocated(self, claim: dict[str, Any]) -> list[tuple[str, str]]:
        """(pool, device) of every device the claim's allocation holds."""
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        return [(r["pool"], r["device"]) for r in results]

    def wait_allocated(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            c = self.api.get_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims", name)
            return dict(c) if (c.get("status") or {}).get("allocation") else None

        got: dict[str, Any] = wait_until(done, timeout, f"claim {name} allocated")
        return got

    def clean(self) -> None:
        """Delete the namespace's pods and claims (no controller deallocates them here), having
        checked first that a kubelet would have admitted every bound pod (harness/claims.py)."""
        refused = admission_problems(self.cluster.core, self.api, self.ns)
        delete_all_pods(self.cluster.core, self.ns)
        for plural in ("resourceclaims", "resourceclaimtemplates"):
            for obj in self.api.list_namespaced_custom_object(GROUP, VERSION, self.ns, plural)["items"]:
                name = obj["metadata"]["name"]
                if obj["metadata"].get("finalizers"):
                    self.api.patch_namespaced_custom_object(
                        GROUP, VERSION, self.ns, plural, name, {"metadata": {"finalizers": None}})
                try:
                    self.api.delete_namespaced_custom_object(GROUP, VERSION, self.ns, plural, name)
                except ApiException as exc:
                    if exc.status != 404:
                        raise

        def gone() -> bool:
            return not self.claims()

        wait_until(gone, 30, "claims deleted")
        assert not refused, f"a kubelet would refuse these pods: {refused}"

    def teardown(self) -> None:
        for name in list(self.published):
            try:
                self.api.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", f"{name}-{DRIVER}")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        try:
            self.api.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", CLASS)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _allocatable(cluster: ClusterScope, model: str) -> float:
    return cluster.cp.metric_value("llm_placement_allocatable_gpus", {"gpu": CATALOG_NAME[model]}) or 0.0


@pytest.fixture(scope="module")
def dra(cluster: ClusterScope) -> Iterator[Dra]:
    """DRA nodes (GPUs only in slices), GFD nodes (labels + nvidia.com/gpu) and a CPU node.

    Group ``main``: 8 x H100 and 8 x L4 by DRA, 8 x H100 and 8 x L4 by GFD, one CPU node.
    Group ``tight``: 2 + 1 L4 by DRA, for over-commit. Group ``whole``: 4 L4 by DRA. Group
    ``gang``: RDMA-capable H100 nodes by DRA, 8 GPUs under leaf a, 8 + 4 under leaf b.
    """
    n = cluster.node_name
    d = Dra(cluster)
    d.create("deviceclasses", device_class())
    try:
        d.publish(n("dra-h100"), "H100", 8)
        d.publish(n("dra-l4"), "L4", 8)
        d.publish(n("tight-0"), "L4", 2)
        d.publish(n("tight-1"), "L4", 1)
        d.publish(n("whole-0"), "L4", 4)
        gang_nodes = {n("gang-0"): ("a", 8), n("gang-1"): ("b", 8), n("gang-2"): ("b", 4)}
        for name, (_, count) in gang_nodes.items():
            d.publish(name, "H100", count)
        main, tight = {SET: "main"}, {SET: "tight"}
        cluster.add_nodes([
            bare_node(n("dra-h100"), labels=main, index=1),
            bare_node(n("dra-l4"), cpu="48", memory="192Gi", labels=main, index=2),
            gpu_node(n("gfd-h100"), "H100", gpus=8, labels=main, index=3),
            gpu_node(n("gfd-l4"), "L4", gpus=8, cpu="48", memory="192Gi", labels=main, index=4),
            cpu_node(n("cpu-0"), "cpu", cpu="64", memory="512Gi", labels=main, index=5),
            bare_node(n("tight-0"), cpu="48", memory="192Gi", labels=tight, index=6),
            bare_node(n("tight-1"), cpu="48", memory="192Gi", labels=tight, index=7),
            bare_node(n("whole-0"), cpu="48", memory="192Gi", labels={SET: "whole"}, index=8),
        ] + [bare_node(name, labels={SET: "gang", TIER0: n(f"leaf-{leaf}"),
                                     "feature.node.kubernetes.io/rdma.capable": "true"}, index=9 + i)
             for i, (name, (leaf, _)) in enumerate(gang_nodes.items())])
        # The extender's view of every GPU (slices included) is published with its cluster gauges;
        # 8 H100 by GFD + 8 + 20 by DRA, 8 L4 by GFD + 8 + 2 + 1 + 4 by DRA. Pods created before it
        # would be judged on a half-read cluster.
        wait_until(lambda: _allocatable(cluster, "H100") == 36 and _allocatable(cluster, "L4") == 23,
                   45, "the extender to count the GPUs of the slices")
        yield d
    finally:
        d.clean()
        d.teardown()


@pytest.fixture
def clean(dra: Dra) -> Iterator[Dra]:
    yield dra
    dra.clean()


def dra_pod(name: str, group: str, claim: str | None = None, template: str | None = None,
            prefer: str | None = None, **kw: Any) -> dict[str, Any]:
    """An llm_pod whose GPUs come from one claim (by name) or one template, in a node group."""
    pod = llm_pod(name, **kw)
    spec = pod["spec"]
    spec["nodeSelector"] = {SET: group}
    if claim or template:
        ref: dict[str, str] = {"name": "gpus"}
        if claim:
            ref["resourceClaimName"] = claim
        else:
            assert template
            ref["resourceClaimTemplateName"] = template
        spec["resourceClaims"] = [ref]
        spec["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    if prefer:
        # A soft preference for the wrong node, as a cost-minded user might write: kube-scheduler on
        # its own would follow it, so landing elsewhere is the extender's doing.
        spec["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [prefer]}]}}]}}
    return pod


def _templated(dra: Dra, pod: dict[str, Any], template: str) -> tuple[str, str]:
    created = create_pod(dra.cluster.core, dra.ns, pod)
    return created["metadata"]["name"], dra.claim_for_template(created, template)


def test_gpu_facts_from_slices_only_70b_lands_on_enough_memory(clean: Dra, unique: Callable[[str], str]) -> None:
    dra, cluster = clean, clean.cluster
    n = cluster.node_name
    for name in (n("dra-h100"), n("dra-l4")):
        node = next(x for x in list_nodes(cluster.core) if x["metadata"]["name"] == name)
        labels = node["metadata"].get("labels") or {}
        assert not any(k.startswith("nvidia.com/") for k in labels), labels
        assert "nvidia.com/gpu" not in node["status"]["allocatable"], node["status"]["allocatable"]
    # 70B at bf16 = 140 GB of weights on the 4 GPUs the template asks for: 4 x L4 hold 96 GB,
    # 4 x H100 hold 342 GB. Both DRA nodes have 8 free devices, so the DynamicResources plugin
    # passes both, and the pod prefers the L4 node.
    dra.template("gpu-x4", 4)
    name, claim = _templated(dra, dra_pod(unique("serve-70b"), "main", template="gpu-x4", prefer=n("dra-l4"),
                                          stage="serving", model_params="70B", precision="bf16"), "gpu-x4")
    assert wait_for_node_name(cluster.core, dra.ns, name) == n("dra-h100")
    devices = dra.allocated(dra.wait_allocated(claim))
    assert len(devices) == 4 and {pool for pool, _ in devices} == {n("dra-h100")}, devices
    # A data-prep pod is kept off GPU nodes; the DRA nodes are GPU nodes only through their slices.
    prep = unique("prep")
    create_pod(cluster.core, dra.ns, dra_pod(prep, "main", prefer=n("dra-l4"), stage="data-prep"))
    assert wait_for_node_name(cluster.core, dra.ns, prep) == n("cpu-0")


def test_claims_placed_by_bandwidth_and_price(clean: Dra, unique: Callable[[str], str]) -> None:
    dra, cluster = clean, clean.cluster
    n = cluster.node_name
    # 13B bf16 on 2 GPUs fits both (26 GB of weights; 2 x L4 = 48 GB), but at 20 ms/token only
    # HBM3 is fast enough: 26 GB / (2 x 0.3 TB/s x 0.6) = 72 ms on L4, ~6 ms on H100.
    dra.claim("fast", 2)
    fast = unique("serve-13b-fast")
    create_pod(cluster.core, dra.ns, dra_pod(fast, "main", claim="fast", prefer=n("dra-l4"), stage="serving",
                                             model_params="13B", precision="bf16", max_ms_per_token=20))
    assert wait_for_node_name(cluster.core, dra.ns, fast) == n("dra-h100")
    # A small interactive model meets the 50 ms/token default on both (1 GB read per token): the
    # cheapest node that meets it wins, the L4 one, against a preference for the H100 node.
    dra.claim("cheap", 1)
    cheap = unique("serve-1b")
    create_pod(cluster.core, dra.ns, dra_pod(cheap, "main", claim="cheap", prefer=n("dra-h100"), stage="serving",
                                             model_params="1B", precision="int8"))
    assert wait_for_node_name(cluster.core, dra.ns, cheap) == n("dra-l4")
    for claim, node, count in (("fast", "dra-h100", 2), ("cheap", "dra-l4", 1)):
        devices = dra.allocated(dra.wait_allocated(claim))
        assert len(devices) == count and {p for p, _ in devices} == {n(node)}, (claim, devices)


def test_mixed_gfd_and_dra_nodes(clean: Dra, unique: Callable[[str], str]) -> None:
    dra, cluster = clean, clean.cluster
    n = cluster.node_name
    # The same 70B serving pod twice: once asking for nvidia.com/gpu (only GFD nodes have it), once
    # through a claim (only DRA nodes publish devices). Each must land on its kind's H100 node, read
    # from labels in one case and from slices in the other, in one cluster.
    plain = unique("serve-70b-gfd")
    create_pod(cluster.core, dra.ns, dra_pod(plain, "main", prefer=n("gfd-l4"), stage="serving",
                                             model_params="70B", precision="bf16", gpus=4))
    dra.template("gpu-x4", 4)
    claimed, claim = _templated(dra, dra_pod(unique("serve-70b-dra"), "main", template="gpu-x4",
                                             prefer=n("dra-l4"), stage="serving", model_params="70B",
                                             precision="bf16"), "gpu-x4")
    assert wait_for_node_name(cluster.core, dra.ns, plain) == n("gfd-h100")
    assert wait_for_node_name(cluster.core, dra.ns, claimed) == n("dra-h100")
    assert {p for p, _ in dra.allocated(dra.wait_allocated(claim))} == {n("dra-h100")}


def _free_gpus(cluster: ClusterScope, node: str) -> float | None:
    # A node without an NVLink clique label is its own domain (docs/node-facts.md).
    return cluster.cp.metric_value("llm_placement_free_gpus", {"domain": f"node:{node}"})


def test_more_claims_than_devices_leaves_the_extra_pod_pending(clean: Dra, unique: Callable[[str], str]) -> None:
    dra, cluster = clean, clean.cluster
    n = cluster.node_name
    nodes = {n("tight-0"): 2, n("tight-1"): 1}
    names = []
    for i in range(4):
        dra.claim(f"one-{i}", 1)
        name = unique("serve-1g")
        create_pod(cluster.core, dra.ns, dra_pod(name, "tight", claim=f"one-{i}", stage="serving",
                                                 model_params="1B", precision="int8"))
        names.append(name)
    # Three devices for four pods: three are bound, one is not.
    def bound() -> dict[str, str] | None:
        pods = {x: get_pod(cluster.core, dra.ns, x)["spec"].get("nodeName") for x in names}
        return {k: v for k, v in pods.items() if v} if sum(1 for v in pods.values() if v) >= 3 else None

    placed: dict[str, str] = wait_until(bound, 90, "three of four claim pods bound")
    waiting = next(x for x in names if x not in placed)
    assert_stays_unbound(cluster.core, dra.ns, waiting, 8)
    assert Counter(placed.values()) == Counter(nodes), placed
    # No device is handed out twice, and no node gives more than its slice lists.
    held: list[tuple[str, str]] = []
    for c in dra.claims():
        held += dra.allocated(c)
    assert len(held) == len(set(held)) == 3, held
    for node, published in nodes.items():
        assert sum(1 for p, _ in held if p == node) <= published
    msgs = scheduling_messages(cluster.core, dra.ns, waiting)
    assert msgs and "cannot allocate all claims" in msgs[-1], msgs
    # The extender counts the claims' devices as used: no free GPU left on either node.
    wait_until(lambda: all(_free_gpus(cluster, x) == 0 for x in nodes), 30, f"no free GPU on {sorted(nodes)}")


def test_all_devices_claim_counts_what_was_allocated(clean: Dra, unique: Callable[[str], str]) -> None:
    dra, cluster = clean, clean.cluster
    node = cluster.node_name("whole-0")
    # allocationMode All: the claim asks for "at least one" and kube-scheduler hands it every
    # matching device of the node. The node is then full, whatever the template said.
    dra.template("every-gpu", None)
    name, claim = _templated(dra, dra_pod(unique("serve-all"), "whole", template="every-gpu", stage="serving",
                                          model_params="1B", precision="int8"), "every-gpu")
    assert wait_for_node_name(cluster.core, dra.ns, name) == node
    held = dra.allocated(dra.wait_allocated(claim))
    assert len(held) == dra.published[node] == 4, held
    # The extender's free-GPU gauge is refreshed every 10 s.
    wait_until(lambda: _free_gpus(cluster, node) == 0, 30, f"no free GPU on {node} in the extender's count")
    # A restarted extender lists pods, claims and classes afresh, in no particular order, and must
    # come to the same count (the claim is read from the name in the pod's status).
    cluster.cp.restart_extender()
    wait_until(lambda: _free_gpus(cluster, node) == 0, 40, f"no free GPU on {node} after a restart")


def test_dra_gang_is_placed_whole(clean: Dra, unique: Callable[[str], str]) -> None:
    dra, cluster = clean, clean.cluster
    n = cluster.node_name
    # Three pretraining members of 4 GPUs each, every one with its own claim from a template, that
    # must share one leaf switch: 12 GPUs. Leaf a has 8, leaf b has 8 + 4. kube-scheduler's plugin
    # judges each member alone (every node has 4 free devices); only a plan that counts the claims'
    # GPUs for the whole gang puts it under leaf b.
    dra.template("gang-x4", 4)
    group = unique("pt")
    members: dict[str, str] = {}
    for i in range(3):
        pod = dra_pod(f"{group}-{i}", "gang", template="gang-x4", stage="pretraining", model_params="1B",
                      annotations={"llm-placement.io/gang-size": "3", "llm-placement.io/topology-required-placement":
                                   TIER0}, labels={"scheduling.x-k8s.io/pod-group": group})
        name, claim = _templated(dra, pod, "gang-x4")
        members[name] = claim
    placed = {x: wait_for_node_name(cluster.core, dra.ns, x, timeout=90) for x in members}
    assert Counter(placed.values()) == Counter({n("gang-1"): 2, n("gang-2"): 1}), placed
    held: list[tuple[str, str]] = []
    for pod, claim in members.items():
        devices = dra.allocated(dra.wait_allocated(claim))
        # kube-scheduler allocated each member's devices on the node the gang plan bound it to.
        assert len(devices) == 4 and {p for p, _ in devices} == {placed[pod]}, (pod, devices)
        plan = json.loads(get_pod(cluster.core, dra.ns, pod)["metadata"]["annotations"][
            "llm-placement.io/gang-plan"])
        assert plan["node"] == placed[pod], plan
        held += devices
    assert len(set(held)) == 12


def test_dra_gang_members_reaching_bind_apart_keep_their_claims_reserved(
        clean: Dra, unique: Callable[[str], str]) -> None:
    """One member reaches bind 8 s after the others, longer than the bind barrier waits with no new
    member (gang_bind_timeout_seconds, 3 s): kube-scheduler's PreBind write of its claim's
    allocation is held by a slow API server (an admission webhook that waits). The gang was
    gathered (every member passed kube-scheduler's filters on its planned node), so the members
    already at bind are bound inside their open calls and the late one on arrival; nobody's call
    is answered with an error, so nobody's claim loses its reservation (docs/gangs.md, "Gangs with
    DRA claims"). What the kubelet checks at admission: every claim of the pod allocated on the
    pod's node and reserved for it. (The other late path, a member answered "place held" while
    others keep arriving, is covered by tests/unit/gang/test_gang_barrier.py.)"""
    dra, cluster = clean, clean.cluster
    assert cluster.cp.pki is not None
    n = cluster.node_name
    dra.template("gang-x4", 4)
    group = unique("late")
    late = f"{group}-2"
    members: dict[str, str] = {}
    with slow_status_writes(cluster.core.api_client, cluster.cp.pki, dra.ns, "resourceclaims",
                            {f"{late}-gpus"}, delay=8.0) as held:
        # The apiserver picks up webhook configurations from its own watch.
        time.sleep(2)
        for i in range(3):
            pod = dra_pod(f"{group}-{i}", "gang", template="gang-x4", stage="pretraining", model_params="1B",
                          annotations={"llm-placement.io/gang-size": "3",
                                       "llm-placement.io/topology-required-placement": TIER0},
                          labels={"scheduling.x-k8s.io/pod-group": group})
            name, claim = _templated(dra, pod, "gang-x4")
            members[name] = claim
        bound_at: dict[str, float] = {}

        def all_bound() -> bool:
            for name in members:
                if name not in bound_at and get_pod(cluster.core, dra.ns, name)["spec"].get("nodeName"):
                    bound_at[name] = time.monotonic()
            return len(bound_at) == len(members)

        wait_until(all_bound, 120, "every member of the gang bound", interval=0.2)
    assert [name for name, _ in held] == [f"{late}-gpus"], held
    early = max(t for name, t in bound_at.items() if name != late)
    # The others were bound while the late member's PreBind was still held, not 8 s later with it.
    assert bound_at[late] - early >= 4.0, bound_at
    placed = {x: get_pod(cluster.core, dra.ns, x)["spec"]["nodeName"] for x in members}
    assert Counter(placed.values()) == Counter({n("gang-1"): 2, n("gang-2"): 1}), placed
    for pod_name, claim_name in members.items():
        pod = get_pod(cluster.core, dra.ns, pod_name)
        uid = pod["metadata"]["uid"]

        # Read once, right after the bind: a bound pod is never retried, so nothing would add a
        # reservation afterwards; what is there now is what the kubelet admits the pod against.
        claim = dra.api.get_namespaced_custom_object(GROUP, VERSION, dra.ns, "resourceclaims", claim_name)
        status = claim.get("status") or {}
        assert status.get("allocation"), (pod_name, status)
        assert any(r.get("uid") == uid for r in status.get("reservedFor") or ()), (pod_name, status)
        devices = dra.allocated(claim)
        assert len(devices) == 4 and {p for p, _ in devices} == {placed[pod_name]}, (pod_name, devices)
        refs = claim["status"]["reservedFor"]
        assert [r["name"] for r in refs if r.get("resource") == "pods"] == [pod_name], refs


# DeviceClasses whose selectors pin no device type: a negated type, and a choice of two. kube-scheduler
# alone hands them a full GPU; the extender must not take them for MIG classes (docs/dra.md, "What is
# read from selectors").
UNPINNED_CLASSES = {
    "not-mig": f"device.driver == '{DRIVER}' && !(device.attributes['{DRIVER}'].type == 'mig')",
    "mig-or-gpu": (f"device.driver == '{DRIVER}' && (device.attributes['{DRIVER}'].type == 'mig' || "
                   f"device.attributes['{DRIVER}'].type == 'gpu')"),
}


@pytest.mark.parametrize("cls", sorted(UNPINNED_CLASSES))
def test_class_with_a_negated_or_alternative_type_lands_on_a_full_gpu(
        clean: Dra, unique: Callable[[str], str], cls: str) -> None:
    dra, cluster = clean, clean.cluster
    n = cluster.node_name
    name = f"{cls}-{uuid.uuid4().hex[:6]}"
    dra.create("deviceclasses", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceClass",
                                 "metadata": {"name": name},
                                 "spec": {"selectors": [{"cel": {"expression": UNPINNED_CLASSES[cls]}}]}})
    try:
        # The extender reads the class from its watch before the pod is filtered.
        time.sleep(1.0)
        dra.create("resourceclaims", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": name, "allocationMode": "ExactCount", "count": 1}}]}}}, True)
        pod = unique("unpinned")
        create_pod(cluster.core, dra.ns, dra_pod(pod, "main", claim=name, stage="serving",
                                                 model_params="1B", precision="int8"))
        node = wait_for_node_name(cluster.core, dra.ns, pod)
        assert node in (n("dra-h100"), n("dra-l4")), node
        devices = dra.allocated(dra.wait_allocated(name))
        assert len(devices) == 1 and devices[0][0] == node and devices[0][1].startswith("gpu-"), devices
    finally:
        dra.clean()
        dra.api.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", name)
