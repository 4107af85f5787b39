"""Hostile inputs on the real control plane, with bounds (docs/extender-protocol.md; `make hostile`).

etcd + kube-apiserver + kube-scheduler (the chart's configuration) + the extender on loopback; nodes
registered by the script (no kubelets: pods are bound, never run). Three floods, each measured
against a quiet baseline in the same run:

* **Slice churn**: a driver publishes ``--slices`` ResourceSlices of ``--devices`` GPUs each on one
  node, then deletes them. Meanwhile a probe sends kube-scheduler's filter request for a GPU pod to
  the extender every 20 ms; bound: filter p99 under 50 ms during the churn.
* **Floods of pods that can never be placed**, ``--pods`` of one tenant each (``--floods``): the
  members of never-complete two-member gangs (``gangs``); pods naming a gang without a size
  (``no-size``); serving pods no GPU could hold, 405B at bf16 on one GPU (``never-fits``); and the
  gang members again, the tenant lifting the gang gate from each (``lifted-gate``). Another
  tenant's 16 one-GPU pods must bind within 2x the time they take on the quiet cluster, timed just
  before each flood (the median of three trials each). The chart's gang gate and pod guard are
  installed first (``--no-gang-gate``, ``--no-pod-guard``: without them, as a cluster older than
  1.36 runs).
* **YAML bomb**: ``llm-placement plan`` handed a 600-byte alias bomb must refuse it within 1 s and
  100 MB (bench/yaml_bomb.py measures the same in process).

    python -m bench.hostile                      # the full floods (make hostile)
    python -m bench.hostile --no-churn --pods 200   # a quick look

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import typer
import yaml
from kubernetes.client import AdmissionregistrationV1Api, CustomObjectsApi
from kubernetes.client.rest import ApiException
from rich.console import Console
from rich.table import Table

from kubeharness import (
    EXTENDER_USER,
    ControlPlane,
    create_nodes,
    create_pod,
    create_pods,
    delete_all_pods,
    ensure_namespace,
    find_binaries,
    gpu_node,
    list_pods,
    llm_pod,
)

REPO = Path(__file__).resolve().parents[1]

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


V1 = "admissionregistration.k8s.io/v1"
CHART_FILES = REPO / "helm" / "llm-placement" / "files"
GATE = "llm-placement.io/gang-incomplete"
# The floods (docs/gangs.md, "Held at admission" and "Refused at admission"), each of ``--pods``
# pods of one tenant: the members of never-complete two-member gangs; pods naming a gang without a
# size; plain serving pods no GPU could hold (405B at bf16 on one GPU: 810 GB of weights); and the
# gang members again, with the tenant lifting the gang gate from each.
FLOODS = ("gangs", "no-size", "never-fits", "lifted-gate")


def flood_pod(kind: str, i: int) -> dict[str, Any]:
    if kind == "never-fits":
        return llm_pod(f"n{i}", stage="serving", model_params="405B", gpus=1)
    ann = {"llm-placement.io/gang-name": f"g{i}"}
    if kind != "no-size":
        ann["llm-placement.io/gang-size"] = "2"
    return llm_pod(f"g{i}-0", stage="pretraining", gpus=1, annotations=ann)


def attempt(fn: Callable[[Any], object], items: list[Any], workers: int = 16) -> tuple[int, int]:
    """(done, refused by admission) of ``fn`` over ``items``."""
    def one(item: Any) -> bool:
        try:
            fn(item)
            return True
        except ApiException as exc:
            if exc.status in (400, 403, 422):
                return False
            raise
    with ThreadPoolExecutor(max_workers=workers) as ex:
        done = sum(ex.map(one, items))
    return done, len(items) - done


def wait_policy(cp: ControlPlane, probe: dict[str, Any], active: Callable[[str], bool], what: str) -> None:
    """Create ``probe`` until ``active`` says the policy acted on it (the API server loads policies
    asynchronously)."""
    ensure_namespace(cp.core, "probe")
    deadline = time.monotonic() + 60
    for i in range(10_000):
        pod = json.loads(json.dumps(probe))
        pod["metadata"]["name"] = name = f"probe-{i}"
        try:
            create_pods(cp.core, "probe", [pod])
        except ApiException as exc:
            if active(str(exc.body)):
                return
        else:
            gates = cp.core.read_namespaced_pod(name, "probe").spec.scheduling_gates or []
            cp.core.delete_namespaced_pod(name, "probe", grace_period_seconds=0)
            if active(",".join(g.name for g in gates)):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {what} policy did not take effect within 60 s")
        time.sleep(0.5)


def install_gang_gate(cp: ControlPlane) -> None:
    """The chart's gang-gate MutatingAdmissionPolicy (helm/llm-placement/files/gang-gate-policy.yaml)."""
    adm = AdmissionregistrationV1Api(cp.api)
    spec = yaml.safe_load((CHART_FILES / "gang-gate-policy.yaml").read_text())
    adm.create_mutating_admission_policy({"apiVersion": V1, "kind": "MutatingAdmissionPolicy",
                                          "metadata": {"name": "gang-gate"}, "spec": spec})
    adm.create_mutating_admission_policy_binding({
        "apiVersion": V1, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": "gang-gate"},
        "spec": {"policyName": "gang-gate"}})
    wait_policy(cp, flood_pod("gangs", 0), lambda said: GATE in said, "gang-gate")


