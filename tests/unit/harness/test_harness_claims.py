"""The integration harness's kubelet claim check (kubeharness/claims.py) refuses what a
kubelet refuses: claims missing, not allocated, not reserved for the pod, or on another node."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from kubeharness.claims import admission_problems, pod_claims


def _pod(name: str, node: str, claims: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"u-{name}"},
            "spec": {"nodeName": node, "resourceClaims": [{"name": ref} for ref in claims]},
            "status": {"resourceClaimStatuses": [{"name": r, "resourceClaimName": c} for r, c in claims.items()]}}


def _claim(name: str, node: str | None, reserved: list[str]) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if node is not None:
        status["allocation"] = {"devices": {"results": [{"pool": node, "device": "gpu-0"}]}}
    status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"u-{p}"} for p in reserved]
    return {"metadata": {"name": name}, "status": status}


class _Core:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def list_namespaced_pod(self, ns: str, **kw: Any) -> Any:
        return SimpleNamespace(data=json.dumps({"items": self.pods}).encode())


class _Custom:
    def __init__(self, claims: list[dict[str, Any]]) -> None:
        self.claims = claims

    def list_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        return {"items": self.claims}


def test_claims_of_a_pod_by_name_template_and_extended_resource() -> None:
    pod = _pod("p", "n", {"a": "p-a"})
    pod["spec"]["resourceClaims"].append({"name": "b", "resourceClaimName": "shared"})
    pod["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "p-extended"}
    assert pod_claims(pod) == ["p-a", "shared", "p-extended"]


def test_every_refusal_a_kubelet_would_make_is_named() -> None:
    pods = [_pod("ok", "n1", {"g": "c-ok"}), _pod("unreserved", "n1", {"g": "c-unreserved"}),
            _pod("elsewhere", "n1", {"g": "c-elsewhere"}), _pod("unallocated", "n1", {"g": "c-none"}),
            _pod("missing", "n1", {"g": "c-missing"}), _pod("pending", "", {"g": "c-none"})]
    claims = [_claim("c-ok", "n1", ["ok"]), _claim("c-unreserved", "n1", ["other"]),
              _claim("c-elsewhere", "n2", ["elsewhere"]), _claim("c-none", None, [])]
    got = admission_problems(_Core(pods), _Custom(claims), "ns")  # type: ignore[arg-type]
    assert [p.split(":")[0] for p in got] == ["unreserved on n1", "elsewhere on n1", "unallocated on n1",
                                             "missing on n1"], got
    assert "not reserved for it" in got[0] and "['n2']" in got[1] and "not allocated" in got[2]
