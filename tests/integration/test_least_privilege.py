"""Least privilege, asked of the real API server's RBAC authorizer (SubjectAccessReview).

The extender's identity holds exactly the chart's ClusterRole (helm/llm-placement/files/
extender-rbac-rules.yaml, bound by the harness as the chart binds it); kube-scheduler's identity
holds the built-in roles the chart binds for a secondary scheduler (templates/rbac-scheduler.yaml).
Each call either makes must be allowed, and a representative set of what neither may do must be
denied. ``EXTENDER_USES`` lists every API call in app/ (where it is made); a write the file grants
that no call makes fails ``test_the_chart_grants_the_extender_no_write_it_does_not_make`` (reads of
the objects it lists are granted as the usual get/list/watch trio).

What a grant implies (README, "What it guarantees"): ``pods patch`` is cluster-wide and RBAC cannot
limit it to fields; the extender only ever sends a merge patch of ``metadata.annotations``
(app/cluster/binder.py ``annotate``), and the chart's ValidatingAdmissionPolicy
(files/pod-patch-policy.yaml) denies its identity any other change to a pod: checked here with the
same file on the real API server, while the extender still plans and binds a gang under it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from kubeharness import (
    EXTENDER_USER,
    ControlPlane,
    create_pod,
    create_pods,
    gpu_node,
    llm_pod,
    wait_for_node_names,
    wait_until,
)
from kubeharness.schedconfig import CHART_FILES

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

SCHEDULER_USER = "system:kube-scheduler"
POLICY_FILE = CHART_FILES / "pod-patch-policy.yaml"
ANN = "llm-placement.io/"

# (apiGroup, resource, verb, where in app/ the extender makes that call)
EXTENDER_USES = [
    ("", "nodes", "list", "app/cluster/cache.py: node cache"),
    ("", "nodes", "watch", "app/cluster/cache.py: node cache"),
    ("", "pods", "list", "app/cluster/cache.py, app/gang/kube.py: pod cache, plan restore"),
    ("", "pods", "watch", "app/cluster/cache.py: pod cache"),
    ("", "pods", "get", "app/cluster/binder.py read_pod: the bind gate's UID check"),
    ("", "pods", "patch", "app/cluster/binder.py annotate: gang-plan and assigned-precision annotations"),
    ("", "pods/binding", "create", "app/cluster/binder.py bind: the extender is the binder"),
    ("", "namespaces", "list", "app/cluster/cache.py: share-with opt-in (docs/data-gravity.md)"),
    ("", "namespaces", "watch", "app/cluster/cache.py"),
    ("", "events", "create", "app/cluster/binder.py event: Placed, Gang*, UnknownAnnotation"),
    ("scheduling.x-k8s.io", "podgroups", "list", "app/gang/kube.py: coscheduling minMember"),
    ("scheduling.x-k8s.io", "podgroups", "watch", "app/gang/kube.py"),
    ("scheduling.volcano.sh", "podgroups", "list", "app/gang/kube.py: Volcano minMember"),
    ("scheduling.volcano.sh", "podgroups", "watch", "app/gang/kube.py"),
    ("scheduling.k8s.io", "podgroups", "list", "app/gang/kube.py: native Workload API minCount"),
    ("scheduling.k8s.io", "podgroups", "watch", "app/gang/kube.py"),
    ("authentication.k8s.io", "tokenreviews", "create", "app/api/access.py: explain's caller"),
    ("authorization.k8s.io", "subjectaccessreviews", "create", "app/api/access.py: may the caller get the pod"),
    *[("resource.k8s.io", res, v, "app/cluster/dra.py: GPUs through DRA (docs/dra.md)")
      for res in ("resourceslices", "resourceclaims", "resourceclaimtemplates", "deviceclasses",
                  "devicetaintrules")
      for v in ("list", "watch")],
    *[("resource.nvidia.com", res, v, "app/cluster/dra.py: NVLink cliques of ComputeDomains (docs/dra.md)")
      for res in ("computedomaincliques", "computedomains") for v in ("list", "watch")],
]
READ = {"get", "list", "watch"}

# (apiGroup, resource, verb, namespace): what the extender must not be able to do.
EXTENDER_DENIED = [
    ("", "secrets", "get", "kube-system"),
    ("", "secrets", "list", ""),
    ("", "configmaps", "get", "kube-system"),
    ("", "pods", "delete", "default"),
    ("", "pods", "create", "default"),
    ("", "pods", "update", "default"),
    ("", "pods/status", "patch", "default"),
    ("", "pods/exec", "create", "default"),
    ("", "pods/eviction", "create", "default"),
    ("", "nodes", "update", ""),
    ("", "nodes", "patch", ""),
    ("", "nodes", "delete", ""),
    ("", "nodes/proxy", "get", ""),
    ("", "serviceaccounts/token", "create", "kube-system"),
    ("", "events", "delete", "default"),
    ("", "namespaces", "patch", ""),
    ("coordination.k8s.io", "leases", "update", "kube-system"),
    ("rbac.authorization.k8s.io", "clusterroles", "escalate", ""),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "create", ""),
    ("resource.k8s.io", "resourceclaims", "update", "default"),
    ("scheduling.k8s.io", "podgroups", "update", "default"),
]

# What kube-scheduler itself calls (the built-in system:kube-scheduler role the chart binds).
SCHEDULER_USES = [
    ("", "pods", "list", ""), ("", "pods", "watch", ""), ("", "nodes", "list", ""),
    ("", "nodes", "watch", ""), ("", "pods/binding", "create", "default"),
    ("", "pods/status", "patch", "default"),  # the PodScheduled=False condition
    ("", "pods", "delete", "default"),  # preemption evicts victims
    ("events.k8s.io", "events", "create", "default"),
    ("coordination.k8s.io", "leases", "create", "kube-system"),  # leader election
]
SCHEDULER_DENIED = [
    ("", "secrets", "get", "kube-system"), ("", "secrets", "list", ""), ("", "nodes", "update", ""),
    ("", "nodes", "delete", ""), ("", "pods/exec", "create", "default"),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "create", ""),
]


def _allowed(cp: ControlPlane, user: str, group: str, resource: str, verb: str, namespace: str) -> bool:
    res, _, sub = resource.partition("/")
    attrs = {"group": group, "resource": res, "verb": verb}
    if sub:
        attrs["subresource"] = sub
    if namespace:
        attrs["namespace"] = namespace
    review = kubernetes.client.AuthorizationV1Api(cp.api).create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": attrs}})
    return bool(review.status.allowed)


def test_extender_may_make_every_call_it_makes_in_any_namespace(control_plane: ControlPlane) -> None:
    missing = [(g, r, v, why) for g, r, v, why in EXTENDER_USES
               for ns in ("", "default", "tenant-a")
               if not (r in ("nodes", "namespaces", "deviceclasses", "resourceslices", "devicetaintrules",
                             "tokenreviews",
                             "subjectaccessreviews") and ns)
               and not _allowed(control_plane, EXTENDER_USER, g, r, v, ns)]
    assert not missing, f"denied although app/ needs it: {missing}"


def test_extender_is_denied_everything_else_checked(control_plane: ControlPlane) -> None:
    granted = [(g, r, v, ns) for g, r, v, ns in EXTENDER_DENIED
               if _allowed(control_plane, EXTENDER_USER, g, r, v, ns)]
    assert not granted, f"the extender may do more than it needs: {granted}"


def test_the_chart_grants_the_extender_no_write_it_does_not_make(control_plane: ControlPlane) -> None:
    used = {(g, r, v) for g, r, v, _ in EXTENDER_USES}
    listed = {(g, r) for g, r, _ in used}
    granted = {(g, r, v) for rule in control_plane.rbac_rules for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    extra = sorted(t for t in granted - used if t[2] not in READ or t[:2] not in listed)
    assert not extra, f"granted but no call in app/ makes it: {extra}"


def test_scheduler_identity_has_what_kube_scheduler_needs_and_not_more(control_plane: ControlPlane) -> None:
    missing = [t for t in SCHEDULER_USES if not _allowed(control_plane, SCHEDULER_USER, *t)]
    assert not missing, missing
    granted = [t for t in SCHEDULER_DENIED if _allowed(control_plane, SCHEDULER_USER, *t)]
    assert not granted, granted


# --- pods patch narrowed to llm-placement.io/ annotations (helm/llm-placement/files/pod-patch-policy.yaml)
POLICY = "llm-placement-it-pod-patch"


@pytest.fixture(scope="module")
def pod_patch_policy(control_plane: ControlPlane) -> Iterator[None]:
    """The chart's ValidatingAdmissionPolicy, matched to the harness's extender identity."""
    spec = yaml.safe_load(POLICY_FILE.read_text())
    spec["matchConditions"] = [{"name": "llm-placement-identity",
                                "expression": f"request.userInfo.username == '{EXTENDER_USER}'"}]
    adm = kubernetes.client.AdmissionregistrationV1Api(control_plane.api)
    adm.create_validating_admission_policy({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY}, "spec": spec})
    adm.create_validating_admission_policy_binding({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY}, "spec": {"policyName": POLICY, "validationActions": ["Deny"]}})
    try:
        yield
    finally:
        adm.delete_validating_admission_policy_binding(POLICY)
        adm.delete_validating_admission_policy(POLICY)


def _extender_core(cp: ControlPlane) -> kubernetes.client.CoreV1Api:
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(cp.extender_kubeconfig), client_configuration=cfg)
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))


def _patch_status(core: kubernetes.client.CoreV1Api, ns: str, name: str, body: dict[str, Any]) -> int:
    # Strategic merge: containers merge by name, so an image change is a valid pod update that only
    # the policy can refuse (a merge patch would replace the list and fail validation anyway).
    try:
        core.patch_namespaced_pod(name, ns, body, _content_type="application/strategic-merge-patch+json",
                                  _preload_content=False)
        return 200
    except ApiException as exc:
        return int(exc.status)


def test_the_extender_may_patch_only_its_own_annotations_of_a_pod(
    cluster: ClusterScope, pod_patch_policy: None, unique: Callable[[str], str]
) -> None:
    core, ns = cluster.core, cluster.namespace
    name = unique("victim")
    create_pod(core, ns, llm_pod(name, scheduler_name="nobody-runs-this-scheduler"))
    ext = _extender_core(cluster.cp)
    image = {"spec": {"containers": [{"name": "main", "image": "registry.invalid/other:latest"}]}}
    tries = iter(range(10_000))
    # The policy takes effect asynchronously (the API server's policy informer); each try is a real
    # change (a patch that changes nothing passes any policy).
    wait_until(lambda: _patch_status(ext, ns, name, {"metadata": {"labels": {"try": str(next(tries))}}})
               in (403, 422), 30, "the pod-patch policy to deny a label change by the extender")
    label = {"metadata": {"labels": {"app": "changed"}}}
    assert _patch_status(ext, ns, name, image) in (403, 422)
    assert _patch_status(ext, ns, name, {"metadata": {"annotations": {"other.io/x": "1"}}}) in (403, 422)
    assert _patch_status(ext, ns, name, {"metadata": {"annotations": {ANN + "gang-plan": ""}}}) == 200
    # Everyone else is untouched by the policy: the admin changes the label.
    assert _patch_status(core, ns, name, label) == 200
    assert _patch_status(core, ns, name, image) == 200
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_gangs_are_planned_and_bound_under_the_pod_patch_policy(
    cluster: ClusterScope, pod_patch_policy: None, unique: Callable[[str], str]
) -> None:
    """The extender's own writes (the gang-plan annotation) pass the policy it ships with."""
    core, ns = cluster.core, cluster.namespace
    cluster.add_nodes([gpu_node(cluster.node_name(f"vap-{i}"), "H100", gpus=8, rdma=True, index=i)
                       for i in range(2)])
    group = unique("vap-gang")
    names = [f"{group}-{i}" for i in range(2)]
    create_pods(core, ns, [llm_pod(n, stage="pretraining", gpus=8,
                                   annotations={ANN + "gang-size": "2"},
                                   labels={"scheduling.x-k8s.io/pod-group": group}) for n in names])
    bound = wait_for_node_names(core, ns, names, timeout=120)
    assert len(set(bound.values())) == 2
    for n in names:
        core.delete_namespaced_pod(n, ns, grace_period_seconds=0)
