"""The Helm chart, checked with the real helm (lint, template, schema) and the real kube-scheduler."""

from __future__ import annotations

import contextlib
import http.server
import json
import shutil
import ssl
import subprocess
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config.settings import API_VERSION, KIND, RENAMED, Settings, load_settings
from app.serving.profiles import ProfileBook
from app.sim.profile import DEFAULT_SCORE_WEIGHTS, EXTENDER_SCALE, MAX_NODE_SCORE
from kubeharness import find_binaries

from .conftest import CHART, NAMESPACE, RELEASE, Rendered, run_helm, template_args

FILES = CHART / "files"
CHART_SCHED_CONFIG = yaml.safe_load((FILES / "scheduler-config.yaml").read_text())
CHART_RBAC_RULES = yaml.safe_load((FILES / "extender-rbac-rules.yaml").read_text())
# Settings the chart writes itself (from structured values), so they must not be in extender.settings.
CHART_MANAGED_SETTINGS = {
    "host", "port", "metrics_host", "metrics_port", "url_prefix", "scheduler_name", "log_level",
    "tls_cert_file", "tls_key_file", "tls_client_ca_file",
}
NON_DEFAULT_SETS = [
    "replicas=3",
    "scheduler.name=gpu-placement",
    "scheduler.extender.weight=20",
    "scheduler.leaderElection.resourceName=gpu-placement-lease",
    "extender.port=9999",
    "extender.metricsPort=9191",
    "extender.image.repository=example.org/llmp/extender",
    "extender.image.tag=1.2.3",
    "metrics.serviceMonitor.enabled=true",
    "pdb.minAvailable=2",
    "extender.settings.gang_reservation_ttl_seconds=180",
    "extender.settings.weights.serving.cost=4",
    "priorityClassName=system-cluster-critical",
]
# Measured serving profiles for extender.profiles (docs/stage-policy.md, "Measured profiles").
PROFILES = [
    {"model": "llama-3.1-8b-instruct", "model_params": "8B", "gpu": "L4", "precision": "int8",
     "ms_per_token": 41, "max_concurrency": 4, "source": "test"},
    # A bare number: helm must render it so the app still reads a parameter count.
    {"model": "llama-3.1-70b", "model_params": 70_000_000_000, "gpu": "H100-SXM-80GB", "gpus": 4,
     "precision": "bf16", "ttft_ms": 180.5, "prompt_tokens": 2048},
]
PROFILE_SETS = [f"extender.profiles[0].{k}={v}" for k, v in PROFILES[0].items()]


def sched_config(r: Rendered) -> dict[str, Any]:
    return r.configmap_yaml("-scheduler-config", "scheduler-config.yaml")


def extender_config(r: Rendered) -> dict[str, Any]:
    return r.configmap_yaml("-extender-config", "config.yaml")


def tls_files(r: Rendered, which: str, where: Path) -> Path:
    """The files of the Secret <fullname>-verbs-<which> in a folder, as kubelet mounts them."""
    import base64
    folder = where / f"verbs-{which}"
    folder.mkdir(exist_ok=True)
    for key, value in r.one("Secret", f"-verbs-{which}")["data"].items():
        (folder / key).write_bytes(base64.b64decode(value))
    return folder


def local_scheduler_tls(r: Rendered, cfg: dict[str, Any], where: Path) -> dict[str, Any]:
    """``cfg`` with its tlsConfig files at the rendered client Secret's files (kube-scheduler opens
    them when it reads the configuration)."""
    ext = cfg["extenders"][0]
    if "tlsConfig" in ext:
        folder = tls_files(r, "client", where)
        ext["tlsConfig"] = {k: str(folder / Path(v).name) if k.endswith("File") else v
                            for k, v in ext["tlsConfig"].items()}
    return cfg


def local_settings(r: Rendered, where: Path) -> Path:
    """The rendered extender settings file, reading the serving Secret where the test put it."""
    text = r.one("ConfigMap", "-extender-config")["data"]["config.yaml"]
    mounts = _volume_mounts(r, "extender")
    if "verbs-serving" in mounts:
        text = text.replace(mounts["verbs-serving"], str(tls_files(r, "serving", where)))
    path = where / "config.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def default(render: Callable[..., Rendered]) -> Rendered:
    return render()


@pytest.fixture(scope="module")
def custom(render: Callable[..., Rendered]) -> Rendered:
    return render(sets=NON_DEFAULT_SETS)


@pytest.fixture(scope="module")
def ds(render: Callable[..., Rendered]) -> Rendered:
    return render(sets=["mode=default-scheduler"])


# --- lint -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sets",
    [[], ["mode=default-scheduler"], NON_DEFAULT_SETS, ["metrics.prometheusRule.enabled=true"],
     PROFILE_SETS],
    ids=["default", "default-scheduler", "non-default", "prometheus-rule", "profiles"],
)
def test_helm_lint_strict(helm_bin: Path, sets: list[str]) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm_bin, *args, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    # --strict turns warnings into failures; make sure none slipped through as text either.
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout


# --- the scheduler configuration ----------------------------------------------------------------------


def test_scheduler_config_has_the_extender_as_designed(default: Rendered) -> None:
    cfg = sched_config(default)
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    # Sampling could hide a gang member's planned node from the extender.
    assert cfg["percentageOfNodesToScore"] == 100
    [profile] = cfg["profiles"]
    assert profile["schedulerName"] == "llm-placement"
    # The in-tree resource scorers would fight our packing/cost bands (docs/scoring.md); they still filter.
    disabled = {p["name"] for p in profile["plugins"]["score"]["disabled"]}
    assert disabled == {"NodeResourcesFit", "NodeResourcesBalancedAllocation", "ImageLocality"}
    assert "filter" not in profile["plugins"]
    [ext] = cfg["extenders"]
    # Over TLS with kube-scheduler's client certificate (docs/security.md); plain with tls off.
    assert ext["urlPrefix"] == "https://127.0.0.1:8888/scheduler"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == ("filter", "prioritize", "bind")
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert isinstance(ext["weight"], int) and ext["weight"] > 0
    # The secondary scheduler must send every pod (CPU-only stages too) to the extender (docs/extender-protocol.md).
    assert "managedResources" not in ext
    le = cfg["leaderElection"]
    assert le["leaderElect"] is True
    assert (le["resourceName"], le["resourceNamespace"]) == ("llm-placement", NAMESPACE)


