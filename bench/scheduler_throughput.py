"""Pods/s scheduled by the real kube-scheduler with our extender vs the same profile without it.

    python -m bench.scheduler_throughput                  # 500 and 5,000 nodes, 2,000 pods (~15 min)
    python -m bench.scheduler_throughput --quick          # 100 nodes, 200 pods (~1 min)
    python -m bench.scheduler_throughput --nodes 500 --pods 2000 --json out.json

One control plane (etcd, kube-apiserver, our extender) for the whole run, started by the integration
suite's harness (kubeharness), so the binaries, certificates, RBAC and the scheduler
configuration are exactly those of the tests: the Helm chart's KubeSchedulerConfiguration with local
overrides only. For each node count the same nodes serve both variants:

* ``no-extender``: the chart's profile with the ``extenders`` entry removed (in-tree plugins only,
  kube-scheduler binds);
* ``extender``: the chart's profile as shipped (filter + prioritize + bind through the extender).

Method ("backlog", as in docs/control-plane.md, section 5): kube-scheduler is stopped, the
pods are created, kube-scheduler is started, and the clock runs from its exec until the last pod has
``spec.nodeName`` (seen on a watch, so the end time is exact). ``steady`` excludes start-up: binds
after the first one divided by the time from the first to the last bind. Between variants the pods
are deleted and the extender's cache is waited on until it holds none of them.

Per-verb latency comes from the extender's own histogram ``llm_placement_request_duration_seconds``
(delta over the extender run); p50/p99 are interpolated inside its buckets (as PromQL's
histogram_quantile does), so they are only as fine as the buckets; the mean is exact (sum/count).

Pod mix (same manifests for both variants): 80% serving 7B int8 on 1 GPU, 10% serving 70B bf16 on 4
GPUs, 10% data-prep with no GPU. Node mix: 20% H100, 20% A100, 35% L4, 20% T4 (8 GPUs each), 5% CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kubernetes.client import CoreV1Api

from kubeharness import (
    ControlPlane,
    cpu_node,
    create_nodes,
    create_pods,
    delete_all_pods,
    delete_nodes,
    ensure_namespace,
    find_binaries,
    gpu_node,
    list_pods,
    llm_pod,
    pod_events,
    wait_until,
)
from kubeharness.controlplane import metric_value
from kubeharness.podwatch import list_then_watch
from kubeharness.procs import Component, free_port

REPO = Path(__file__).resolve().parents[1]

LATENCY_METRIC = "llm_placement_request_duration_seconds"
SCHED_ALGO_METRIC = "scheduler_scheduling_algorithm_duration_seconds"
VERBS = ("filter", "prioritize", "bind", "preempt")


# ----- workload ----------------------------------------------------------------------------------
def bench_nodes(count: int, prefix: str) -> list[dict[str, Any]]:
    """A deterministic mix; GPU types interleaved so no type clusters at one end of the node order."""
    pattern = [
        "H100",
        "L4",
        "A100",
        "T4",
        "L4",
        "H100",
        "L4",
        "A100",
        "T4",
        "L4",
        "H100",
        "L4",
        "A100",
        "T4",
        "L4",
        "H100",
        "L4",
        "A100",
        "T4",
        "CPU",
    ]  # 20 slots = 5% CPU
    out = []
    for i in range(count):
        kind = pattern[i % len(pattern)]
        name = f"{prefix}-{i:05d}"
        zone = f"zone-{'abc'[i % 3]}"
        if kind == "CPU":
            out.append(cpu_node(name, "cpu", zone=zone, index=i))
        else:
            # H100/A100 nodes carry InfiniBand, as training fleets do: a gang spanning nodes needs it.
            out.append(gpu_node(name, kind, gpus=8, zone=zone, tier0=f"leaf-{i // 32}",
                                tier1=f"spine-{i // 256}", rdma=kind in ("H100", "A100"), index=i))
    return out


def gang_pods(count: int, gang: bool) -> list[dict[str, Any]]:
    """``count`` 8-GPU training pods: one gang of that size (label + gang-size, docs/gangs.md) or
    the same pods with no gang, to time all-or-nothing placement against plain placement."""
    out = []
    for i in range(count):
        ann = {"llm-placement.io/gang-size": str(count)} if gang else {}
        labels = {"scheduling.x-k8s.io/pod-group": "bench-gang"} if gang else None
        out.append(llm_pod(f"{'g' if gang else 'q'}-{i:05d}", stage="pretraining", gpus=8,
                           annotations=ann, labels=labels))
    return out


def bench_pods(count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        name = f"p-{i:05d}"
        slot = i % 10
        if slot == 0:
            out.append(llm_pod(name, stage="serving", model_params="70B", precision="bf16", gpus=4))
        elif slot == 1:
            out.append(llm_pod(name, stage="data-prep", cpu="2", memory="4Gi"))
        else:
            out.append(llm_pod(name, stage="serving", model_params="7B", precision="int8", gpus=1))
    return out


# ----- measurement -------------------------------------------------------------------------------
class BindWatcher(threading.Thread):
    """Records the time each pod of a namespace first shows ``spec.nodeName`` (list, then watch)."""

    def __init__(self, core: CoreV1Api, namespace: str, total: int) -> None:
        super().__init__(daemon=True, name=f"watch-{namespace}")
        self.core, self.namespace, self.total = core, namespace, total
        self.bound: dict[str, float] = {}
        self.done = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _see(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if pod["spec"].get("nodeName") and name not in self.bound:
            self.bound[name] = time.monotonic()
            if len(self.bound) >= self.total:
                self.done.set()

    def run(self) -> None:
        def listed(items: list[dict[str, Any]]) -> None:
            for p in items:
                self._see(p)

        try:
            list_then_watch(self.core, self.namespace, on_list=listed,
                            on_event=lambda kind, pod: self._see(pod) if kind != "DELETED" else None,
                            stop=lambda: self.stop.is_set() or self.done.is_set())
        except BaseException as exc:  # reported by the main thread
            self.error = exc
            self.done.set()


@dataclass
class VerbLatency:
    verb: str
    count: int
    mean_ms: float
    p50_ms: float | None
    p99_ms: float | None


def scheduler_cycle(cp: ControlPlane) -> VerbLatency | None:
    """kube-scheduler's own view: the scheduling algorithm (filter + score, extender calls included)."""
    text = httpx.get(f"https://127.0.0.1:{cp.ports.scheduler}/metrics", verify=False, timeout=10).text
    b, total, n = histogram(text, SCHED_ALGO_METRIC, {})
    if n <= 0:
        return None
    p50, p99 = quantile(0.5, b), quantile(0.99, b)
    return VerbLatency(
        "algorithm",
        int(n),
        total / n * 1e3,
        None if p50 is None else p50 * 1e3,
        None if p99 is None else p99 * 1e3,
    )


