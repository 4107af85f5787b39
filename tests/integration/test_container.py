"""The extender image, built from the shipped Dockerfile and run the way the chart runs it, serving the
real kube-scheduler.

The image is built against the Python 3.11 base made from Debian packages (scripts/build-image.sh
--base debian; no container registry is reachable here), then started with the flags
testkit.container derives from the chart's rendered Deployment: the chart's command, env, non-root
UID, read-only root filesystem, no privilege escalation, no capabilities, the rendered extender
config mounted at /etc/llm-placement and a real ServiceAccount token at the in-cluster path. With
``--network host`` it listens on the loopback ports the chart config names, which is where the suite's
kube-scheduler (the chart's scheduler configuration, kubeharness) calls it, as the
chart's sidecar is called over the pod's loopback. As the chart does by default, the verbs are served
over TLS and answered only for kube-scheduler's client certificate (docs/security.md): the serving
Secret is mounted as the kubelet mounts it, with the harness's verbs PKI in place of the helm-made
certificates, and kube-scheduler calls with the client certificate, as the chart configures it.

Needs a Docker daemon (scripts/start-dockerd.sh starts one when none answers, and stops it at the end)
and debootstrap for the base image (scripts/install-system-deps.sh). Cold: ~3 min for the base image
and ~1.5 min for the image build; cached: seconds.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kubeharness import (
    ControlPlane,
    cpu_node,
    create_nodes,
    create_pod,
    delete_all_pods,
    ensure_namespace,
    find_binaries,
    free_port,
    get_pod,
    gpu_node,
    list_nodes,
    llm_pod,
    prefer_gpus,
    wait_for_node_name,
    wait_for_node_names,
    wait_until,
)
from kubeharness.container import (
    Container,
    ScriptError,
    chart_container,
    chart_values,
    docker,
    render_chart,
    run_probe,
    run_script,
)
from kubeharness.procs import Component
from kubeharness.tokens import pod_reader_token
from testkit.container import probe
from tests.prometheus.helpers import need_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

ANN = "llm-placement.io/"
NS = "container-it"  # the workloads' namespace
READY_TIMEOUT = 90.0


# --- image and daemon -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Dockerfile's image on the Debian-made base, built (or found in Docker's cache) once."""
    log = tmp_path_factory.mktemp("image-build") / "build.log"
    try:
        started = run_script("start-dockerd.sh", timeout=120)
    except ScriptError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        try:
            tag = run_script("build-image.sh", "--base", "debian", timeout=2400,
                             env={"LLMP_IMAGE_BUILD_LOG": str(log)})
        except ScriptError as exc:
            tail = log.read_text()[-4000:] if log.is_file() else ""
            pytest.fail(f"{exc}\n--- build log (last lines):\n{tail}", pytrace=False)
        yield tag
    finally:
        if started.startswith("started"):
            run_script("start-dockerd.sh", "--stop", timeout=60)


@dataclass
class Setup:
    cp: ControlPlane
    container: Container
    nodes: dict[str, dict[str, Any]]
    start_to_ready: float


def mixed_nodes() -> list[dict[str, Any]]:
    return [
        gpu_node("c-h100-0", "H100", gpus=8, clique="clq-a", tier0="leaf-1", rdma=True, index=1),
        gpu_node("c-h100-1", "H100", gpus=8, clique="clq-b", tier0="leaf-1", rdma=True, index=2),
        gpu_node("c-a100-0", "A100", gpus=8, tier0="leaf-2", rdma=True, index=3),
        gpu_node("c-l4-0", "L4", gpus=4, cpu="48", memory="192Gi", zone="zone-b", index=4),
        gpu_node("c-t4-0", "T4", gpus=4, cpu="48", memory="192Gi", zone="zone-b", index=5),
        cpu_node("c-cpu-0", "cpu", cpu="64", memory="512Gi", index=6),
        cpu_node("c-storage-0", "storage", cpu="32", memory="256Gi", index=7),
    ]