def in_tree_score_weights(cfg: dict[str, Any], tmp_path: Path) -> dict[str, int]:
    """The score plugins kube-scheduler itself runs for the profile, with its own default weights:
    the real binary writes the configuration with every default applied (--write-config-to)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "unused"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    cfg = {**cfg, "leaderElection": {"leaderElect": False},
           "clientConnection": {**cfg.get("clientConnection", {}), "kubeconfig": str(kubeconfig)}}
    (tmp_path / "in.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out.yaml"
    scheduler = find_binaries(build=False).kube_scheduler
    proc = subprocess.run([str(scheduler), f"--config={tmp_path / 'in.yaml'}", f"--write-config-to={out}"],
                          capture_output=True, text=True, timeout=60)
    assert out.exists(), proc.stderr[-2000:]
    [profile] = yaml.safe_load(out.read_text())["profiles"]
    plugins = profile["plugins"]
    disabled = {p["name"] for p in (plugins.get("score") or {}).get("disabled") or ()}
    weights = {p["name"]: p.get("weight") or 0 for p in plugins["multiPoint"]["enabled"]}
    weights.update({p["name"]: p.get("weight") or 0 for p in (plugins.get("score") or {}).get("enabled") or ()})
    # A multiPoint plugin written with weight 0 either has no Score (filter-only) or scores at weight
    # 1 once its feature gate is on: VolumeBinding under StorageCapacityScoring. Count it, to be safe.
    weights["VolumeBinding"] = max(weights.get("VolumeBinding", 0), 1)
    return {n: w for n, w in weights.items() if w > 0 and n not in disabled}


def test_one_band_outweighs_every_in_tree_scorer_kube_scheduler_enables(default: Rendered, tmp_path: Path) -> None:
    cfg = local_scheduler_tls(default, sched_config(default), tmp_path)
    weights = in_tree_score_weights(cfg, tmp_path)
    # What 1.36 enables by default for this profile; DynamicResources is the one a comment once missed.
    assert {"TaintToleration", "NodeAffinity", "PodTopologySpread", "InterPodAffinity",
            "DynamicResources"} <= set(weights)
    in_tree_max = sum(weights.values()) * MAX_NODE_SCORE
    [ext] = cfg["extenders"]
    band = ext["weight"] * EXTENDER_SCALE
    assert band > in_tree_max, f"one band is {band} points, the in-tree scorers {weights} add {in_tree_max}"
    # The simulator adds the same weights kube-scheduler does.
    for name, w in weights.items():
        assert DEFAULT_SCORE_WEIGHTS.get(name) == w, name


def test_scheduler_config_is_the_chart_file_with_only_the_documented_overrides(default: Rendered) -> None:
    cfg = sched_config(default)
    base = json.loads(json.dumps(CHART_SCHED_CONFIG))
    # The only differences allowed: the lease namespace (release namespace) ...
    base["leaderElection"]["resourceNamespace"] = NAMESPACE
    # ... and TLS for the verbs (docs/security.md).
    [ext] = base["extenders"]
    ext["urlPrefix"] = ext["urlPrefix"].replace("http://", "https://")
    ext["enableHTTPS"] = True
    ext["tlsConfig"] = cfg["extenders"][0]["tlsConfig"]
    assert cfg == base, "the chart must render files/scheduler-config.yaml, not a second copy of it"


def test_non_default_values_reach_every_consumer(custom: Rendered) -> None:
    cfg = sched_config(custom)
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["gpu-placement"]
    [ext] = cfg["extenders"]
    assert ext["urlPrefix"] == "https://127.0.0.1:9999/scheduler"
    assert ext["weight"] == 20
    assert cfg["leaderElection"]["resourceName"] == "gpu-placement-lease"
    # The extender listens where the scheduler calls it, and knows its profile name.
    ecfg = extender_config(custom)
    assert (ecfg["host"], ecfg["port"], ecfg["url_prefix"]) == ("127.0.0.1", 9999, "/scheduler")
    assert ecfg["scheduler_name"] == "gpu-placement"
    assert ecfg["metrics_port"] == 9191
    assert ecfg["gang_reservation_ttl_seconds"] == 180
    assert ecfg["weights"] == {"serving": {"cost": 4}}
    dep = custom.deployment()
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["template"]["spec"]["priorityClassName"] == "system-cluster-critical"
    c = custom.containers()
    assert c["extender"]["image"] == "example.org/llmp/extender:1.2.3"
    assert {p["name"]: p["containerPort"] for p in c["extender"]["ports"]} == {"metrics": 9191}
    probe_cmd = c["extender"]["readinessProbe"]["exec"]["command"][-1]
    assert "https://127.0.0.1:9999/readyz" in probe_cmd
    # Only the lease the scheduler uses can be updated.
    role = custom.one("Role", "-leader-election")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["gpu-placement-lease"], "verbs": ["get", "update", "patch"]}]
    assert custom.one("PodDisruptionBudget")["spec"] == {
        "minAvailable": 2, "selector": dep["spec"]["selector"]}
    sm = custom.one("ServiceMonitor")
    svc = custom.one("Service", "-metrics")
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    for k, v in sm["spec"]["selector"]["matchLabels"].items():
        assert svc["metadata"]["labels"][k] == v


def test_deployment_wires_configs_to_the_paths_the_commands_read(default: Rendered) -> None:
    spec = default.deployment()["spec"]["template"]["spec"]
    c = default.containers()
    assert set(c) == {"kube-scheduler", "extender"}
    assert c["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.36.3"
    volumes = {v["name"]: v for v in spec["volumes"]}

    def file_behind(container: dict[str, Any], path: str) -> tuple[str, str]:
        for m in container["volumeMounts"]:
            if path.startswith(m["mountPath"] + "/"):
                return volumes[m["name"]]["configMap"]["name"], path[len(m["mountPath"]) + 1:]
        raise AssertionError(f"{path} is not on a mounted volume of {container['name']}")

    [cfg_arg] = [a for a in c["kube-scheduler"]["command"] if a.startswith("--config=")]
    cm, key = file_behind(c["kube-scheduler"], cfg_arg.removeprefix("--config="))
    assert cm.endswith("-scheduler-config") and key == "scheduler-config.yaml"
    cmd = c["extender"]["command"]
    assert cmd == ["llm-placement", "serve", "--config", "/etc/llm-placement/config.yaml"]
    cm, key = file_behind(c["extender"], cmd[-1])
    assert cm.endswith("-extender-config") and key == "config.yaml"
    # Both ConfigMaps exist under those names.
    default.one("ConfigMap", "-scheduler-config")
    default.one("ConfigMap", "-extender-config")
    # Configuration changes roll the pods.
    ann = default.deployment()["spec"]["template"]["metadata"]["annotations"]
    assert {"checksum/extender-config", "checksum/scheduler-config"} <= set(ann)


# --- measured profiles ----------------------------------------------------------------------------------


def _profiles_mounts(r: Rendered) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    spec = r.deployment()["spec"]["template"]["spec"]
    volumes = [v for v in spec["volumes"] if v.get("configMap", {}).get("name", "").endswith("-profiles")]
    names = {v["name"] for v in volumes}
    mounts = [m for m in r.containers()["extender"]["volumeMounts"] if m["name"] in names]
    return volumes, mounts


@pytest.mark.parametrize("fixture", ["default", "custom", "ds"])
def test_no_profiles_renders_no_configmap_mount_or_setting(fixture: str, request: pytest.FixtureRequest) -> None:
    r: Rendered = request.getfixturevalue(fixture)
    assert not [d for d in r.all("ConfigMap") if d["metadata"]["name"].endswith("-profiles")]
    assert _profiles_mounts(r) == ([], [])
    assert "profiles_file" not in extender_config(r)
    assert "checksum/profiles" not in r.deployment()["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize("mode", ["scheduler", "default-scheduler"])
def test_profiles_become_a_mounted_configmap_the_extender_reads(
    mode: str, render: Callable[..., Rendered], tmp_path: Path
) -> None:
    r = render(values={"mode": mode, "extender": {"profiles": PROFILES}}, sets=[])
    cm = r.one("ConfigMap", "-profiles")
    volumes, mounts = _profiles_mounts(r)
    assert [v["configMap"]["name"] for v in volumes] == [cm["metadata"]["name"]]
    assert len(mounts) == 1 and mounts[0]["readOnly"] is True
    # profiles_file names the ConfigMap's key under the mount, outside the config volume.
    path = extender_config(r)["profiles_file"]
    assert path == f"{mounts[0]['mountPath']}/profiles.yaml" and "profiles.yaml" in cm["data"]
    assert not path.startswith("/etc/llm-placement/")
    # The rendered file is one the app accepts, entry for entry.
    local = tmp_path / "profiles.yaml"
    local.write_text(cm["data"]["profiles.yaml"])
    book = ProfileBook.load(local)
    assert [(p.model, p.model_params, p.gpus, p.precision.value) for p in book.entries] == [
        ("llama-3.1-8b-instruct", 8e9, 1, "int8"), ("llama-3.1-70b", 70e9, 4, "bf16")]
    cfg = local_settings(r, tmp_path)
    assert load_settings(cfg, profiles_file=str(local)).policies().placement.feasibility.profiles is not None
    # A change of profiles rolls the pods (the extender reads them once, at start).
    ann = r.deployment()["spec"]["template"]["metadata"]["annotations"]
    other = render(values={"mode": mode, "extender": {"profiles": PROFILES[:1]}})
    assert ann["checksum/profiles"] != other.deployment()["spec"]["template"]["metadata"]["annotations"][
        "checksum/profiles"]


# --- security and RBAC --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["default", "ds"])
def test_every_container_is_non_root_read_only_without_capabilities(
    mode: str, request: pytest.FixtureRequest
) -> None:
    r: Rendered = request.getfixturevalue(mode)
    spec = r.deployment()["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert isinstance(spec["securityContext"]["runAsUser"], int) and spec["securityContext"]["runAsUser"] > 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert r.containers(), "no containers rendered"
    for name, c in r.containers().items():
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True, name
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["allowPrivilegeEscalation"] is False, name
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], name
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        # A read-only root still needs somewhere to write temp files.
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), name
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], name


def test_extender_rbac_rules_are_the_file(default: Rendered, ds: Rendered) -> None:
    assert isinstance(CHART_RBAC_RULES, list) and CHART_RBAC_RULES
    for r in (default, ds):
        assert r.one("ClusterRole", "-extender")["rules"] == CHART_RBAC_RULES


def test_extender_rbac_is_least_privilege() -> None:
    grants = {(g, res, v) for rule in CHART_RBAC_RULES for g in rule["apiGroups"]
              for res in rule["resources"] for v in rule["verbs"]}
    for needed in [("", "nodes", "watch"), ("", "pods", "patch"), ("", "pods/binding", "create"),
                   ("", "events", "create"),
                   ("scheduling.x-k8s.io", "podgroups", "list"),
                   *[("scheduling.k8s.io", "podgroups", v) for v in ("get", "list", "watch")],
                   *[("resource.k8s.io", res, v) for res in ("resourceslices", "resourceclaims",
                     "resourceclaimtemplates", "deviceclasses", "devicetaintrules")
                     for v in ("get", "list", "watch")],
                   *[("resource.nvidia.com", res, v) for res in ("computedomaincliques", "computedomains")
                     for v in ("get", "list", "watch")]]:
        assert needed in grants, needed
    assert not any("*" in t for t in grants), "wildcards in the extender's rules"
    dangerous = {"delete", "deletecollection", "escalate", "bind", "impersonate"}
    assert not any(v in dangerous for _, _, v in grants)
    assert not any(res in ("secrets", "nodes/proxy", "pods/exec") for _, res, _ in grants)


def test_pod_patch_policy_limits_the_service_account_to_our_annotations(default: Rendered, ds: Rendered) -> None:
    """`pods patch` is cluster-wide in RBAC; the chart's ValidatingAdmissionPolicy narrows it
    (files/pod-patch-policy.yaml, exercised on a real API server in
    tests/integration/test_least_privilege.py)."""
    policy_file = yaml.safe_load((FILES / "pod-patch-policy.yaml").read_text())
    for r in (default, ds):
        sa = r.one("ServiceAccount")["metadata"]["name"]
        policy = r.one("ValidatingAdmissionPolicy")
        spec = dict(policy["spec"])
        [cond] = spec.pop("matchConditions")
        assert cond["expression"] == f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{sa}'"
        assert spec == policy_file
        binding = r.one("ValidatingAdmissionPolicyBinding")
        assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


MAP_V1 = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


def test_gang_gate_policy_is_rendered_where_the_api_server_serves_it(render: Callable[..., Rendered]) -> None:
    """Gang members are gated at admission (files/gang-gate-policy.yaml, exercised on a real API
    server in tests/integration/test_gang_gate.py), only where MutatingAdmissionPolicy v1 exists."""
    policy_file = yaml.safe_load((FILES / "gang-gate-policy.yaml").read_text())
    sched = render(api_versions=(MAP_V1,), sets=["scheduler.name=gpu-placement"])
    policy = sched.one("MutatingAdmissionPolicy")
    spec = dict(policy["spec"])
    *conds, mine = spec.pop("matchConditions")
    assert conds == policy_file["matchConditions"]
    assert mine["expression"] == "has(object.spec.schedulerName) && object.spec.schedulerName == 'gpu-placement'"
    assert spec == {k: v for k, v in policy_file.items() if k != "matchConditions"}
    assert sched.one("MutatingAdmissionPolicyBinding")["spec"] == {"policyName": policy["metadata"]["name"]}
    # The default scheduler's pods carry no scheduler name of ours: every sized gang member is held.
    ds = render(api_versions=(MAP_V1,), sets=["mode=default-scheduler"])
    assert ds.one("MutatingAdmissionPolicy")["spec"]["matchConditions"] == policy_file["matchConditions"]
    for r in (render(), render(api_versions=(MAP_V1,), sets=["gangGate.enabled=false"])):
        assert r.all("MutatingAdmissionPolicy") == [] and r.all("MutatingAdmissionPolicyBinding") == []


def test_scheduler_rbac_is_the_standard_secondary_scheduler_set(default: Rendered, ds: Rendered) -> None:
    sa = default.one("ServiceAccount")["metadata"]["name"]
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    crbs = {b["roleRef"]["name"]: b for b in default.all("ClusterRoleBinding")}
    assert set(crbs) == {"system:kube-scheduler", "system:volume-scheduler", f"{RELEASE}-extender"}
    assert all(b["subjects"] == subject for b in crbs.values())
    rbs = {b["roleRef"]["name"]: b for b in default.all("RoleBinding")}
    auth = rbs["extension-apiserver-authentication-reader"]
    assert auth["metadata"]["namespace"] == "kube-system" and auth["subjects"] == subject
    assert rbs[f"{RELEASE}-leader-election"]["metadata"]["namespace"] == NAMESPACE
    assert default.deployment()["spec"]["template"]["spec"]["serviceAccountName"] == sa
    # The default-scheduler mode runs no scheduler: no scheduler grants at all.
    assert {b["roleRef"]["name"] for b in ds.all("ClusterRoleBinding")} == {f"{RELEASE}-extender"}
    assert ds.all("RoleBinding") == [] and ds.all("Role") == []


# --- probes -------------------------------------------------------------------------------------------


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def health_server(r: Rendered | None, port: int, where: Path) -> Iterator[int]:
    """A stub on ``port``, over TLS with the rendered serving certificate when ``r`` is given."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Health)
    if r is not None:
        folder = tls_files(r, "serving", where)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(folder / "tls.crt", folder / "tls.key")
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield port
    finally:
        srv.shutdown()


