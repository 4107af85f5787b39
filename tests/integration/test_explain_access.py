"""/explain answers only callers the API server lets read the pod (TokenReview + SubjectAccessReview)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from kubeharness import ControlPlane, create_pod, ensure_namespace, gpu_node, llm_pod, wait_for_node_name
from kubeharness.tokens import pod_reader_token

from .conftest import ClusterScope

pytestmark = pytest.mark.integration


def _explain(cp: ControlPlane, ns: str, name: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.get(f"{cp.extender_base}/explain/{ns}/{name}", headers=headers, timeout=15)


def test_explain_needs_read_access_to_the_pod(
    cluster: ClusterScope, control_plane: ControlPlane, unique: Callable[[str], str]
) -> None:
    cluster.add_nodes([gpu_node(cluster.node_name("l4"), "L4", gpus=4, index=90)])
    name = unique("chat")
    create_pod(cluster.core, cluster.namespace,
               llm_pod(name, stage="serving", model_params="7B", precision="int8", gpus=1))
    node = wait_for_node_name(cluster.core, cluster.namespace, name)
    other_ns = cluster.namespace + "-b"
    ensure_namespace(cluster.core, other_ns)
    own = pod_reader_token(control_plane.api, cluster.namespace, "reader")
    stranger = pod_reader_token(control_plane.api, other_ns, "reader")

    allowed = _explain(control_plane, cluster.namespace, name, own)
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["bound_node"] == node
    denied = _explain(control_plane, cluster.namespace, name, stranger)
    assert denied.status_code == 403
    assert f"may not get pod {cluster.namespace}/{name}" in denied.text
    assert node not in denied.text  # nothing about the placement leaks
    assert _explain(control_plane, cluster.namespace, name, None).status_code == 401
    assert _explain(control_plane, cluster.namespace, name, "not-a-token").status_code == 401