@dataclass
class RunResult:
    nodes: int
    pods: int
    variant: str
    bound: int
    seconds: float  # scheduler exec -> last bind
    pods_per_s: float
    steady_pods_per_s: float
    verbs: list[VerbLatency] = field(default_factory=list)
    cycle: VerbLatency | None = None  # kube-scheduler's scheduling_algorithm_duration
    # CPU seconds each process spent from kube-scheduler's start to the last bind: on a 2-core machine
    # every component competes for the same cores, so this is where the cycle's time really goes.
    cpu_s: dict[str, float] = field(default_factory=dict)
    # kube-apiserver requests served in the same window, "VERB resource[/subresource]" -> count.
    api_requests: dict[str, int] = field(default_factory=dict)
    # kube-apiserver's own seconds spent on those requests (POSTs), "seconds VERB resource" -> s.
    api_requests_s: dict[str, float] = field(default_factory=dict)


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU of one process (all its threads) from /proc; 0 when it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is field 3, utime and stime are fields 14 and 15 (man 5 proc).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


REQUEST_LINE = re.compile(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$", re.M)
# Watch traffic: every object change is sent to every watcher of its resource, so the events sent
# (and their bytes) are work kube-apiserver does per pod beyond the requests.
WATCH_LINE = re.compile(r"^apiserver_watch_events_(total|sizes_sum)\{([^}]*)\} ([0-9.e+]+)$", re.M)
# Its own time per request (the writes' latency as the API server sees it, etcd included), to tell
# a slow bind answer spent in the API server from one spent in the extender.
LATENCY_LINE = re.compile(r"^apiserver_request_duration_seconds_sum\{([^}]*)\} ([0-9.e+]+)$", re.M)


def api_requests(cp: ControlPlane) -> dict[str, float]:
    """kube-apiserver's own request counter, summed per verb and resource (watches counted once),
    and its watch events sent ("watch-events <resource>") and their bytes ("watch-bytes ...")."""
    text = httpx.get(f"{cp.server}/metrics", verify=cp._https(), timeout=10).text
    out: dict[str, float] = {}
    for labels, value in REQUEST_LINE.findall(text):
        d = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = f"{d.get('verb')} {d.get('resource')}" + (
            f"/{d['subresource']}" if d.get("subresource") else ""
        )
        out[key] = out.get(key, 0.0) + float(value)
    for kind, labels, value in WATCH_LINE.findall(text):
        d = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        what = d.get("resource") or d.get("kind") or "?"
        key = f"{'watch-events' if kind == 'total' else 'watch-bytes'} {what}"
        out[key] = out.get(key, 0.0) + float(value)
    for labels, value in LATENCY_LINE.findall(text):
        d = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if d.get("verb") == "POST":
            sub = f"/{d['subresource']}" if d.get("subresource") else ""
            key = f"seconds POST {d.get('resource')}{sub}"
            out[key] = out.get(key, 0.0) + float(value)
    return out


def component_cpu(cp: ControlPlane) -> dict[str, float]:
    out = {
        c: cpu_seconds(getattr(cp, c).pid if getattr(cp, c) else None)
        for c in ("etcd", "apiserver", "scheduler", "extender")
    }
    out["bench"] = sum(os.times()[:2])
    return out


def histogram(text: str, name: str, labels: dict[str, str]) -> tuple[dict[float, float], float, float]:
    """Cumulative buckets (le -> count), sum and count of the series of ``name`` matching ``labels``
    (summed over any other labels)."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "_bucket{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[line.index("{") : line.rindex("}")]))
        if any(found.get(k) != v for k, v in labels.items()):
            continue
        le = found["le"]
        key = math.inf if le == "+Inf" else float(le)
        buckets[key] = buckets.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    total = metric_value(text, name + "_sum", labels) or 0.0
    count = metric_value(text, name + "_count", labels) or 0.0
    return buckets, total, count


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """histogram_quantile over cumulative buckets (linear inside the bucket); seconds."""
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le in bounds:
        c = buckets[le]
        if c >= rank:
            if math.isinf(le):
                return prev_le  # beyond the last finite bucket: report its bound (a lower bound)
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def verb_latencies(before: str, after: str) -> list[VerbLatency]:
    out = []
    for verb in VERBS:
        b0, s0, c0 = histogram(before, LATENCY_METRIC, {"verb": verb})
        b1, s1, c1 = histogram(after, LATENCY_METRIC, {"verb": verb})
        n = c1 - c0
        if n <= 0:
            continue
        delta = {le: b1[le] - b0.get(le, 0.0) for le in b1}
        p50, p99 = quantile(0.5, delta), quantile(0.99, delta)
        out.append(
            VerbLatency(
                verb,
                int(n),
                (s1 - s0) / n * 1e3,
                None if p50 is None else p50 * 1e3,
                None if p99 is None else p99 * 1e3,
            )
        )
    return out


# ----- one run -----------------------------------------------------------------------------------
def report_unbound(core: CoreV1Api, namespace: str, sample: int = 40) -> None:
    """Why pods were left: the latest scheduling message of up to ``sample`` unbound pods, counted."""
    unbound = [p for p in list_pods(core, namespace) if not p["spec"].get("nodeName")]
    why: dict[str, int] = {}
    for p in unbound[:sample]:
        events = [
            e
            for e in pod_events(core, namespace, p["metadata"]["name"])
            if e.get("reason") == "FailedScheduling"
        ]
        msg = str(events[-1].get("message") or "")[:240] if events else "(no FailedScheduling event)"
        why[msg] = why.get(msg, 0) + 1
    shown = min(sample, len(unbound))
    print(f"  {len(unbound)} pods unbound; latest message of {shown} of them:", flush=True)
    for msg, n in sorted(why.items(), key=lambda kv: -kv[1]):
        print(f"    {n} x {msg}", flush=True)


NULL_VARIANTS = {"null": [], "null-bind-only": ["--no-event"]}


class NullExtender:
    """bench/null_extender.py as a child process, and kube-scheduler's config pointing at it."""

    def __init__(self, cp: ControlPlane, variant: str) -> None:
        self.port = free_port()
        argv = [sys.executable, str(REPO / "bench" / "null_extender.py"), "--port", str(self.port),
                "--kubeconfig", str(cp.admin_kubeconfig), "--prefix", cp.extender_path,
                *NULL_VARIANTS[variant]]
        self.proc = Component(variant, argv, cp.logdir / f"{variant}.log", cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        self.proc.start()
        base = f"http://127.0.0.1:{self.port}"
        wait_until(lambda: _ok(f"{base}/readyz"), 30, f"{variant} to answer", interval=0.2)
        self.cpu0 = cpu_seconds(self.proc.pid)  # its start-up is not the run's
        extenders = cp.scheduler_config(with_extender=True)["extenders"]
        for ext in extenders:
            ext["urlPrefix"] = f"{base}{cp.extender_path}"
        self.overrides = {"extenders": extenders}

    def stop(self) -> None:
        self.proc.stop()


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def run_variant(
    cp: ControlPlane,
    n_nodes: int,
    pods: list[dict[str, Any]],
    variant: str,
    node_cache_capable: bool | None,
    stall: float,
    profile: Path | None = None,
) -> RunResult:
    core = cp.core
    ns = f"bench-{n_nodes}-{variant}"
    ensure_namespace(core, ns)
    cp.stop_scheduler()
    t = time.monotonic()
    create_pods(core, ns, pods, workers=16)
    print(
        f"  {variant}: created {len(pods)} pods in {time.monotonic() - t:.1f}s; starting kube-scheduler",
        flush=True,
    )
    metrics_before = cp.extender_metrics()
    watcher = BindWatcher(core, ns, len(pods))
    watcher.start()
    cpu_before = component_cpu(cp)
    req_before = api_requests(cp)
    t_exec = time.monotonic()
    null = NullExtender(cp, variant) if variant in NULL_VARIANTS else None
    with_ext = variant != "no-extender" and null is None  # ours
    cp.start_scheduler(with_extender=variant != "no-extender", node_cache_capable=node_cache_capable,
                       overrides=null.overrides if null else None)
    spy = start_profile(cp, profile) if profile and with_ext else None
    go_prof = (start_scheduler_profile(cp, profile.with_name(f"{profile.stem}-{variant}.pprof"))
               if profile else None)
    last_progress, seen = time.monotonic(), 0
    cpu_after, req_after = cpu_before, req_before
    while not watcher.done.wait(1.0):
        cp.check_alive()
        if len(watcher.bound) != seen:
            seen, last_progress = len(watcher.bound), time.monotonic()
            # Read at the last progress, so pods left Pending do not charge their retries to the rest.
            cpu_after, req_after = component_cpu(cp), api_requests(cp)
        elif time.monotonic() - last_progress > stall:
            print(f"  {variant}: no bind for {stall:.0f}s, stopping at {seen}/{len(pods)}", flush=True)
            report_unbound(core, ns)
            break
    watcher.stop.set()
    if watcher.error:
        raise watcher.error
    times = sorted(watcher.bound.values())
    if watcher.done.is_set() and len(watcher.bound) >= len(pods):
        cpu_after, req_after = component_cpu(cp), api_requests(cp)
    if spy is not None:
        spy.wait()
    if go_prof is not None:
        go_prof.join()
        report_scheduler_profile(variant, go_prof.out)
    metrics_after = cp.extender_metrics()
    cycle = scheduler_cycle(cp)
    cp.stop_scheduler()
    null_cpu = 0.0
    if null is not None:
        null_cpu = cpu_seconds(null.proc.pid) - null.cpu0
        null.stop()
    bound = len(times)
    seconds = (times[-1] - t_exec) if times else float("nan")
    steady = (bound - 1) / (times[-1] - times[0]) if bound > 1 and times[-1] > times[0] else float("nan")
    result = RunResult(n_nodes, len(pods), variant, bound, seconds, bound / seconds if times else 0.0, steady)
    result.cycle = cycle
    result.api_requests = {
        k: int(v - req_before.get(k, 0.0))
        for k, v in sorted(req_after.items())
        if v - req_before.get(k, 0.0) >= 1 and not k.startswith("seconds ")
    }
    result.api_requests_s = {
        k: round(v - req_before.get(k, 0.0), 4)
        for k, v in sorted(req_after.items())
        if k.startswith("seconds ")
    }
    result.cpu_s = {k: round(cpu_after[k] - cpu_before.get(k, 0.0), 2) for k in cpu_after}
    if null is not None:
        result.cpu_s["null"] = round(null_cpu, 2)
    if with_ext:
        result.verbs = verb_latencies(metrics_before, metrics_after)
    # Leave nothing behind that would hold capacity in the next run (scheduler or extender cache).
    delete_all_pods(core, ns, timeout=300)
    wait_until(
        lambda: (cp.metric_value("llm_placement_cache_pods") or 0) == 0,
        120,
        "the extender's cache to drop the deleted pods",
        interval=0.5,
    )
    print(
        f"  {variant}: {bound}/{len(pods)} bound in {seconds:.2f}s -> {result.pods_per_s:.1f} pods/s "
        f"(steady {steady:.1f})",
        flush=True,
    )
    return result


def fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def report(results: list[RunResult], args: argparse.Namespace, cp: ControlPlane) -> None:
    cfg = cp.scheduler_config()
    conn = cfg.get("clientConnection") or {}
    ext = cfg["extenders"][0]
    print()
    print(
        f"kube-scheduler {cp.bins.kube_scheduler.parent.name}, config (chart + local overrides): "
        f"percentageOfNodesToScore={cfg.get('percentageOfNodesToScore')}, "
        f"clientConnection qps={conn.get('qps', '50 (default)')} burst={conn.get('burst', '100 (default)')}, "
        f"extender weight={ext.get('weight')} nodeCacheCapable="
        f"{ext.get('nodeCacheCapable') if args.node_cache_capable is None else args.node_cache_capable}"
    )
    print()
    print("| nodes | pods | variant | bound | seconds | pods/s | steady pods/s | ratio (ext / no-ext) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    by_nodes: dict[int, dict[str, list[RunResult]]] = {}
    for r in results:
        by_nodes.setdefault(r.nodes, {}).setdefault(r.variant, []).append(r)
    for n, variants in by_nodes.items():
        base = (
            statistics.median(r.pods_per_s for r in variants.get("no-extender", []))
            if variants.get("no-extender")
            else float("nan")
        )
        for variant in ("no-extender", "extender", *NULL_VARIANTS, "plain-8gpu", "gang"):
            for r in variants.get(variant, []):
                ratio = fmt(r.pods_per_s / base, 2) if variant != "no-extender" and base > 0 else ""
                print(
                    f"| {n} | {r.pods} | {variant} | {r.bound} | {fmt(r.seconds, 2)} | {fmt(r.pods_per_s)} "
                    f"| {fmt(r.steady_pods_per_s)} | {ratio} |"
                )
    print()
    print(
        f"Extender latency per verb, from its own histogram {LATENCY_METRIC} "
        "(p50/p99 interpolated in its buckets; mean exact):"
    )
    print()
    print("| nodes | verb | calls | mean ms | p50 ms | p99 ms |")
    print("|---:|---|---:|---:|---:|---:|")
    any_verbs = False
    for r in results:
        for v in r.verbs:
            any_verbs = True
            print(
                f"| {r.nodes} | {v.verb} | {v.count} | {fmt(v.mean_ms, 2)} | {fmt(v.p50_ms, 2)} "
                f"| {fmt(v.p99_ms, 2)} |"
            )
    if not any_verbs:
        print(
            f"(no {LATENCY_METRIC} samples: the extender does not export the metric; the table below is "
            "the client side, kube-scheduler's own measurement of each cycle)"
        )
    print()
    print(f"kube-scheduler's own view, {SCHED_ALGO_METRIC} per scheduling cycle (filter + score,")
    print("extender round trips included; its buckets double from 1 ms, so p50/p99 are coarse):")
    print()
    print("| nodes | variant | cycles | mean ms | p50 ms | p99 ms |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in results:
        if r.cycle:
            c = r.cycle
            print(
                f"| {r.nodes} | {r.variant} | {c.count} | {fmt(c.mean_ms, 2)} | {fmt(c.p50_ms, 2)} "
                f"| {fmt(c.p99_ms, 2)} |"
            )


def start_profile(cp: ControlPlane, out: Path) -> subprocess.Popen[bytes]:
    """py-spy on the extender for the first 15 s of its run: raw stacks with thread names."""
    assert cp.extender is not None and cp.extender.pid is not None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [spy, "record", "-p", str(cp.extender.pid), "-d", "15", "-r", "100", "--nonblocking",
            "-f", "raw", "--threads", "-o", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class SchedulerProfile(threading.Thread):
    """kube-scheduler's own CPU profile (Go pprof, 15 s) taken while it schedules the pods."""

    def __init__(self, url: str, out: Path) -> None:
        super().__init__(daemon=True)
        self.url, self.out = url, out

    def run(self) -> None:
        time.sleep(1.0)  # past start-up and the informers' first sync
        try:
            r = httpx.get(self.url, verify=False, timeout=60)
            r.raise_for_status()
            self.out.write_bytes(r.content)
        except httpx.HTTPError as exc:
            print(f"  kube-scheduler profile failed: {exc}", flush=True)


def start_scheduler_profile(cp: ControlPlane, out: Path) -> SchedulerProfile:
    wait_until(lambda: cp.scheduler is not None and cp.scheduler.pid is not None, 30, "kube-scheduler")
    prof = SchedulerProfile(f"https://127.0.0.1:{cp.ports.scheduler}/debug/pprof/profile?seconds=15", out)
    prof.start()
    return prof


def report_scheduler_profile(variant: str, path: Path) -> None:
    """The functions kube-scheduler spent its CPU in (cumulative), via ``go tool pprof``."""
    go = shutil.which("go")
    if go is None or not path.exists():
        return
    out = subprocess.run([go, "tool", "pprof", "-top", "-cum", "-nodecount=45", str(path)],
                         capture_output=True, text=True, timeout=120)
    print()
    print(f"kube-scheduler profile, {variant} ({path}), top functions by cumulative CPU:")
    for line in out.stdout.splitlines():
        if line.strip() and not line.startswith(("File:", "Build ID:", "Type:", "Time:", "Duration:")):
            print("  " + line)


IDLE_LEAVES = ("select", "poll", "wait", "recv_into", "readinto", "acquire", "sleep", "accept", "get")


def report_profile(path: Path) -> None:
    """Where the extender's busy samples went: per thread, then the hottest frames of ours."""
    threads: dict[str, int] = {}
    frames: dict[str, int] = {}
    busy_total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        parts = stack.split(";")
        leaf = parts[-1].split(" (")[0]
        if any(leaf.endswith(w) or leaf.startswith(w) for w in IDLE_LEAVES):
            continue
        n = int(count)
        busy_total += n
        name = parts[0].split(":")[-1].strip().strip('"')
        threads[name] = threads.get(name, 0) + n
        for f in set(parts[1:]):
            if " (app/" in f:
                key = f.split(" (")[0] + " app/" + f.split(" (app/")[1].split(":")[0]
                frames[key] = frames.get(key, 0) + n
    if not busy_total:
        print("(no busy samples)")
        return
    print()
    print(f"Extender profile ({path}): {busy_total} busy samples")
    for name, n in sorted(threads.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {n / busy_total:6.1%}  thread {name}")
    for key, n in sorted(frames.items(), key=lambda kv: -kv[1])[:20]:
        print(f"  {n / busy_total:6.1%}  {key}")


def report_cpu(results: list[RunResult]) -> None:
    print()
    print("CPU per bound pod, ms, by process (kube-scheduler start -> last bind; 2 cores = 2,000 ms/s;")
    print("`extender` is ours, watching in every variant; `null` is bench/null_extender.py):")
    print()
    names = ("etcd", "apiserver", "scheduler", "extender", "null", "bench")
    print("| nodes | variant | " + " | ".join(names) + " | total | wall ms per pod |")
    print("|---:|---|" + "---:|" * (len(names) + 2))
    for r in results:
        if not r.cpu_s or not r.bound:
            continue
        per = [r.cpu_s.get(k, 0.0) * 1e3 / r.bound for k in names]
        print(
            f"| {r.nodes} | {r.variant} | "
            + " | ".join(f"{x:.2f}" for x in per)
            + f" | {sum(per):.2f} | {r.seconds * 1e3 / r.bound:.2f} |"
        )
    print()
    print("kube-apiserver requests per bound pod, same window (>= 0.05 per pod):")
    print()
    for r in results:
        if r.bound and r.api_requests:
            per = {k: v / r.bound for k, v in r.api_requests.items()
                   if v / r.bound >= 0.05 and not k.startswith("seconds ")}
            print(f"  {r.nodes} {r.variant}: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items())))
            # The API server's own mean time per write, ms (etcd included).
            means = {what: r.api_requests_s[k] * 1e3 / r.api_requests[what]
                     for k in r.api_requests_s if r.api_requests.get(what := k.removeprefix("seconds "))}
            if means:
                print(f"  {r.nodes} {r.variant} API server mean ms per write: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in sorted(means.items())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--nodes", type=int, nargs="+", default=[500, 5000], help="node counts (default 500 5000)"
    )
    ap.add_argument("--pods", type=int, default=2000, help="pods per run (default 2000)")
    ap.add_argument("--quick", action="store_true", help="100 nodes, 200 pods")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each variant per node count")
    ap.add_argument(
        "--node-cache-capable",
        choices=["true", "false"],
        default=None,
        help="override the chart's nodeCacheCapable for the extender variant",
    )
    ap.add_argument(
        "--stall", type=float, default=60.0, help="give up after this many seconds without a bind"
    )
    ap.add_argument(
        "--client-qps",
        type=float,
        nargs=2,
        metavar=("QPS", "BURST"),
        help="override kube-scheduler's clientConnection qps/burst for BOTH variants (default: the chart's)",
    )
    ap.add_argument("--gang", type=int, default=0,
                    help="instead of the mix: N 8-GPU pods as one gang vs the same N plain "
                    "(both with the extender)")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy the extender for 15 s of each extender run and print where it went")
    ap.add_argument("--null", action="store_true",
                    help="also run bench/null_extender.py (no placement work; bind + event, and bind only) "
                    "as the extender: the floor of the protocol and the contract's API writes")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs) even on success")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.pods = [100], 200
    ncc = None if args.node_cache_capable is None else args.node_cache_capable == "true"
    args.node_cache_capable = ncc

    workdir = Path(tempfile.mkdtemp(prefix="llmp-bench-"))
    print(f"work folder and component logs: {workdir}", flush=True)
    # Scheduler at -v=1: per-pod log lines at -v=2 would cost both variants alike, but are noise here.
    conn = {"qps": args.client_qps[0], "burst": int(args.client_qps[1])} if args.client_qps else None
    cp = ControlPlane(
        workdir, find_binaries(build=True), scheduler_verbosity=1, scheduler_client_connection=conn
    )
    ok = False
    results: list[RunResult] = []
    try:
        t = time.monotonic()
        cp.start(extender=True, scheduler=False)
        print(f"control plane up in {time.monotonic() - t:.1f}s", flush=True)
        pods = bench_pods(args.pods)
        for n in args.nodes:
            t = time.monotonic()
            manifests = bench_nodes(n, f"bench-{n}")
            names = create_nodes(cp.core, manifests, workers=16)
            cp.wait_extender_cache_nodes(n, timeout=300)
            print(f"{n} nodes created in {time.monotonic() - t:.1f}s", flush=True)
            if args.gang:
                # Both through the extender (the chart's profile): the gang's all-or-nothing path
                # against the same pods placed one by one; the gang must end fully bound or not at all.
                for variant, gpods in (("plain-8gpu", gang_pods(args.gang, False)),
                                       ("gang", gang_pods(args.gang, True))):
                    r = run_variant(cp, n, gpods, variant, ncc, args.stall)
                    results.append(r)
                    if variant == "gang" and r.bound not in (0, args.gang):
                        print(f"  GANG PARTLY BOUND: {r.bound}/{args.gang}", flush=True)
            for rep in range(args.repeat if not args.gang else 0):
                # Alternate the order between repeats so neither variant always runs on a warmer server.
                order: tuple[str, ...] = (("no-extender", "extender") if rep % 2 == 0
                                          else ("extender", "no-extender"))
                if args.null:
                    order += tuple(NULL_VARIANTS)
                for variant in order:
                    prof = (Path(tempfile.gettempdir()) / f"llmp-extender-profile-{n}-{rep}.txt"
                            if args.profile else None)
                    results.append(run_variant(cp, n, pods, variant, ncc, args.stall, prof))
                    if prof is not None and prof.exists():
                        report_profile(prof)
            if n == args.nodes[-1]:
                break  # nothing runs after the last size: report now, the nodes go with the cluster
            # Deleting 15,000 nodes takes minutes: allow for it by size.
            delete_nodes(cp.core, names, workers=16, timeout=300 + n / 20)
            cp.wait_extender_cache_nodes(0, timeout=120 + n / 20)
        report(results, args, cp)
        report_cpu(results)
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
        ok = True
    finally:
        cp.stop()
        if ok and not args.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs kept in {workdir / 'logs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