@pytest.mark.parametrize("tls", [True, False])
def test_scheduler_mode_probes_exec_to_loopback_and_really_fail(
    render: Callable[..., Rendered], tmp_path: Path, tls: bool
) -> None:
    from kubeharness import free_port
    port = free_port()
    r = render(sets=[f"extender.port={port}", f"extender.tls.enabled={str(tls).lower()}"])
    stack = contextlib.ExitStack()
    stack.enter_context(health_server(r if tls else None, port, tmp_path))
    assert extender_config(r)["host"] == "127.0.0.1"
    ext = r.containers()["extender"]
    live, ready = ext["livenessProbe"], ext["readinessProbe"]
    # kubelet's httpGet goes to the pod IP, which a loopback listener never answers.
    assert "httpGet" not in live and "httpGet" not in ready
    # Run the probe commands as kubelet would (python from PATH), against a stub that is healthy
    # but not ready: the liveness command must pass and the readiness command must fail.
    def run(cmd: list[str]) -> int:
        assert cmd[0] == "python"
        return subprocess.run([shutil.which("python3") or "python3", *cmd[1:]],
                              capture_output=True, timeout=30).returncode

    with stack:
        assert run(live["exec"]["command"]) == 0
        assert run(ready["exec"]["command"]) != 0
        assert run(ext["startupProbe"]["exec"]["command"]) == 0


