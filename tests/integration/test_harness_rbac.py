"""The extender runs with exactly the chart's RBAC rules, through its own client certificate.

This is what makes a missing permission fail the suite: the extender's kubeconfig is not an admin's.
"""

from __future__ import annotations

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from kubeharness import EXTENDER_USER, ControlPlane

pytestmark = pytest.mark.integration


def _extender_core(cp: ControlPlane) -> kubernetes.client.CoreV1Api:
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(cp.extender_kubeconfig), client_configuration=cfg)
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))


def test_extender_identity_has_the_chart_rules_and_nothing_more(control_plane: ControlPlane) -> None:
    core = _extender_core(control_plane)
    core.list_node(_preload_content=False)  # granted by the chart: the node cache needs it
    with pytest.raises(ApiException) as err:
        # Authorization comes before the lookup: 403 if forbidden, 404 had it been allowed.
        core.delete_node("no-such-node", _preload_content=False)
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        core.list_secret_for_all_namespaces(_preload_content=False)
    assert err.value.status == 403
    binding = control_plane.rbac.read_cluster_role_binding("llm-placement-extender")
    assert [s.name for s in binding.subjects] == [EXTENDER_USER]
    role = control_plane.rbac.read_cluster_role("llm-placement-extender")
    assert len(role.rules) == len(control_plane.rbac_rules)


def test_scheduler_runs_the_chart_config_with_local_overrides_only(control_plane: ControlPlane) -> None:
    chart = control_plane.chart_scheduler_config
    local = control_plane.scheduler_config()
    assert local["profiles"] == chart["profiles"]
    assert local.get("percentageOfNodesToScore") == chart.get("percentageOfNodesToScore")
    (ext,), (chart_ext,) = local["extenders"], chart["extenders"]
    assert {k: v for k, v in ext.items() if k != "urlPrefix"} == {
        k: v for k, v in chart_ext.items() if k != "urlPrefix"
    }
    assert ext["urlPrefix"] == control_plane.extender_url
    assert local["leaderElection"]["leaderElect"] is False
