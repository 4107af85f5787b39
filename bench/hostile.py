"""Hostile inputs on the real control plane, with bounds (docs/extender-protocol.md; `make hostile`).

etcd + kube-apiserver + kube-scheduler (the chart's configuration) + the extender on loopback; nodes
registered by the script (no kubelets: pods are bound, never run). Three floods, each measured
against a quiet baseline in the same run:

* **Slice churn**: a driver publishes ``--slices`` ResourceSlices of ``--devices`` GPUs each on one
  node, then deletes them. Meanwhile a probe sends kube-scheduler's filter request for a GPU pod to
  the extender every 20 ms; bound: filter p99 under 50 ms during the churn.
* **Gang flood**: one tenant creates ``--gangs`` two-member gangs with one member each (never
  complete); another tenant's 16 one-GPU pods must then bind within 2x the time they take on the
  quiet cluster. The chart's gang gate is installed first (``--no-gang-gate``: without it, as a
  cluster older than 1.36 runs).
* **YAML bomb**: ``llm-placement plan`` handed a 600-byte alias bomb must refuse it within 1 s and
  100 MB (bench/yaml_bomb.py measures the same in process).

    python bench/hostile.py                      # the full floods (make hostile)
    python bench/hostile.py --slices 50 --gangs 200   # a quick look

Figures go to ``bench/results/hostile.json``; the exit code is 1 when a bound is missed.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import typer
import yaml
from kubernetes.client import AdmissionregistrationV1Api, CustomObjectsApi
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.harness import (  # noqa: E402
    ControlPlane,
    create_nodes,
    create_pods,
    ensure_namespace,
    find_binaries,
    gpu_node,
    list_pods,
    llm_pod,
)

RESULTS = REPO / "bench" / "results"
DRIVER = "gpu.nvidia.com"
console = Console(width=120)
FILTER_P99_MS = 50.0
TENANT_RATIO = 2.0
BOMB_SECONDS, BOMB_MB = 1.0, 100.0


def slice_manifest(i: int, node: str, devices: int) -> dict[str, Any]:
    devs = [{"name": f"gpu-{i}-{j}", "attributes": {"type": {"string": "gpu"},
                                                   "productName": {"string": "NVIDIA H100 80GB HBM3"}},
             "capacity": {"memory": {"value": "81559Mi"}}} for j in range(devices)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-churn-{i}"},
            "spec": {"driver": DRIVER, "nodeName": node, "devices": devs,
                     "pool": {"name": f"{node}-churn-{i}", "generation": 1, "resourceSliceCount": 1}}}


class FilterProbe:
    """kube-scheduler's filter request for a 1-GPU serving pod, every ``interval`` s, timed."""

    def __init__(self, url: str, nodes: list[str], interval: float = 0.02) -> None:
        pod = llm_pod("probe", stage="serving", model_params="7B", gpus=1)
        pod["metadata"].update(namespace="probe", uid="probe-uid")
        self.body = json.dumps({"Pod": pod, "NodeNames": nodes}).encode()
        self.url, self.interval = url.rstrip("/") + "/filter", interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._stop.is_set():
                t = time.perf_counter()
                http.post(self.url, content=self.body, headers={"Content-Type": "application/json"})
                self.samples.append((time.perf_counter() - t) * 1e3)
                self._stop.wait(self.interval)

    def __enter__(self) -> FilterProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else 0.0)


def churn(cp: ControlPlane, node: str, slices: int, devices: int, nodes: list[str]) -> dict[str, Any]:
    custom = CustomObjectsApi(cp.api)
    with FilterProbe(cp.extender_url, nodes) as quiet:
        time.sleep(5)
    with FilterProbe(cp.extender_url, nodes) as busy:
        t = time.monotonic()
        for i in range(slices):
            custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                slice_manifest(i, node, devices))
        created = time.monotonic() - t
        for i in range(slices):
            custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                f"{node}-churn-{i}")
        total = time.monotonic() - t
        time.sleep(2)  # the tail of the deletes reaching the extender
    return {"slices": slices, "devices_per_slice": devices, "create_s": round(created, 1),
            "create_delete_s": round(total, 1), "quiet_p50_ms": round(pct(quiet.samples, 50), 2),
            "quiet_p99_ms": round(pct(quiet.samples, 99), 2), "probes": len(busy.samples),
            "churn_p50_ms": round(pct(busy.samples, 50), 2), "churn_p99_ms": round(pct(busy.samples, 99), 2),
            "churn_max_ms": round(max(busy.samples, default=0.0), 2)}


def bound_in(cp: ControlPlane, namespace: str, count: int, timeout: float) -> float:
    """Seconds until ``count`` one-GPU pods created now in ``namespace`` are all bound."""
    ensure_namespace(cp.core, namespace)
    t = time.monotonic()
    create_pods(cp.core, namespace, [llm_pod(f"p{i}", stage="alignment", model_params="1B", gpus=1)
                                     for i in range(count)])
    while time.monotonic() - t < timeout:
        pods = list_pods(cp.core, namespace)
        if sum(1 for p in pods if (p.get("spec") or {}).get("nodeName")) >= count:
            return time.monotonic() - t
        time.sleep(0.2)
    return float("inf")


