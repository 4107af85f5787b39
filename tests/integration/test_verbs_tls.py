"""The verbs over TLS on the real control plane (docs/security.md): kube-scheduler, configured with
the extender's CA and its own client certificate, reaches the extender and places pods; a client
without that certificate (a tenant's pod that can reach the port) is refused for filter and bind
before anything is read, and a certificate of another CA fails the handshake."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kubeharness import ControlPlane, create_pod, get_pod, gpu_node, llm_pod, wait_for_node_name
from kubeharness.pki import SERVICE_DNS, VerbsPKI, make_verbs_pki
from kubeharness.schedconfig import with_verbs_tls

from .conftest import ClusterScope

pytestmark = pytest.mark.integration


# The two chart modes' stanzas: the sidecar's (https://127.0.0.1, no serverName) and the
# default-scheduler mode's (managedResources, the Service's DNS name as serverName).
MODES = {
    "scheduler": {},
    "default-scheduler": {"managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]},
}


@pytest.fixture(scope="module", params=list(MODES))
def tls(request: pytest.FixtureRequest, control_plane: ControlPlane, cluster: ClusterScope) -> Iterator[VerbsPKI]:
    pki = make_verbs_pki(control_plane.workdir / f"verbs-pki-{request.param}")
    env = {"LLMP_TLS_CERT_FILE": str(pki.serving.cert), "LLMP_TLS_KEY_FILE": str(pki.serving.key),
           "LLMP_TLS_CLIENT_CA_FILE": str(pki.ca.cert)}
    with control_plane.extender_settings(env):
        ext = {**control_plane.scheduler_config()["extenders"][0], **MODES[request.param]}
        server_name = SERVICE_DNS if request.param == "default-scheduler" else None
        control_plane.restart_scheduler(overrides={"extenders": [
            with_verbs_tls(ext, pki.scheduler.cert, pki.scheduler.key, pki.ca.cert, server_name)]})
        try:
            yield pki
        finally:
            control_plane.restart_scheduler()


def _client(pki: VerbsPKI, cert: tuple[Path, Path] | None) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return httpx.Client(verify=ctx, timeout=10)


def _forged(stored: dict[str, Any], node: str) -> dict[str, dict[str, Any]]:
    meta = stored["metadata"]
    return {"filter": {"Pod": stored, "Nodes": None, "NodeNames": [node]},
            "bind": {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                     "Node": node}}


def test_kube_scheduler_with_its_certificate_places_pods(
        cluster: ClusterScope, control_plane: ControlPlane, tls: VerbsPKI, unique: Callable[[str], str]) -> None:
    assert control_plane.extender_url.startswith("https://")
    [node] = cluster.add_nodes([gpu_node(cluster.node_name(unique("tls-l4")), "L4", gpus=4, index=30)])
    name = unique("tls")
    try:
        create_pod(cluster.core, cluster.namespace,
                   llm_pod(name, stage="serving", model_params="7B", precision="int8", gpus=1))
        assert wait_for_node_name(cluster.core, cluster.namespace, name) == node
    finally:
        cluster.core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0)
        cluster.remove_nodes([node])


def test_a_client_without_the_certificate_is_refused_for_filter_and_bind(
        cluster: ClusterScope, control_plane: ControlPlane, tls: VerbsPKI, unique: Callable[[str], str]) -> None:
    # The forged sequence of a tenant that can reach the port: its own pod, pinned to a tainted node
    # kube-scheduler will not use, then filter and bind by hand.
    [node] = cluster.add_nodes([gpu_node(cluster.node_name(unique("tls-tainted")), "L4", gpus=4, index=31)])
    sentinel = cluster.node_name(unique("tls-sentinel"))
    # The harness creates nodes untainted: taint it, then flush the extender's node watch with a
    # later node (events arrive in order on one watch).
    cluster.core.patch_node(node, {"spec": {"taints": [
        {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}})
    cluster.add_nodes([gpu_node(sentinel, "T4", gpus=0, index=32)])
    try:
        _forge(cluster, control_plane, tls, unique, node)
    finally:
        cluster.remove_nodes([node, sentinel])


def _forge(cluster: ClusterScope, control_plane: ControlPlane, tls: VerbsPKI, unique: Callable[[str], str],
           node: str) -> None:
    name = unique("tls-forged")
    pod = llm_pod(name, stage="serving", model_params="7B", precision="int8", gpus=1)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    stored = create_pod(cluster.core, cluster.namespace, pod)
    calls = _forged(stored, node)
    with _client(tls, None) as c:
        for verb, body in calls.items():
            r = c.post(f"{control_plane.extender_url}/{verb}", json=body)
            assert r.status_code == 403, (verb, r.status_code, r.text)
    with _client(tls, (tls.stranger.cert, tls.stranger.key)) as c:
        for verb, body in calls.items():
            with pytest.raises(httpx.HTTPError):  # another CA's certificate: the handshake fails
                c.post(f"{control_plane.extender_url}/{verb}", json=body)
    for verb, body in calls.items():  # plain HTTP is not spoken at all
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{control_plane.ports.extender}/scheduler/{verb}", json=body,
                       timeout=10)
    assert not get_pod(cluster.core, cluster.namespace, name)["spec"].get("nodeName")
    # Even with kube-scheduler's own certificate the node rules refuse this bind (defence in depth).
    with _client(tls, (tls.scheduler.cert, tls.scheduler.key)) as c:
        assert c.post(f"{control_plane.extender_url}/filter", json=calls["filter"]).status_code == 200
        err = c.post(f"{control_plane.extender_url}/bind", json=calls["bind"]).json()["Error"]
    assert "has taint dedicated=infra:NoSchedule" in err
    assert not get_pod(cluster.core, cluster.namespace, name)["spec"].get("nodeName")
    cluster.core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0)