def install_pod_guard(cp: ControlPlane) -> None:
    """The chart's pod-guard ValidatingAdmissionPolicy (helm/llm-placement/files/pod-guard-policy.yaml),
    the extender's identity left out as the chart leaves it out."""
    adm = AdmissionregistrationV1Api(cp.api)
    spec = yaml.safe_load((CHART_FILES / "pod-guard-policy.yaml").read_text())
    spec["matchConditions"] = [{"name": "not-llm-placement",
                                "expression": f"request.userInfo.username != '{EXTENDER_USER}'"}]
    adm.create_validating_admission_policy({"apiVersion": V1, "kind": "ValidatingAdmissionPolicy",
                                            "metadata": {"name": "pod-guard"}, "spec": spec})
    adm.create_validating_admission_policy_binding({
        "apiVersion": V1, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "pod-guard"},
        "spec": {"policyName": "pod-guard", "validationActions": ["Deny"]}})
    wait_policy(cp, flood_pod("never-fits", 0), lambda said: "no node can ever place" in said, "pod-guard")


TRIALS = 3


def tenant_times(cp: ControlPlane, namespace: str, timeout: float) -> list[float]:
    """The other tenant's 16 one-GPU pods, ``TRIALS`` times: seconds until bound, the pods deleted
    (their GPUs freed) after each. Well under a second each on a quiet cluster, so one trial is at
    the mercy of whatever else the machine runs; the median of three is what is compared."""
    out = []
    for i in range(TRIALS):
        out.append(bound_in(cp, f"{namespace}-{i}", 16, timeout))
        delete_all_pods(cp.core, f"{namespace}-{i}", timeout=120)
    return out


def flood(cp: ControlPlane, kind: str, count: int) -> dict[str, Any]:
    """One flood of ``count`` pods of one tenant; the other tenant timed quiet just before it, and
    under it. The flood's pods are deleted afterwards."""
    quiet_runs = tenant_times(cp, f"quiet-{kind}", 300)
    ns = f"flood-{kind}"
    ensure_namespace(cp.core, ns)
    pods = [flood_pod(kind, i) for i in range(count)]
    t = time.monotonic()
    created, refused = attempt(lambda m: create_pod(cp.core, ns, m), pods)
    out: dict[str, Any] = {"pods": count, "created": created, "refused_at_creation": refused}
    if kind == "lifted-gate":
        lift = {"spec": {"schedulingGates": [{"$patch": "delete", "name": GATE}]}}
        names = [p["metadata"]["name"] for p in list_pods(cp.core, ns)]
        out["gates_lifted"], out["lifts_refused"] = attempt(lambda n: cp.core.patch_namespaced_pod(
            n, ns, lift, _content_type="application/strategic-merge-patch+json"), names)
    out["flood_s"] = round(time.monotonic() - t, 1)
    flooded_runs = tenant_times(cp, f"busy-{kind}", 900)
    left = list_pods(cp.core, ns)
    out["gated_left"] = sum(1 for p in left if (p.get("spec") or {}).get("schedulingGates"))
    out["in_queue_left"] = sum(1 for p in left if not (p.get("spec") or {}).get("schedulingGates")
                               and not (p.get("spec") or {}).get("nodeName"))
    delete_all_pods(cp.core, ns, timeout=600)
    quiet, flooded = statistics.median(quiet_runs), statistics.median(flooded_runs)
    out.update(tenant_quiet_s=round(quiet, 2), tenant_flooded_s=round(flooded, 2),
               ratio=round(flooded / quiet, 2) if quiet else None,
               tenant_quiet_runs_s=[round(t, 2) for t in quiet_runs],
               tenant_flooded_runs_s=[round(t, 2) for t in flooded_runs])
    return out


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
    pods: int = typer.Option(4000, help="pods of the flooding tenant, per flood"),
    floods: str = typer.Option(",".join(FLOODS), help=f"which floods, comma-separated: {', '.join(FLOODS)}"),
    gang_gate: bool = typer.Option(True, help="the chart's gang gate installed (docs/gangs.md, "
                                               "\"Held at admission\"); --no-gang-gate: without it"),
    pod_guard: bool = typer.Option(True, help="the chart's pod guard installed (docs/gangs.md, "
                                               "\"Refused at admission\"); --no-pod-guard: without it"),
    churn_slices: bool = typer.Option(True, "--churn/--no-churn", help="run the slice churn"),
    out: Path = typer.Option(RESULTS / "hostile.json", help="where the JSON goes"),
) -> None:
    kinds = [k.strip() for k in floods.split(",") if k.strip()]
    if bad := [k for k in kinds if k not in FLOODS]:
        raise typer.BadParameter(f"unknown flood {bad[0]!r}; one of {', '.join(FLOODS)}")
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
        console.print(f"hostile: control plane up, {len(nodes)} nodes")
        results: dict[str, Any] = {}
        if churn_slices:
            console.print("hostile: slice churn ...")
            results["slice_churn"] = churn(cp, "big", slices, devices, nodes)
        if gang_gate:
            install_gang_gate(cp)
        if pod_guard:
            install_pod_guard(cp)
        for kind in kinds:
            console.print(f"hostile: {kind} flood of {pods} pods ...")
            results[f"flood_{kind}"] = dict(flood(cp, kind, pods), gang_gate=gang_gate, pod_guard=pod_guard)
        results["yaml_bomb"] = bomb
        checks = {
            **({f"filter p99 during the churn < {FILTER_P99_MS:g} ms":
                results["slice_churn"]["churn_p99_ms"] < FILTER_P99_MS} if churn_slices else {}),
            **{f"other tenant within {TENANT_RATIO:g}x under the {kind} flood":
               (results[f"flood_{kind}"]["ratio"] or 99) <= TENANT_RATIO for kind in kinds},
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