def install_gang_gate(cp: ControlPlane) -> None:
    """The chart's gang-gate MutatingAdmissionPolicy (helm/llm-placement/files/gang-gate-policy.yaml),
    active once a probe member is created gated (the API server loads policies asynchronously)."""
    adm = AdmissionregistrationV1Api(cp.api)
    spec = yaml.safe_load((REPO / "helm" / "llm-placement" / "files" / "gang-gate-policy.yaml").read_text())
    v1 = "admissionregistration.k8s.io/v1"
    adm.create_mutating_admission_policy({"apiVersion": v1, "kind": "MutatingAdmissionPolicy",
                                          "metadata": {"name": "gang-gate"}, "spec": spec})
    adm.create_mutating_admission_policy_binding({
        "apiVersion": v1, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": "gang-gate"},
        "spec": {"policyName": "gang-gate"}})
    ensure_namespace(cp.core, "probe")
    deadline = time.monotonic() + 60
    for i in range(10_000):
        name = f"probe-{i}"
        create_pods(cp.core, "probe", [llm_pod(name, stage="pretraining", gpus=1, annotations={
            "llm-placement.io/gang-name": f"probe-{i}", "llm-placement.io/gang-size": "2"})])
        gates = cp.core.read_namespaced_pod(name, "probe").spec.scheduling_gates or []
        cp.core.delete_namespaced_pod(name, "probe", grace_period_seconds=0)
        if gates:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the gang-gate policy did not take effect within 60 s")
        time.sleep(0.5)


def flood(cp: ControlPlane, gangs: int, gang_gate: bool) -> dict[str, Any]:
    quiet = bound_in(cp, "tenant-quiet", 16, 300)
    if gang_gate:
        install_gang_gate(cp)
    ensure_namespace(cp.core, "flood")
    t = time.monotonic()
    members = [llm_pod(f"g{i}-0", stage="pretraining", gpus=1, annotations={
        "llm-placement.io/gang-name": f"g{i}", "llm-placement.io/gang-size": "2"}) for i in range(gangs)]
    create_pods(cp.core, "flood", members, workers=16)
    created = time.monotonic() - t
    flooded = bound_in(cp, "tenant-busy", 16, 600)
    gated = sum(1 for p in list_pods(cp.core, "flood") if (p.get("spec") or {}).get("schedulingGates"))
    return {"gangs": gangs, "gang_gate": gang_gate, "gated_members": gated,
            "flood_create_s": round(created, 1), "tenant_quiet_s": round(quiet, 2),
            "tenant_flooded_s": round(flooded, 2), "ratio": round(flooded / quiet, 2) if quiet else None}


def yaml_bomb(workdir: Path) -> dict[str, Any]:
    lines = ['a0: &a0 "x"'] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    lines.append("tasks: *a9")
    bomb = workdir / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    t = time.monotonic()
    cli = Path(sys.executable).parent / "llm-placement"
    got = subprocess.run([str(cli), "plan", str(bomb)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    took = time.monotonic() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    said = (got.stderr or got.stdout).strip().splitlines()
    return {"bytes": bomb.stat().st_size, "exit": got.returncode, "seconds": round(took, 2),
            "max_rss_mb": round(rss / 1024, 1), "message": said[-1][:200] if said else ""}


def main(
    slices: int = typer.Option(800, help="ResourceSlices published on one node, then deleted"),
    devices: int = typer.Option(128, help="GPUs per slice"),
    gangs: int = typer.Option(4000, help="incomplete two-member gangs of the flooding tenant"),
    gang_gate: bool = typer.Option(True, help="the chart's gang gate installed (docs/gangs.md, "
                                               "\"Held at admission\"); --no-gang-gate: without it"),
    out: Path = typer.Option(RESULTS / "hostile.json", help="where the JSON goes"),
) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="llmp-hostile-", dir=os.environ.get("LLMP_TEST_WORKDIR")))
    # First, while this process has no other child: its children's peak RSS is then the planner's.
    bomb = yaml_bomb(workdir)
    cp = ControlPlane(workdir, find_binaries(build=True))
    cp.start()
    ok = False
    try:
        nodes = create_nodes(cp.core, [gpu_node(f"h{i}", "H100", gpus=8, index=i) for i in range(8)]
                             + [gpu_node("big", "H100", gpus=0, index=9)])
        cp.wait_extender_cache_nodes(len(nodes), timeout=60)
        console.print(f"hostile: control plane up, {len(nodes)} nodes; slice churn ...")
        results: dict[str, Any] = {"slice_churn": churn(cp, "big", slices, devices, nodes)}
        console.print("hostile: gang flood ...")
        results["gang_flood"] = flood(cp, gangs, gang_gate)
        results["yaml_bomb"] = bomb
        checks = {
            f"filter p99 during the churn < {FILTER_P99_MS:g} ms":
                results["slice_churn"]["churn_p99_ms"] < FILTER_P99_MS,
            f"other tenant within {TENANT_RATIO:g}x under the flood":
                (results["gang_flood"]["ratio"] or 99) <= TENANT_RATIO,
            f"bomb refused within {BOMB_SECONDS:g} s and {BOMB_MB:g} MB":
                results["yaml_bomb"]["exit"] == 2 and results["yaml_bomb"]["seconds"] < BOMB_SECONDS
                and results["yaml_bomb"]["max_rss_mb"] < BOMB_MB,
        }
        table = Table(title="hostile inputs on the real control plane")
        table.add_column("flood")
        table.add_column("figures")
        for name, figures in results.items():
            table.add_row(name, ", ".join(f"{k} {v}" for k, v in figures.items()))
        for name, passed in checks.items():
            table.add_row(("met: " if passed else "MISSED: ") + name, "")
        console.print(table)
        results["checks"] = checks
        results["cores"], results["load_avg_end"] = os.cpu_count(), os.getloadavg()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        ok = all(checks.values())
    finally:
        cp.stop()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            console.print(f"hostile: logs kept in {workdir / 'logs'}")
    if not ok:
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
