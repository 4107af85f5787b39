"""What a kubelet checks of a pod's ResourceClaims before it starts the pod, asserted on the API.

No kubelet runs in the harness, so nothing would ever refuse a pod bound with a claim it may not
use. A kubelet admits a pod only if each of its claims is allocated and lists the pod in
``status.reservedFor``; the devices must be on the pod's node. This asserts exactly that for every
bound pod of a namespace that names claims (by ``resourceClaimName``, through its template's claim
in ``status.resourceClaimStatuses``, or the claim kube-scheduler made for a DeviceClass's extended
resource in ``status.extendedResourceClaimStatus``).
"""

from __future__ import annotations

from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi

from .objects import list_pods
from .rawapi import items

GROUP, VERSION = "resource.k8s.io", "v1"


def pod_claims(pod: dict[str, Any]) -> list[str]:
    """Names of the ResourceClaims a pod uses."""
    status = pod.get("status") or {}
    generated = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()}
    names = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
        name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
        if name:
            names.append(name)
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        names.append(extended)
    return names


def admission_problems(core: CoreV1Api, custom: CustomObjectsApi, namespace: str,
                       pool_node: dict[str, str] | None = None) -> list[str]:
    """Why a kubelet would refuse each bound pod of ``namespace`` (empty: it would admit them all).

    ``pool_node``: node of each device pool where pools are not named after their node."""
    claims = {c["metadata"]["name"]: c for c in
              items(custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims"),
                    "resourceclaims")}
    out = []
    for pod in list_pods(core, namespace):
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        for claim_name in pod_claims(pod):
            claim = claims.get(claim_name)
            status = (claim or {}).get("status") or {}
            alloc = status.get("allocation")
            if claim is None:
                out.append(f"{name} on {node}: claim {claim_name} does not exist")
            elif not alloc:
                out.append(f"{name} on {node}: claim {claim_name} is not allocated")
            elif not any(r.get("uid") == uid for r in status.get("reservedFor") or ()):
                out.append(f"{name} on {node}: claim {claim_name} is not reserved for it "
                           f"(reservedFor {[r.get('name') for r in status.get('reservedFor') or ()]})")
            else:
                pools = {r.get("pool") for r in (alloc.get("devices") or {}).get("results") or ()}
                nodes = {(pool_node or {}).get(p, p) for p in pools}
                if nodes - {node}:
                    out.append(f"{name} on {node}: claim {claim_name} holds devices of {sorted(nodes)}")
    return out
