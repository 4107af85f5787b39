"""Bearer tokens of ServiceAccounts with chosen read rights, for the explain authorization tests."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes.client import ApiClient, AuthenticationV1TokenRequest, CoreV1Api, RbacAuthorizationV1Api
from kubernetes.client.rest import ApiException

from .rawapi import call


def create_or_keep(fn: Callable[..., object], *args: object) -> None:
    """Call a create_* method (its body a JSON object); an object already there (409) is kept."""
    try:
        fn(*args)
    except ApiException as exc:
        if exc.status != 409:  # already there from an earlier test: fine
            raise


def token_of(req: AuthenticationV1TokenRequest) -> str:
    """The token a TokenRequest's answer carries (the API server always fills its status)."""
    if req.status is None or not req.status.token:
        raise RuntimeError("the API server answered a TokenRequest without a token")
    return str(req.status.token)


def pod_reader_token(api: ApiClient, namespace: str, name: str, cluster_wide: bool = False) -> str:
    """A token for ServiceAccount ``namespace/name`` that may get pods in its namespace (or all)."""
    core, rbac = CoreV1Api(api), RbacAuthorizationV1Api(api)
    create_or_keep(core.create_namespaced_service_account, namespace,
            {"metadata": {"name": name}})
    rule = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    if cluster_wide:
        role = f"{namespace}-{name}-pod-reader"
        create_or_keep(rbac.create_cluster_role, {"metadata": {"name": role}, "rules": rule})
        create_or_keep(rbac.create_cluster_role_binding, {
            "metadata": {"name": role}, "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}})
    else:
        create_or_keep(rbac.create_namespaced_role, namespace, {"metadata": {"name": f"{name}-pod-reader"}, "rules": rule})
        create_or_keep(rbac.create_namespaced_role_binding, namespace, {
            "metadata": {"name": f"{name}-pod-reader"}, "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-pod-reader"}})
    return token_of(call(core.create_namespaced_service_account_token,
                         name, namespace, {"spec": {"expirationSeconds": 3600}}))


def metrics_reader_token(api: ApiClient, namespace: str, name: str) -> str:
    """A token for ServiceAccount ``namespace/name`` that may read ``/metrics`` (non-resource URL):
    what a controller-runtime manager's secure metrics endpoint checks (TokenReview + SubjectAccessReview)."""
    core, rbac = CoreV1Api(api), RbacAuthorizationV1Api(api)
    create_or_keep(core.create_namespaced_service_account, namespace, {"metadata": {"name": name}})
    role = f"{namespace}-{name}-metrics-reader"
    create_or_keep(rbac.create_cluster_role, {"metadata": {"name": role},
                                       "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
    create_or_keep(rbac.create_cluster_role_binding, {
        "metadata": {"name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}})
    return token_of(call(core.create_namespaced_service_account_token,
                         name, namespace, {"spec": {"expirationSeconds": 7200}}))
