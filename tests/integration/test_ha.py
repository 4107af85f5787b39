"""Two scheduler replicas with leader election: the leader dies mid-gang and the standby finishes it.

What the chart runs with ``replicas: 2`` (helm/llm-placement/files/scheduler-config.yaml and
templates/rbac-scheduler.yaml): each replica is kube-scheduler with leader election on one Lease,
same scheduler name, and its own extender sidecar on loopback; only the leader schedules, so only
its extender is called. Both extenders share the gang-plan signing key (the chart mounts one Secret
in every replica, docs/gangs.md "Restored plans").

This module starts its own control plane (the suite's shared one runs a single scheduler without
leader election) with short lease timings, so a takeover takes seconds. The scenario: a gang of 4
is planned by the leader's extender (member 3 held by a scheduling gate, so the gang cannot finish),
member 0 is bound (a bind round that got that far), then the leader's kube-scheduler AND its
extender are killed with SIGKILL. The standby takes the Lease; its extender, running since before
the gang existed, must hold the dead leader's reservations (docs/gangs.md, "Restart": a restart
never hands reserved GPUs to another pod), so a pod that could only run on those nodes stays
Pending; released, the gang binds whole on its plan, each member exactly once, nothing over-committed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes.client import RbacAuthorizationV1Api, SchedulingV1Api
from kubernetes.client.exceptions import ApiException

from app.gang.persist import ANNOTATION, KEY_ENV
from kubeharness import (
    ControlPlane,
    assert_stays_unbound,
    create_pods,
    ensure_namespace,
    find_binaries,
    get_pod,
    gpu_node,
    gpus_requested,
    list_nodes,
    list_pods,
    llm_pod,
    node_gpus,
    pod_events,
    wait_for_node_names,
    wait_until,
)
from kubeharness.controlplane import metric_value
from kubeharness.procs import Component, free_port
from kubeharness.schedconfig import local_scheduler_config, write_yaml

pytestmark = pytest.mark.integration

NS = "it-ha"
ANN = "llm-placement.io/"
TIER0 = "fabric.topograph.run/tier-0"
# Short enough that a takeover takes seconds on a loaded 2-core machine, long enough that a busy
# leader still renews in time (kube-scheduler's defaults are 15 s / 10 s / 2 s).
LEASE = {"leaseDuration": "4s", "renewDeadline": "3s", "retryPeriod": "1s"}
ACQUIRED = re.compile(r"successfully acquired lease", re.IGNORECASE)


@dataclass
class Replica:
    name: str
    extender: Component
    extender_port: int
    metrics_port: int
    scheduler: Component
    scheduler_port: int

    def is_leader(self) -> bool:
        return bool(ACQUIRED.search(self.scheduler.log_path.read_text(errors="replace")))

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        return metric_value(text, name, labels)

    def kill(self) -> None:
        self.scheduler.kill()
        self.extender.kill()

    def stop(self) -> None:
        self.scheduler.stop()
        self.extender.stop()


def _lease_rbac(cp: ControlPlane, lease: str, namespace: str) -> None:
    """The chart's leader-election Role for the scheduler (templates/rbac-scheduler.yaml): the
    built-in system:kube-scheduler may only update the Lease named kube-scheduler."""
    rbac = RbacAuthorizationV1Api(cp.api)
    rbac.create_namespaced_role(namespace, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "llm-placement-leader-election"},
        "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
             "verbs": ["get", "update", "patch"]},
        ]})
    rbac.create_namespaced_role_binding(namespace, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "llm-placement-leader-election"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "llm-placement-leader-election"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "system:kube-scheduler"}]})


def _start_replica(cp: ControlPlane, name: str, extender: Component | None = None,
                   extender_port: int | None = None, metrics_port: int | None = None) -> Replica:
    ext_port = extender_port or free_port()
    met_port = metrics_port or free_port()
    if extender is None:
        env = {**cp.extender_env(), "LLMP_PORT": str(ext_port), "LLMP_METRICS_PORT": str(met_port)}
        extender = Component(f"extender-{name}", cp.extender_argv, cp.logdir / f"extender-{name}.log",
                             env=env, cwd=cp.workdir)
        extender.start()
    wait_until(lambda: httpx.get(f"http://127.0.0.1:{ext_port}/readyz", timeout=2).status_code == 200,
               90, f"extender {name} /readyz", interval=0.2, watch=[extender])
    config = local_scheduler_config(cp.chart_scheduler_config, kubeconfig=cp.scheduler_kubeconfig,
                                    extender_port=ext_port)
    # The chart's leader election (one Lease, resourceLock leases), with short timings.
    config["leaderElection"] = {**cp.chart_scheduler_config["leaderElection"], **LEASE}
    assert config["leaderElection"]["leaderElect"] is True
    path = write_yaml(cp.workdir / f"scheduler-config-{name}.yaml", config)
    sched_port = free_port()
    scheduler = Component(f"kube-scheduler-{name}", [
        str(cp.bins.kube_scheduler), f"--config={path}", "--bind-address=127.0.0.1",
        f"--secure-port={sched_port}", "--authorization-always-allow-paths=/healthz,/readyz,/livez",
        "-v=2"], cp.logdir / f"kube-scheduler-{name}.log")
    scheduler.start()
    wait_until(lambda: httpx.get(f"https://127.0.0.1:{sched_port}/healthz", verify=False,
                                 timeout=2).status_code == 200,
               60, f"kube-scheduler {name} /healthz", interval=0.2, watch=[scheduler])
    return Replica(name, extender, ext_port, met_port, scheduler, sched_port)


@dataclass
class HA:
    cp: ControlPlane
    a: Replica
    b: Replica


@pytest.fixture(scope="module")
def ha() -> Iterator[HA]:
    base = os.environ.get("LLMP_TEST_WORKDIR")
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="llmp-ha-", dir=base))
    # One signing key for both replicas, as the chart's Secret gives every replica the same one.
    cp = ControlPlane(workdir, find_binaries(build=False),
                      extender_extra_env={KEY_ENV: "ha-test-key-0123456789abcdef"})
    cp.start(scheduler=False)
    failed = False
    replicas: list[Replica] = []
    try:
        le = cp.chart_scheduler_config["leaderElection"]
        _lease_rbac(cp, le["resourceName"], le["resourceNamespace"])
        assert cp.extender is not None
        a = _start_replica(cp, "a", cp.extender, cp.ports.extender, cp.ports.extender_metrics)
        replicas.append(a)
        wait_until(a.is_leader, 60, "replica a to acquire the Lease", watch=[a.scheduler])
        b = _start_replica(cp, "b")
        replicas.append(b)
        ensure_namespace(cp.core, NS)
        yield HA(cp, a, b)
    except BaseException:
        failed = True
        raise
    finally:
        for r in replicas:
            r.stop()
        cp.stop()
        if failed or os.environ.get("LLMP_KEEP_LOGS") == "1":
            print(f"\nHA control plane logs kept in {workdir / 'logs'}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


# Every node carries HOLD; a member that does not tolerate it exists (the gang is planned) but
# kube-scheduler cannot send it to the extender, so the plan stays in flight. A gated member would
# not do: a pod behind scheduling gates has not arrived and the gang would not be planned.
HOLD = {"key": ANN + "test-hold", "value": "hold", "effect": "NoSchedule"}
TOLERATE = {"key": ANN + "test-hold", "operator": "Equal", "value": "hold", "effect": "NoSchedule"}


def _gang(name: str, size: int, held: set[int]) -> list[dict[str, Any]]:
    pods = []
    for i in range(size):
        pod = llm_pod(f"{name}-{i}", stage="pretraining", gpus=8,
                      annotations={ANN + "gang-size": str(size)},
                      labels={"run": name, "scheduling.x-k8s.io/pod-group": name})
        if i not in held:
            pod["spec"]["tolerations"] = [TOLERATE]
        pods.append(pod)
    return pods


def _plan(core: Any, name: str) -> dict[str, Any] | None:
    raw = (get_pod(core, NS, name)["metadata"].get("annotations") or {}).get(ANNOTATION)
    return json.loads(raw) if raw else None


def test_standby_takes_over_mid_gang_with_the_reservations_and_binds_it_whole(ha: HA) -> None:
    cp, core = ha.cp, ha.cp.core
    leaves = {"leaf-a": 2, "leaf-b": 4}
    manifests, i = [], 0
    for leaf, count in leaves.items():
        for k in range(count):
            i += 1
            manifests.append(gpu_node(f"ha-{leaf}-{k}", "H100", gpus=8, tier0=leaf, tier1="spine-1",
                                      rdma=True, index=i))
    from kubeharness import create_nodes

    create_nodes(core, manifests)
    for m in manifests:  # after create_node, which drops the taints admission adds
        core.patch_node(m["metadata"]["name"], {"spec": {"taints": [HOLD]}}, _preload_content=False)
    for r in (ha.a, ha.b):
        wait_until(lambda r=r: r.metric("llm_placement_cache_nodes") == len(manifests), 30,
                   f"extender {r.name} to cache the nodes")
    assert ha.a.is_leader() and not ha.b.is_leader()

    # The leader's extender plans the gang; member 3 is held back, so the plan stays in flight.
    pods = _gang("pt", 4, held={3})
    members = [p["metadata"]["name"] for p in pods]
    create_pods(core, NS, pods)
    wait_until(lambda: all(_plan(core, m) for m in members), 90, "the gang plan persisted on every member")
    planned = {m: str((_plan(core, m) or {})["node"]) for m in members}
    assert {n.rsplit("-", 1)[0] for n in planned.values()} == {"ha-leaf-b"}, planned
    assert not any(get_pod(core, NS, m)["spec"].get("nodeName") for m in members)
    # A bind round that got as far as member 0 (what the leader's extender does first).
    core.create_namespaced_binding(NS, {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": members[0]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": planned[members[0]]}},
        _preload_content=False)

    # A pod that fits only on the gang's reserved nodes and that the new leader tries first: a higher
    # priority (kube-scheduler's queue order), no preemption (it must not evict member 0 instead).
    # Gated until the leader is dead, so only the new leader's extender ever judges it.
    scheduling = SchedulingV1Api(cp.api)
    scheduling.create_priority_class({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "ha-first"},
        "value": 1000, "preemptionPolicy": "Never"})
    intruder = llm_pod("intruder", stage="pretraining", gpus=8, labels={"run": "intruder"})
    intruder["spec"].update({"nodeSelector": {TIER0: "leaf-b"}, "priorityClassName": "ha-first",
                             "tolerations": [TOLERATE],
                             "schedulingGates": [{"name": "llm-placement.io/test-hold"}]})
    # The Priority admission plugin reads PriorityClasses from its own informer, so a class created a
    # moment ago can still be unknown to it: retry the create until the informer has caught up.
    deadline = time.monotonic() + 30
    while True:
        try:
            create_pods(core, NS, [intruder])
            break
        except ApiException as exc:
            if exc.status != 403 or "PriorityClass" not in str(exc.body) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)

    # The leader's pod dies: its kube-scheduler and its extender, both SIGKILL.
    killed_at = time.monotonic()
    ha.a.kill()
    core.patch_namespaced_pod("intruder", NS, {"spec": {"schedulingGates": None}},
                              _content_type="application/merge-patch+json", _preload_content=False)
    wait_until(ha.b.is_leader, 60, "the standby to take the Lease", watch=[ha.b.scheduler, ha.b.extender])
    takeover = time.monotonic() - killed_at
    assert takeover < 30, f"takeover took {takeover:.1f} s"
    print(f"\nHA: the standby took the Lease {takeover:.1f} s after the leader was killed")

    # The standby's extender never planned this gang; the dead leader's reservations, persisted on
    # the members (docs/gangs.md, "Restart"), must keep the intruder off those nodes.
    wait_until(lambda: any(e.get("reason") == "FailedScheduling" for e in pod_events(core, NS, "intruder"))
               or get_pod(core, NS, "intruder")["spec"].get("nodeName"),
               60, "the new leader to try the intruder")
    assert_stays_unbound(core, NS, "intruder", 6)

    # Released, the gang completes on its plan through the new leader.
    tolerations = [*(get_pod(core, NS, members[3])["spec"].get("tolerations") or []), TOLERATE]
    core.patch_namespaced_pod(members[3], NS, {"spec": {"tolerations": tolerations}}, _preload_content=False)
    placed = wait_for_node_names(core, NS, members, timeout=180)
    assert placed == planned, {m: (placed[m], planned[m]) for m in members if placed[m] != planned[m]}
    assert not get_pod(core, NS, "intruder")["spec"].get("nodeName")

    # Each member bound exactly once, where it stayed; nothing over-committed. kube-scheduler writes
    # its Scheduled event asynchronously after the bind, so wait for it before counting.
    for m in members[1:]:
        def scheduled_events(m: str = m) -> list[dict[str, Any]]:
            return [e for e in pod_events(core, NS, m) if e.get("reason") == "Scheduled"]

        wait_until(lambda m=m: bool(scheduled_events(m)), 30, f"kube-scheduler's Scheduled event for {m}")
        scheduled = scheduled_events(m)
        assert len(scheduled) == 1, f"{m}: {len(scheduled)} Scheduled events"
        assert (scheduled[0].get("message") or "").endswith(placed[m]), scheduled[0].get("message")
    capacity = {n["metadata"]["name"]: node_gpus(n) for n in list_nodes(core)}
    used: dict[str, int] = defaultdict(int)
    for p in list_pods(core, NS):
        if p["spec"].get("nodeName"):
            used[p["spec"]["nodeName"]] += gpus_requested(p)
    assert all(u <= capacity[n] for n, u in used.items()), used
    # The new leader's extender released the reservation once the gang was bound.
    wait_until(lambda: ha.b.metric("llm_placement_reserved_gpus") == 0, 30,
               "the new leader's extender to release the gang's reservation")
    assert (ha.b.metric("llm_placement_gangs_total", {"outcome": "bound"}) or 0) >= 1