@pytest.fixture(scope="module")
def setup(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("container-cp")
    cp = ControlPlane(workdir, find_binaries(build=False))
    # The extender is the container below, not a process of the harness.
    cp.start(extender=False, scheduler=False)
    container: Container | None = None
    try:
        create_nodes(cp.core, mixed_nodes())
        ensure_namespace(cp.core, NS)
        container = chart_container(cp, image, workdir, f"llmp-it-{os.getpid()}")
        start_to_ready = container.start()
        # The chart's stanza over TLS with kube-scheduler's client certificate (the chart's default).
        cp.start_scheduler(overrides=container.scheduler_overrides(cp))
        nodes = {n["metadata"]["name"]: n for n in list_nodes(cp.core)}
        yield Setup(cp, container, nodes, start_to_ready)
    finally:
        if container is not None:
            container.remove()
        cp.stop()


@pytest.fixture
def clean(setup: Setup) -> Iterator[Setup]:
    yield setup
    delete_all_pods(setup.cp.core, NS)


def gpu_key(node: dict[str, Any]) -> str | None:
    product = (node["metadata"].get("labels") or {}).get("nvidia.com/gpu.product", "")
    for key in ("H100", "A100", "L4", "T4"):
        if key in product:
            return key
    return None


def decisions(cp: ControlPlane, stage: str) -> float:
    return cp.metric_value("llm_placement_decisions_total", {"stage": stage, "outcome": "bound"}) or 0.0


# --- the image's contents -------------------------------------------------------------------------
# Executables on any bin path, and the compiler proper (cc1) wherever gcc keeps it.
COMPILERS = re.compile(
    r"(^|/)s?bin/(gcc|g\+\+|cc|c\+\+|clang|x86_64-linux-gnu-(gcc|g\+\+)[-.\d]*|ld|as|make)$|/cc1(plus)?$")


def image_files(image: str) -> list[str]:
    cid = docker("create", image).stdout.strip()
    try:
        out = subprocess.run(["docker", "export", cid], capture_output=True, timeout=300, check=True).stdout
    finally:
        docker("rm", cid, check=False)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        return [m.name.lstrip("./") for m in tar.getmembers()]


def test_image_holds_the_installed_package_and_no_build_leftovers(image: str) -> None:
    files = image_files(image)
    site = [f for f in files if "/site-packages/app/" in f]
    data = [f for f in site if "/app/data/" in f and f.endswith(".yaml")]
    assert data, "the installed package has no app/data/*.yaml (package-data missing from the wheel)"
    assert any(f.endswith("/bin/llm-placement") for f in files), "no llm-placement entrypoint script"
    compilers = [f for f in files if COMPILERS.search(f)]
    assert not compilers, f"compilers in the image: {compilers[:10]}"
    caches = [f for f in files if "/.cache/pip" in f or f.startswith("root/.cache")]
    assert not caches, f"pip cache in the image: {caches[:10]}"
    # ensurepip's own pip/setuptools wheels are part of the interpreter in either base image.
    ensurepip = ("usr/share/python-wheels/", "/ensurepip/_bundled/")
    wheels = [f for f in files if (f.endswith(".whl") and not any(e in f for e in ensurepip))
              or f.startswith(("wheels/", "src/"))]
    assert not wheels, f"build-stage files in the image: {wheels[:10]}"
    # The source tree exists only as the installed package: no app/ outside site-packages.
    stray = [f for f in files if re.search(r"(^|/)app/(cli|service|wiring)\.py$", f) and "/site-packages/" not in f]
    assert not stray, f"source files outside the installed package: {stray}"
    assert not [f for f in files if f.endswith("pyproject.toml") and "/site-packages/" not in f]


def test_image_runs_as_the_charts_non_root_user(image: str) -> None:
    user = docker("image", "inspect", "-f", "{{.Config.User}} {{json .Config.Entrypoint}}", image).stdout.split(" ", 1)
    assert user[0] == "65532:65532"
    assert json.loads(user[1]) == ["llm-placement"]


# --- kube-scheduler calls the extender in the container -------------------------------------------
def test_the_container_runs_as_the_chart_says(setup: Setup) -> None:
    c = setup.container
    assert c.inspect("{{.Config.User}}") == "65532:65532"
    assert c.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true"
    assert c.inspect("{{json .HostConfig.CapDrop}}") == '["ALL"]'
    assert "no-new-privileges" in c.inspect("{{json .HostConfig.SecurityOpt}}")
    # The root filesystem really is read-only for the process, and /tmp (the emptyDir) writable.
    probe_ro = docker("exec", c.name, "python", "-c",
                      "import pathlib,sys\n"
                      "try: pathlib.Path('/home/llmp/x').write_text('x')\n"
                      "except OSError: pass\n"
                      "else: sys.exit(3)\n"
                      "pathlib.Path('/tmp/x').write_text('x')", check=False)
    assert probe_ro.returncode == 0, probe_ro.stderr
    cmdline = docker("exec", c.name, "cat", "/proc/1/cmdline").stdout.split("\0")
    assert cmdline[-3:-1] == ["--config", "/etc/llm-placement/config.yaml"], cmdline
    # The serving Secret as the kubelet mounts it: read-only, root:fsGroup 0440, so the process reads
    # its key through the fsGroup and cannot change it.
    tls = docker("exec", c.name, "python", "-c",
                 "import os, pathlib, stat, sys\n"
                 "d = pathlib.Path('/etc/llm-placement-tls')\n"
                 "print(sorted((f.name, oct(stat.S_IMODE(f.stat().st_mode)), f.stat().st_uid, f.stat().st_gid)"
                 " for f in d.iterdir()))\n"
                 "(d / 'tls.key').read_text()\n"
                 "try: (d / 'x').write_text('x')\n"
                 "except OSError: pass\n"
                 "else: sys.exit(3)", check=False)
    assert tls.returncode == 0, tls.stderr
    assert tls.stdout.strip() == str(sorted((f, "0o440", 0, 65532) for f in ("ca.crt", "tls.crt", "tls.key")))
    assert c.base_url.startswith("https://")


@pytest.mark.parametrize(("stage", "pod_kw", "allowed"), [
    # CPU stages stay off GPU nodes even though most nodes carry GPUs.
    ("data-prep", {"cpu": "2", "memory": "8Gi", "annotations": {ANN + "input-data-gb": "500"}}, {None}),
    ("deployment", {"cpu": "2", "memory": "8Gi", "model_params": "70B", "precision": "bf16"}, {None}),
    # 70B bf16 needs 80 GB-class GPUs; the pod *prefers* L4/T4, so only the extender keeps it off them.
    ("serving", {"model_params": "70B", "precision": "bf16", "max_ms_per_token": 30, "gpus": 4,
                 "affinity": prefer_gpus("L4", "T4")}, {"H100", "A100"}),
    ("pretraining", {"model_params": "7B", "gpus": 8}, {"H100", "A100"}),
    ("alignment", {"model_params": "7B", "precision": "bf16", "gpus": 8}, {"H100", "A100"}),
])
def test_each_stage_is_placed_by_the_extender_in_the_container(
    clean: Setup, stage: str, pod_kw: dict[str, Any], allowed: set[str | None]
) -> None:
    cp = clean.cp
    before = decisions(cp, stage)
    name = f"{stage}-0"
    create_pod(cp.core, NS, llm_pod(name, stage=stage, **pod_kw))
    node = clean.nodes[wait_for_node_name(cp.core, NS, name, timeout=90)]
    assert gpu_key(node) in allowed, f"{stage} landed on {node['metadata']['name']} ({gpu_key(node)})"
    # The bind went through the extender in the container (chart's bindVerb), counted by its stage.
    wait_until(lambda: decisions(cp, stage) > before, 20, f"the container to count the {stage} bind")


def test_a_gang_is_bound_whole_and_explained(clean: Setup) -> None:
    cp = clean.cp
    before = cp.metric_value("llm_placement_gangs_total", {"outcome": "bound"}) or 0.0
    members = [f"gang-{i}" for i in range(3)]
    for m in members:
        create_pod(cp.core, NS, llm_pod(m, stage="pretraining", gpus=8, annotations={ANN + "gang-size": "3"},
                                        labels={"scheduling.x-k8s.io/pod-group": "g1"}))
    placed = wait_for_node_names(cp.core, NS, members, timeout=120)
    assert len(set(placed.values())) == 3, placed
    wait_until(lambda: (cp.metric_value("llm_placement_gangs_total", {"outcome": "bound"}) or 0) > before,
               20, "the gang counted as bound")
    token = pod_reader_token(cp.api, NS, "reader")
    # /explain needs no client certificate (a bearer token instead), over the verbs' TLS port.
    with clean.container.client(certificate=False) as client:
        url = f"{clean.container.base_url}/explain/{NS}/{members[0]}"
        r = client.get(url, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        assert placed[members[0]] in r.text, "explain does not name the node the member was bound to"
        # /explain checks the caller with the API server (TokenReview): the container's own token works.
        assert client.get(url).status_code == 401


def test_a_caller_without_kube_schedulers_certificate_is_refused(clean: Setup) -> None:
    cp, c = clean.cp, clean.container
    # A pod no scheduler takes, so only this test's calls touch it.
    pod = llm_pod("forged", stage="serving", model_params="7B", precision="int8", gpus=1)
    pod["spec"]["schedulerName"] = "nobody"
    body = {"Pod": create_pod(cp.core, NS, pod), "Nodes": None, "NodeNames": ["c-l4-0"]}
    url = f"{c.base_url}{cp.extender_path}/filter"
    with c.client(certificate=False) as stranger, c.client() as scheduler:
        assert (stranger.post(url, json=body).status_code, scheduler.post(url, json=body).status_code) == (403, 200)


def test_the_probes_answer_over_https(clean: Setup, tmp_path: Path) -> None:
    c = clean.container
    # The chart's default (scheduler mode): exec probes to the loopback HTTPS port, run in the container.
    for which in ("startupProbe", "livenessProbe", "readinessProbe"):
        p = probe(c.spec, which)
        assert p.kind == "exec" and "https://127.0.0.1" in p.command[-1], p
        assert run_probe(c.name, p), which
    # default-scheduler mode: httpGet with scheme HTTPS on the same port, as the kubelet sends it.
    docs = render_chart(chart_values(clean.cp, mode="default-scheduler"), tmp_path)
    spec = next(x for d in docs if d["kind"] == "Deployment"
                for x in d["spec"]["template"]["spec"]["containers"] if x["name"] == "extender")
    for which in ("startupProbe", "livenessProbe", "readinessProbe"):
        p = probe(spec, which)
        assert (p.kind, p.scheme) == ("http", "HTTPS"), p
        assert run_probe(c.name, p), which
        # The same probe in plain HTTP fails: the port speaks only TLS.
        assert not run_probe(c.name, dataclasses.replace(p, scheme="HTTP")), which


def test_metrics_are_scraped_by_a_real_prometheus(clean: Setup, tmp_path: Path) -> None:
    cp = clean.cp
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "llm-placement",
                            "static_configs": [{"targets": [f"127.0.0.1:{cp.ports.extender_metrics}"]}]}],
    }))
    proc = Component("prometheus", [need_binary("prometheus"), f"--config.file={cfg}",
                                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                    f"--web.listen-address=127.0.0.1:{port}"], tmp_path / "prometheus.log")
    proc.start()
    try:
        def query(expr: str) -> list[dict[str, Any]]:
            body = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": expr}, timeout=10).json()
            result: list[dict[str, Any]] = body["data"]["result"] if body.get("status") == "success" else []
            return result

        def scraped() -> bool:
            res = query('llm_placement_cache_nodes{job="llm-placement"}')
            return bool(res) and float(res[0]["value"][1]) == len(clean.nodes)

        wait_until(scraped, 60, "prometheus to scrape the container's node-cache gauge", interval=0.5,
                   watch=[proc])
        assert query('up{job="llm-placement"} == 1'), "the container's /metrics target is not up"
    finally:
        proc.stop(timeout=15)