def test_default_scheduler_mode_probes_http_on_all_interfaces(ds: Rendered) -> None:
    assert extender_config(ds)["host"] == "0.0.0.0"
    ext = ds.containers()["extender"]
    assert ext["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTPS"}
    assert ext["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", "scheme": "HTTPS"}
    assert {p["name"]: p["containerPort"] for p in ext["ports"]} == {"http": 8888, "metrics": 9090}


# --- extender settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["default", "custom", "ds"])
def test_rendered_extender_settings_load_in_the_app(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    r: Rendered = request.getfixturevalue(fixture)
    path = local_settings(r, tmp_path)
    document = yaml.safe_load(path.read_text())
    assert (document["apiVersion"], document["kind"]) == (API_VERSION, KIND)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # versioned, no old names: no deprecation warning
        settings = load_settings(path)
    assert settings.metrics_host == "0.0.0.0"
    if fixture == "ds":
        assert settings.scheduler_name == "default-scheduler"
        url = yaml.safe_load(r.one("ConfigMap", "-extenders-snippet")["data"]["extenders.yaml"])
        url = url["extenders"][0]["urlPrefix"]
    else:
        url = sched_config(r)["extenders"][0]["urlPrefix"]
    # The scheduler calls exactly the port and path the extender serves.
    assert url.endswith(f":{settings.port}{settings.url_prefix}")
    if fixture == "custom":
        assert settings.weights["serving"].cost == 4


def test_schema_lists_every_app_setting() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    in_schema = set(schema["properties"]["extender"]["properties"]["settings"]["properties"])
    fields = set(Settings.model_fields)
    assert not in_schema & CHART_MANAGED_SETTINGS, "chart-managed keys must not be settable twice"
    missing = fields - in_schema - CHART_MANAGED_SETTINGS
    assert not missing, f"app/config/settings.py settings not in values.schema.json extender.settings: {missing}"
    extra = in_schema - fields - set(RENAMED)  # old names: still accepted until they go
    assert not extra, f"values.schema.json lists settings app/config/settings.py lacks: {extra}"


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (["extender.port=abc"], "/extender/port"),
        (["extender.port=70000"], "/extender/port"),
        (["mode=kube-system"], "/mode"),
        (["scheduler.extender.weight=0"], "/scheduler/extender/weight"),
        (["extender.settings.no_such_setting=1"], "no_such_setting"),
        (["extender.settings.memory_headroom=1.5"], "/extender/settings/memory_headroom"),
        (["extender.settings.stranded_idle_share=2"], "/extender/settings/stranded_idle_share"),
        (["extender.settings.feature_gates.NoSuchGate=true"], "NoSuchGate"),
        (["extender.settings.feature_gates.WholeNodeGuard=maybe"], "/extender/settings/feature_gates/WholeNodeGuard"),
        (["extender.settings.http_max_header_bytes=10"], "/extender/settings/http_max_header_bytes"),
        (["replicas=0"], "/replicas"),
        (["no_such_value=1"], "no_such_value"),
        (["extender.profiles[0].model=m"], "/extender/profiles/0"),
        ([*PROFILE_SETS, "extender.profiles[0].precision=int3"], "/extender/profiles/0/precision"),
        ([*PROFILE_SETS, "extender.profiles[0].ms_per_token=0"], "/extender/profiles/0/ms_per_token"),
        ([*PROFILE_SETS, "extender.profiles[0].tpot=41"], "tpot"),
    ],
)
def test_schema_rejects_bad_values(helm_bin: Path, sets: list[str], complaint: str) -> None:
    args = template_args(sets=sets)
    proc = run_helm(helm_bin, *args, check=False)
    assert proc.returncode != 0, f"helm accepted {sets}"
    assert "schema" in proc.stderr and complaint in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (["mode=default-scheduler", "replicas=2"], "replicas: 1 only"),
        (["replicas=2", "scheduler.leaderElection.enabled=false"], "leaderElection"),
        ([*PROFILE_SETS, "extender.settings.profiles_file=/etc/p.yaml"], "not both"),
    ],
)
def test_unsafe_combinations_fail_with_a_reason(helm_bin: Path, sets: list[str], complaint: str) -> None:
    proc = run_helm(helm_bin, *template_args(sets=sets), check=False)
    assert proc.returncode != 0 and complaint in proc.stderr, proc.stderr


