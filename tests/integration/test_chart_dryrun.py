"""The chart's rendered manifests, server-side dry-run applied against the real kube-apiserver.

`helm template` only proves the YAML renders; the API server proves it is valid Kubernetes: every
field known to its schema (strict field validation), RBAC roleRefs and PDB/Deployment invariants
accepted, admission passed. Dry-run (`dryRun=All`) persists nothing. Kinds whose CRDs the test
cluster lacks (ServiceMonitor, PrometheusRule) are skipped by name, and only those.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from kubeharness import ControlPlane, ensure_namespace, free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "llm-placement"
NAMESPACE = "llmp-chart-dryrun"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
FIELD_MANAGER = "llm-placement-chart-dryrun"


@pytest.fixture(scope="module")
def helm() -> Path:
    if shutil.which("go") is None:
        pytest.skip("helm cannot be built here: no Go toolchain on PATH")
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-helm.sh")], capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        pytest.fail(f"scripts/build-helm.sh failed:\n{proc.stderr[-4000:]}", pytrace=False)
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[ApiClient]:
    ensure_namespace(control_plane.core, NAMESPACE)
    ensure_namespace(control_plane.core, "llm-placement")  # the raw manifests' namespace
    yield control_plane.api


def render(helm: Path, *sets: str) -> list[dict[str, Any]]:
    args = [
        str(helm),
        "template",
        "llm-placement",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
        # The test API server is 1.36: the gang gate's MutatingAdmissionPolicy is rendered and checked.
        "--api-versions",
        "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
    ]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def dry_run_apply(api: ApiClient, doc: dict[str, Any]) -> dict[str, Any] | None:
    """Server-side apply with dryRun=All and strict field validation; None for an absent CRD kind."""
    dyn = DynamicClient(api)
    try:
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    except ResourceNotFoundError:
        if doc["kind"] in CRD_KINDS:
            return None
        raise
    ns = doc["metadata"].get("namespace") if res.namespaced else None
    if res.namespaced:
        assert ns, f"{doc['kind']} {doc['metadata']['name']} has no namespace"
    path = res.path(name=doc["metadata"]["name"], namespace=ns)
    # The dynamic client has no fieldValidation parameter; the plain ApiClient call carries it, so an
    # unknown or misspelt field is an error here instead of a warning header nobody reads.
    request = api.param_serialize(
        "PATCH",
        path,
        query_params=[
            ("dryRun", "All"),
            ("fieldManager", FIELD_MANAGER),
            ("fieldValidation", "Strict"),
            ("force", "true"),
        ],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=doc,
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(*request, _request_timeout=30)
    body = resp.read()
    if not 200 <= resp.status <= 299:
        raise ApiException(status=resp.status, reason=body.decode(errors="replace"))
    return json.loads(body)


def apply_all(api: ApiClient, docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], set[str]]:
    applied, skipped = [], set()
    errors = []
    for doc in docs:
        try:
            out = dry_run_apply(api, doc)
        except ApiException as exc:
            errors.append(f"{doc['kind']} {doc['metadata']['name']}: {exc.status} {exc.reason}")
            continue
        if out is None:
            skipped.add(doc["kind"])
            continue
        assert (out["kind"], out["metadata"]["name"]) == (doc["kind"], doc["metadata"]["name"])
        applied.append(out)
    assert not errors, "the API server rejected:\n" + "\n".join(errors)
    return applied, skipped


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["mode=default-scheduler"],
        [
            "replicas=3",
            "scheduler.name=gpu-placement",
            "scheduler.extender.weight=20",
            "extender.port=9999",
            "pdb.minAvailable=2",
            "priorityClassName=system-cluster-critical",
            "defaultScheduler.service.clusterIP=10.96.0.50",
        ],
        ["mode=default-scheduler", "defaultScheduler.service.clusterIP=10.96.0.50"],
    ],
    ids=["scheduler", "default-scheduler", "scheduler-non-default", "default-scheduler-pinned-ip"],
)
def test_rendered_chart_passes_server_side_dry_run(api: ApiClient, helm: Path, sets: list[str]) -> None:
    docs = render(helm, *sets)
    applied, skipped = apply_all(api, docs)
    # Only CRD-backed kinds may be skipped, and the test cluster has no Prometheus Operator CRDs.
    assert skipped <= CRD_KINDS
    assert {d["kind"] for d in applied} >= {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    }
    [dep] = [d for d in applied if d["kind"] == "Deployment"]
    # Defaulting ran (the server filled in what the chart left out) and nothing was dropped.
    pod = dep["spec"]["template"]["spec"]
    assert pod["containers"] and all(
        c["securityContext"]["readOnlyRootFilesystem"] for c in pod["containers"]
    )
    assert pod["dnsPolicy"] == "ClusterFirst"
    # Dry run means dry: nothing exists afterwards.
    dyn = DynamicClient(api)
    with pytest.raises(ApiException) as exc:
        dyn.resources.get(api_version="apps/v1", kind="Deployment").get(
            name=dep["metadata"]["name"], namespace=NAMESPACE
        )
    assert exc.value.status == 404


def test_raw_manifests_pass_server_side_dry_run(api: ApiClient) -> None:
    for path in sorted((REPO / "deploy" / "manifests").glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        applied, skipped = apply_all(api, docs)
        assert not skipped, f"{path.name}: raw manifests should need no CRDs"
        assert len(applied) == len(docs)


def test_dry_run_really_validates(api: ApiClient, helm: Path) -> None:
    # The same path rejects what is wrong, so a green run above means something.
    [dep] = [d for d in render(helm) if d["kind"] == "Deployment"]
    bad = json.loads(json.dumps(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFilesysten"] = True
    with pytest.raises(ApiException) as exc:
        dry_run_apply(api, bad)
    assert "readOnlyRootFilesysten" in str(exc.value.reason)
    crb = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "llmp-bad-roleref"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "x"},
        "subjects": [{"kind": "ServiceAccount", "name": "x", "namespace": NAMESPACE}],
    }
    with pytest.raises(ApiException):
        dry_run_apply(api, crb)  # a ClusterRoleBinding may only refer to a ClusterRole


def test_real_extender_serves_the_rendered_config_and_passes_the_rendered_probes(
    control_plane: ControlPlane, helm: Path, tmp_path: Path
) -> None:
    """The chart's extender ConfigMap and probe commands, run against the real `llm-placement serve`.

    Catches drift between the chart and the app: a settings key the app rejects, a probe path or
    port the app does not serve, a readiness that never turns ready.
    """
    port, metrics = free_port(), free_port()
    docs = render(
        helm,
        f"extender.port={port}",
        f"extender.metricsPort={metrics}",
        f"extender.settings.kubeconfig={control_plane.extender_kubeconfig}",
    )
    [cm] = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-extender-config")
    ]
    config = tmp_path / "config.yaml"
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    [ext] = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"]
    # The verbs' serving Secret where kubelet would mount it: its files in a local folder.
    [mount] = [m["mountPath"] for m in ext["volumeMounts"] if m["name"] == "verbs-serving"]
    [secret] = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-verbs-serving")]
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    for key, value in secret["data"].items():
        (tls_dir / key).write_bytes(base64.b64decode(value))
    config.write_text(cm["data"]["config.yaml"].replace(mount, str(tls_dir)))
    assert str(tls_dir) in config.read_text(), "the rendered settings do not read the mounted Secret"
    assert ext["command"][:2] == ["llm-placement", "serve"]
    # Same argv, the file at a local path; this tree's app (python -m, as the harness starts it),
    # not whatever the venv's console script imports.
    argv = [sys.executable, "-m", "app.cli", *ext["command"][1:-1], str(config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMP_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    log = (tmp_path / "extender.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def probe(name: str) -> int:
        cmd = ext[name]["exec"]["command"]
        assert cmd[0] == "python"
        return subprocess.run([sys.executable, *cmd[1:]], capture_output=True, timeout=30).returncode

    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if probe("startupProbe") == 0 and probe("readinessProbe") == 0:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "extender exited:\n" + (tmp_path / "extender.log").read_text()[-3000:]
        assert probe("startupProbe") == 0 and probe("livenessProbe") == 0
        assert probe("readinessProbe") == 0, (tmp_path / "extender.log").read_text()[-3000:]
        # Metrics answer on the port the metrics Service targets.
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as r:
            assert b"llm_placement_" in r.read()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    # And a stopped extender fails the liveness probe (the check is not vacuous).
    assert probe("livenessProbe") != 0