HOLD = {"key": ANN + "test-hold", "value": "hold", "effect": "NoSchedule"}
TOLERATE = {"key": ANN + "test-hold", "operator": "Equal", "value": "hold", "effect": "NoSchedule"}


def gang_plan(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    raw = (get_pod(cp.core, NS, name)["metadata"].get("annotations") or {}).get(ANN + "gang-plan")
    return json.loads(raw) if raw else None


def test_readiness_follows_the_watch_cache_and_a_killed_container_recovers(clean: Setup) -> None:
    cp, c = clean.cp, clean.container
    assert c.probe_passes("startupProbe") and c.probe_passes("livenessProbe") and c.probe_passes("readinessProbe")
    # A gang in flight when the process dies: member 2 exists (so the gang is planned and the plan
    # persisted on every member) but kube-scheduler cannot send it yet (a taint the others tolerate).
    eight = [n for n, node in clean.nodes.items() if gpu_key(node) in ("H100", "A100")]
    for n in eight:
        cp.core.patch_node(n, {"spec": {"taints": [HOLD]}}, _preload_content=False)
    members = [f"held-{i}" for i in range(3)]
    try:
        for i, m in enumerate(members):
            pod = llm_pod(m, stage="pretraining", gpus=8, annotations={ANN + "gang-size": "3"},
                          labels={"scheduling.x-k8s.io/pod-group": "held"})
            if i < 2:
                pod["spec"]["tolerations"] = [TOLERATE]
            create_pod(cp.core, NS, pod)
        wait_until(lambda: all(gang_plan(cp, m) for m in members), 90, "the gang plan persisted on every member")
        planned = {m: str((gang_plan(cp, m) or {})["node"]) for m in members}
        restarts = int(c.inspect("{{.RestartCount}}"))
        pid = int(c.inspect("{{.State.Pid}}"))
        # SIGKILL from outside, as an OOM kill would: Docker's restart policy (the pod's restartPolicy
        # Always) starts it again from the same image and config.
        os.kill(pid, 9)
        wait_until(lambda: not c.probe_passes("livenessProbe"), 10, "liveness to fail while the process is gone",
                   interval=0.05)
        first_ready_nodes: list[float | None] = []

        def ready_again() -> bool:
            if not c.probe_passes("readinessProbe"):
                return False
            # The first moment readiness passes, the watch-fed cache already holds every node.
            first_ready_nodes.append(cp.metric_value("llm_placement_cache_nodes"))
            return True

        wait_until(ready_again, READY_TIMEOUT, "the restarted container's readiness probe", interval=0.1)
        assert first_ready_nodes[0] == len(clean.nodes), first_ready_nodes
        assert int(c.inspect("{{.RestartCount}}")) == restarts + 1
        assert c.probe_passes("livenessProbe")
        assert not any(get_pod(cp.core, NS, m)["spec"].get("nodeName") for m in members)
        # Release member 2: the restarted process completes the gang whole, on the persisted plan.
        cp.core.patch_namespaced_pod(members[2], NS, {"spec": {"tolerations": [TOLERATE]}},
                                     _preload_content=False)
        placed = wait_for_node_names(cp.core, NS, members, timeout=120)
        assert placed == planned, (placed, planned)
    finally:
        for n in eight:
            cp.core.patch_node(n, {"spec": {"taints": None}}, _preload_content=False)