# --- default-scheduler mode -----------------------------------------------------------------------------


def test_default_scheduler_mode_renders_only_the_extender_and_the_stanza(ds: Rendered) -> None:
    assert set(ds.containers()) == {"extender"}, "no kube-scheduler in default-scheduler mode"
    assert not [d for d in ds.all("ConfigMap") if d["metadata"]["name"].endswith("-scheduler-config")]
    assert ds.deployment()["spec"]["strategy"] == {"type": "Recreate"}
    data = ds.one("ConfigMap", "-extenders-snippet")["data"]
    [ext] = yaml.safe_load(data["extenders.yaml"])["extenders"]
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    assert ext["urlPrefix"] == f"https://{RELEASE}.{NAMESPACE}.svc:8888/scheduler"
    assert ext["bindVerb"] == "bind" and ext["nodeCacheCapable"] is True and ext["weight"] >= 10
    # Same entry as the chart file apart from where it points and what it manages.
    base = dict(CHART_SCHED_CONFIG["extenders"][0])
    assert {k: v for k, v in ext.items() if k not in ("urlPrefix", "managedResources", "enableHTTPS",
                                                         "tlsConfig")} == {
        k: v for k, v in base.items() if k != "urlPrefix"}
    full = yaml.safe_load(data["kube-scheduler-config.yaml"])
    assert full["extenders"] == [ext]
    assert full["percentageOfNodesToScore"] == 100
    assert full["profiles"] == [{"schedulerName": "default-scheduler"}]
    svc = ds.one("Service", RELEASE)
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8888, "targetPort": "http", "protocol": "TCP"}]
    pod_labels = ds.deployment()["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in svc["spec"]["selector"].items())


def test_default_scheduler_mode_uses_a_pinned_cluster_ip(render: Callable[..., Rendered]) -> None:
    r = render(sets=["mode=default-scheduler", "defaultScheduler.service.clusterIP=10.96.0.50"])
    [ext] = yaml.safe_load(r.one("ConfigMap", "-extenders-snippet")["data"]["extenders.yaml"])["extenders"]
    assert ext["urlPrefix"] == "https://10.96.0.50:8888/scheduler"
    assert r.one("Service", RELEASE)["spec"]["clusterIP"] == "10.96.0.50"


# --- NOTES ---------------------------------------------------------------------------------------------


def _notes(helm: Path, tmp_path: Path, sets: list[str]) -> str:
    # helm renders NOTES.txt only on install, which needs a cluster; render it as a template instead.
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    body = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_test_notes.tpl").write_text('{{- define "test.notes" -}}' + body + "{{- end -}}")
    (chart / "templates" / "test-notes.yaml").write_text(
        'kind: Notes\ntext: |\n{{ include "test.notes" . | indent 2 }}\n')
    out = run_helm(helm, *template_args(chart=chart, sets=sets), "--show-only", "templates/test-notes.yaml")
    return yaml.safe_load(out.stdout)["text"]


def test_notes_explain_how_to_opt_in_and_debug(helm_bin: Path, tmp_path: Path) -> None:
    text = _notes(helm_bin, tmp_path, [])
    assert "schedulerName: llm-placement" in text
    assert "llm-placement explain <namespace>/<pod>" in text
    assert "get events" in text
    # explain reaches the extender over TLS, checking it by the chart's CA (docs/security.md).
    assert "--url https://127.0.0.1:8888 --ca-file /etc/llm-placement-tls/ca.crt" in text


def test_notes_of_default_scheduler_mode_warn_cpu_pods_bypass(helm_bin: Path, tmp_path: Path) -> None:
    text = _notes(helm_bin, tmp_path, ["mode=default-scheduler"])
    assert "CPU-only LLM pods" in text and "bypass the extender" in text
    assert f"{RELEASE}-extenders-snippet" in text and "percentageOfNodesToScore: 100" in text
    assert "schedulerName: llm-placement" not in text
    assert f"{RELEASE}-verbs-client to /etc/kubernetes/llm-placement-extender" in text


# --- dashboards and Prometheus rules -------------------------------------------------------------------


def test_dashboards_and_rules_render_nothing_when_absent_and_match_files_when_present(
    helm_bin: Path, tmp_path: Path
) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    for f in (chart / "dashboards").glob("*.json"):
        f.unlink()
    (chart / "files" / "prometheus-rules.yaml").unlink(missing_ok=True)
    sets = ["metrics.prometheusRule.enabled=true"]

    def render() -> Rendered:
        return Rendered(run_helm(helm_bin, *template_args(chart=chart, sets=sets)).stdout)

    empty = render()
    assert "PrometheusRule" not in empty.kinds()
    assert not [d for d in empty.all("ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]

    dashboards = {"placement_quality.json": {"title": "Placement quality", "panels": [{"id": 1}]},
                  "Gangs.json": {"title": "Gangs", "panels": []}}
    for name, body in dashboards.items():
        (chart / "dashboards" / name).write_text(json.dumps(body, indent=2))
    rules = {"groups": [{"name": "llm-placement", "rules": [
        {"alert": "LlmPlacementDown", "expr": "up{job='llm-placement'} == 0", "for": "5m"}]}]}
    (chart / "files" / "prometheus-rules.yaml").write_text(yaml.safe_dump(rules))

    full = render()
    cms = [d for d in full.all("ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(cms) == 2
    got = {k: json.loads(v) for cm in cms for k, v in cm["data"].items()}
    assert got == dashboards
    assert all(len(cm["metadata"]["name"]) <= 63 for cm in cms)
    assert full.one("PrometheusRule")["spec"] == rules
    # Disabled means disabled, even with the file present.
    assert "PrometheusRule" not in Rendered(
        run_helm(helm_bin, *template_args(chart=chart)).stdout).kinds()


def test_shipped_dashboards_and_rules_are_valid(default: Rendered) -> None:
    # Whatever the chart ships must parse, or the sidecar / operator would reject it at install.
    for f in (CHART / "dashboards").glob("*.json"):
        assert isinstance(json.loads(f.read_text()), dict), f
    rules = FILES / "prometheus-rules.yaml"
    if rules.exists():
        assert isinstance(yaml.safe_load(rules.read_text()).get("groups"), list)
    n = len(list((CHART / "dashboards").glob("*.json")))
    labelled = [d for d in default.all("ConfigMap")
                if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(labelled) == n


# --- the real kube-scheduler accepts what the chart renders ----------------------------------------------


def _kube_scheduler_accepts(
    ks: Path, cfg: dict[str, Any], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    # kube-scheduler decodes (strictly) and validates the configuration before it needs a cluster;
    # --write-config-to then writes the defaulted result and exits without connecting anywhere.
    kubeconfig = tmp_path / "unused.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "unused"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    cfg = dict(cfg, clientConnection={"kubeconfig": str(kubeconfig)})
    src, out = tmp_path / "in.yaml", tmp_path / "out.yaml"
    out.unlink(missing_ok=True)
    src.write_text(yaml.safe_dump(cfg))
    return subprocess.run([str(ks), f"--config={src}", f"--write-config-to={out}"],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("fixture", ["default", "custom", "ds"])
def test_kube_scheduler_accepts_the_rendered_configuration(
    fixture: str, request: pytest.FixtureRequest, kube_scheduler_bin: Path, tmp_path: Path
) -> None:
    r: Rendered = request.getfixturevalue(fixture)
    if fixture == "ds":
        cfg = r.configmap_yaml("-extenders-snippet", "kube-scheduler-config.yaml")
    else:
        cfg = sched_config(r)
    cfg = local_scheduler_tls(r, cfg, tmp_path)
    proc = _kube_scheduler_accepts(kube_scheduler_bin, cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = yaml.safe_load((tmp_path / "out.yaml").read_text())
    [ext] = written["extenders"]
    assert ext["urlPrefix"] == cfg["extenders"][0]["urlPrefix"]
    assert ext["bindVerb"] == "bind" and ext["nodeCacheCapable"] is True
    assert written["percentageOfNodesToScore"] == 100


def test_kube_scheduler_check_is_not_a_rubber_stamp(
    default: Rendered, kube_scheduler_bin: Path, tmp_path: Path
) -> None:
    cfg = local_scheduler_tls(default, sched_config(default), tmp_path)
    cfg["extenders"][0]["weight"] = 0  # invalid with a prioritizeVerb
    proc = _kube_scheduler_accepts(kube_scheduler_bin, cfg, tmp_path)
    assert proc.returncode != 0 and "weight" in proc.stderr
    cfg = local_scheduler_tls(default, sched_config(default), tmp_path)
    cfg["extenders"][0]["nodeCacheCapabel"] = True  # strict decoding rejects unknown keys
    proc = _kube_scheduler_accepts(kube_scheduler_bin, cfg, tmp_path)
    assert proc.returncode != 0 and "nodeCacheCapabel" in proc.stderr


def test_schema_bounds_match_app_settings() -> None:
    # helm refuses what the extender would refuse at start, not less: each app maximum is the schema's.
    from annotated_types import Le

    schema = json.loads((CHART / "values.schema.json").read_text())
    props = schema["properties"]["extender"]["properties"]["settings"]["properties"]
    for name, info in Settings.model_fields.items():
        le = next((m.le for m in info.metadata if isinstance(m, Le)), None)
        if name in props and le is not None:
            assert props[name].get("maximum") == le, name


# --- TLS of the verbs (docs/security.md) --------------------------------------------------------------


def _volume_mounts(r: Rendered, container: str) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in r.containers()[container].get("volumeMounts", [])}


def _secret_volumes(r: Rendered) -> dict[str, str]:
    vols = r.deployment()["spec"]["template"]["spec"]["volumes"]
    return {v["name"]: v["secret"]["secretName"] for v in vols if "secret" in v}


def _pem(secret: dict[str, Any], key: str, where: Path) -> Path:
    import base64
    path = where / f"{secret['metadata']['name']}-{key}"
    path.write_bytes(base64.b64decode(secret["data"][key]))
    return path


def _openssl(*args: str) -> str:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("fixture", ["default", "ds"])
def test_helm_source_makes_a_ca_a_serving_and_a_client_certificate(
        fixture: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    r: Rendered = request.getfixturevalue(fixture)
    serving, client = r.one("Secret", "-verbs-serving"), r.one("Secret", "-verbs-client")
    for s in (serving, client):
        assert s["type"] == "kubernetes.io/tls" and set(s["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert serving["data"]["ca.crt"] == client["data"]["ca.crt"], "one CA signs both"
    ca = _pem(serving, "ca.crt", tmp_path)
    for s in (serving, client):
        assert "OK" in _openssl("verify", "-CAfile", str(ca), str(_pem(s, "tls.crt", tmp_path)))
    text = _openssl("x509", "-noout", "-text", "-in", str(_pem(serving, "tls.crt", tmp_path)))
    assert "IP Address:127.0.0.1" in text  # the sidecar's URL
    assert f"DNS:llm-placement.{NAMESPACE}.svc" in text  # default-scheduler mode's serverName
    subject = _openssl("x509", "-noout", "-subject", "-in", str(_pem(client, "tls.crt", tmp_path)))
    assert "kube-scheduler" in subject


def test_scheduler_mode_calls_the_sidecar_over_tls_with_its_client_certificate(default: Rendered) -> None:
    from kubeharness.schedconfig import with_verbs_tls

    ext = sched_config(default)["extenders"][0]
    assert ext["urlPrefix"].startswith("https://127.0.0.1:") and ext["enableHTTPS"] is True
    # The same fields the integration harness gives the real kube-scheduler.
    expected = with_verbs_tls({"urlPrefix": "http://x"}, Path("c"), Path("k"), Path("a"))
    assert set(ext["tlsConfig"]) == set(expected["tlsConfig"])
    sched_dir = _volume_mounts(default, "kube-scheduler")["verbs-client"]
    assert ext["tlsConfig"] == {"certFile": f"{sched_dir}/tls.crt", "keyFile": f"{sched_dir}/tls.key",
                                "caFile": f"{sched_dir}/ca.crt"}
    ext_dir = _volume_mounts(default, "extender")["verbs-serving"]
    settings = extender_config(default)
    assert settings["tls_cert_file"] == f"{ext_dir}/tls.crt" and settings["tls_key_file"] == f"{ext_dir}/tls.key"
    assert settings["tls_client_ca_file"] == f"{ext_dir}/ca.crt"
    assert _secret_volumes(default) == {"verbs-serving": "llm-placement-verbs-serving",
                                        "verbs-client": "llm-placement-verbs-client"}
    assert "verbs-client" not in _volume_mounts(default, "extender"), "the extender never holds the client key"
    probe = default.containers()["extender"]["readinessProbe"]["exec"]["command"][-1]
    assert "https://127.0.0.1:8888/readyz" in probe


def test_default_scheduler_mode_stanza_uses_tls_and_a_network_policy_admits_only_the_scheduler(
        ds: Rendered) -> None:
    snippet = yaml.safe_load(ds.one("ConfigMap", "-extenders-snippet")["data"]["extenders.yaml"])
    [ext] = snippet["extenders"]
    svc = f"llm-placement.{NAMESPACE}.svc"
    assert ext["urlPrefix"].startswith(f"https://{svc}:") and ext["enableHTTPS"] is True
    assert ext["tlsConfig"] == {"certFile": "/etc/kubernetes/llm-placement-extender/tls.crt",
                                "keyFile": "/etc/kubernetes/llm-placement-extender/tls.key",
                                "caFile": "/etc/kubernetes/llm-placement-extender/ca.crt",
                                "serverName": svc}
    assert _secret_volumes(ds) == {"verbs-serving": "llm-placement-verbs-serving"}
    probe = ds.containers()["extender"]["readinessProbe"]["httpGet"]
    assert probe["scheme"] == "HTTPS"
    policy = ds.one("NetworkPolicy", "-verbs")
    assert policy["spec"]["podSelector"]["matchLabels"] == ds.deployment()["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    verbs, metrics = policy["spec"]["ingress"]
    assert verbs["ports"] == [{"port": 8888, "protocol": "TCP"}]
    assert verbs["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                              "podSelector": {"matchLabels": {"component": "kube-scheduler"}}}]
    assert metrics == {"ports": [{"port": 9090, "protocol": "TCP"}]}


def test_scheduler_mode_has_no_network_policy(default: Rendered) -> None:
    # Loopback: nothing outside the pod reaches the verbs, so there is nothing to admit.
    assert not default.all("NetworkPolicy")


def test_tls_off_renders_plain_http_and_no_certificates(render: Callable[..., Rendered]) -> None:
    for mode in ("scheduler", "default-scheduler"):
        r = render(sets=[f"mode={mode}", "extender.tls.enabled=false"])
        assert not r.all("Secret") and not _secret_volumes(r)
        assert not {"tls_cert_file", "tls_client_ca_file"} & set(extender_config(r))
        if mode == "scheduler":
            ext = sched_config(r)["extenders"][0]
        else:
            ext = yaml.safe_load(r.one("ConfigMap", "-extenders-snippet")["data"]["extenders.yaml"])["extenders"][0]
        assert ext["urlPrefix"].startswith("http://") and "tlsConfig" not in ext and "enableHTTPS" not in ext


def test_cert_manager_and_existing_sources_make_no_keys_in_the_chart(render: Callable[..., Rendered]) -> None:
    cm = render(sets=["extender.tls.source=cert-manager"])
    assert not cm.all("Secret")
    certs = {c["metadata"]["name"]: c["spec"] for c in cm.all("Certificate")}
    assert certs["llm-placement-verbs-ca"]["isCA"] is True
    assert certs["llm-placement-verbs-serving"]["secretName"] == "llm-placement-verbs-serving"
    assert "127.0.0.1" in certs["llm-placement-verbs-serving"]["ipAddresses"]
    assert certs["llm-placement-verbs-client"]["usages"][0] == "client auth"
    assert {i["metadata"]["name"] for i in cm.all("Issuer")} == {"llm-placement-verbs-selfsigned",
                                                               "llm-placement-verbs-ca"}
    assert _secret_volumes(cm) == {"verbs-serving": "llm-placement-verbs-serving",
                                   "verbs-client": "llm-placement-verbs-client"}
    existing = render(sets=["extender.tls.source=existing"])
    assert not existing.all("Secret") and not existing.all("Certificate")
    assert _secret_volumes(existing) == _secret_volumes(cm)


# --- pod guard (docs/gangs.md, "Refused at admission") ----------------------------------------------------


MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


def test_pod_guard_is_the_file_scoped_to_the_scheduler_and_leaving_out_the_extender(
        render: Callable[..., Rendered]) -> None:
    guard_file = yaml.safe_load((FILES / "pod-guard-policy.yaml").read_text())
    for mode in ("scheduler", "default-scheduler"):
        r = render(sets=[f"mode={mode}"], api_versions=(MAP_API,))
        policy = r.one("ValidatingAdmissionPolicy", "-pod-guard")["spec"]
        binding = r.one("ValidatingAdmissionPolicyBinding", "-pod-guard")["spec"]
        assert binding == {"policyName": "llm-placement-pod-guard", "validationActions": ["Deny"]}
        conds = {c["name"]: c["expression"] for c in policy.pop("matchConditions")}
        assert policy == guard_file
        assert conds["not-llm-placement"] == (
            f"request.userInfo.username != 'system:serviceaccount:{NAMESPACE}:llm-placement'")
        assert ("llm-placement-scheduler" in conds) is (mode == "scheduler")
    # Without the gang gate's API (before 1.36) there is no gate to guard: nothing rendered.
    assert not [p for p in render().all("ValidatingAdmissionPolicy") if p["metadata"]["name"].endswith("-pod-guard")]
    off = render(sets=["podGuard.enabled=false"], api_versions=(MAP_API,))
    assert not [p for p in off.all("ValidatingAdmissionPolicy") if p["metadata"]["name"].endswith("-pod-guard")]


def test_pod_guard_compares_with_the_largest_gpu_the_values_name(render: Callable[..., Rendered]) -> None:
    # Where nodes label a GPU larger than the catalog's, the never-fits rule must compare with it.
    r = render(sets=["podGuard.largestGpuMemoryGB=288"], api_versions=(MAP_API,))
    variables = r.one("ValidatingAdmissionPolicy", "-pod-guard")["spec"]["variables"]
    names = [v["name"] for v in variables]
    assert {v["name"]: v["expression"] for v in variables}["largestGpuGB"] == "double(288)"
    file_names = [v["name"] for v in yaml.safe_load((FILES / "pod-guard-policy.yaml").read_text())["variables"]]
    assert names == file_names  # the same variables, in the order they refer to each other
