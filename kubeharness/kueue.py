"""Kueue against the harness's kube-apiserver: the all-or-nothing baseline of the trace replays.

An operator without llm-placement who wants gangs placed whole runs Kueue (sigs.k8s.io/kueue) in front
of kube-scheduler: its pod webhook creates every pod of a queue behind the scheduling gate
``kueue.x-k8s.io/admission``; a pod group (``kueue.x-k8s.io/pod-group-name`` + ``pod-group-total-count``)
becomes one Workload, admitted when the ClusterQueue's quota holds all of it, and only then are its
pods released to kube-scheduler. This module runs the real controller (built from its Go module by
scripts/build-kueue.sh, CRDs and webhook configuration from the same module version) with:

* the pod integration only, for the replay namespace only;
* one ResourceFlavor and one ClusterQueue whose quota is the cluster's allocatable total of every
  resource the trace requests, a LocalQueue in the namespace. Plain (``tas=False``): quota
  admission, Kueue does not look at how free capacity is spread over nodes, that is kube-scheduler's
  part. Topology-aware (``tas=True``, Kueue's TAS, beta and on by default): the flavor carries a
  one-level Topology (``kubernetes.io/hostname``), Kueue admits a group only when it finds nodes
  with room for every member (preferring as few nodes as possible) and pins each pod to its node;
* its webhooks reached by URL on 127.0.0.1 with the harness's serving certificate (there is no
  Service network in the harness), internal certificate management off;
* no ``waitForPodsReady``: its eviction deletes the pods of a plain pod group, which nothing in a
  replay (or a real cluster without a Job controller) would recreate; a group admitted on quota but
  not placeable stays partly bound, which the replay reports as GPU-hours held idle.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes.client import AdmissionregistrationV1Api, ApiextensionsV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.rest import ApiException

from .controlplane import ControlPlane, metric_value
from .procs import Component, free_port, run_build_script, wait_until
from .rawapi import items, json_object, read_json
from .schedconfig import REPO_ROOT
from .tokens import create_or_keep

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-kueue.sh"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
# The gates Kueue lifts once it has admitted a workload (the second one under topology-aware
# scheduling, once it has pinned each pod to its node).
KUEUE_GATES = (ADMISSION_GATE, "kueue.x-k8s.io/topology")
MANAGED_FINALIZER = "kueue.x-k8s.io/managed"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
HOSTNAME = "kubernetes.io/hostname"
QUEUE = "replay"
FLAVOR = "default"
TOPOLOGY = "hosts"
WEBHOOK_PREFIX = "llm-placement-bench-kueue"
KUEUE_READY_TIMEOUT = 120.0
PENDING_METRIC = "kueue_pending_workloads"
IDLE_POLL_S = 0.2
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


class KueueBuildError(RuntimeError):
    """Kueue could not be built or found."""


def build_kueue(timeout: float = 3600.0) -> Path:
    """Run scripts/build-kueue.sh (a no-op when cached) and return the binary's path."""
    return run_build_script(BUILD_SCRIPT, cwd=REPO_ROOT, error=KueueBuildError, timeout=timeout)


def queued(manifest: dict[str, Any], gang: tuple[str, int] | None, tas: bool = False) -> dict[str, Any]:
    """``manifest`` for Kueue: in the replay's LocalQueue and, for a gang member, in the gang's pod
    group (Kueue's own labels; the gang annotations of docs/annotations.md stay, unread). With
    ``tas``, the pod set prefers as few nodes as possible (Kueue's topology-aware scheduling)."""
    m = json.loads(json.dumps(manifest))
    meta = m["metadata"]
    meta.setdefault("labels", {})[QUEUE_LABEL] = QUEUE
    if tas:
        meta.setdefault("annotations", {})[PREFERRED_TOPOLOGY] = HOSTNAME
    if gang is not None:
        key, size = gang
        # The gang key is namespace/name; a label value cannot hold the slash.
        meta["labels"][GROUP_LABEL] = key.rsplit("/", 1)[-1]
        meta.setdefault("annotations", {})[GROUP_COUNT] = str(size)
    return m


def _quantity(q: str) -> float:
    from kubernetes.utils.quantity import parse_quantity

    return float(parse_quantity(q))


def cluster_quota(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, str]:
    """The ClusterQueue's nominal quota: every resource a pod requests, at the nodes' allocatable
    total (a resource no node has gets 0, so pods asking for it are never admitted, as on the nodes)."""
    names = sorted({r for p in pods for c in p["spec"]["containers"]
                    for r in ((c.get("resources") or {}).get("requests") or {})})
    out = {}
    for r in names:
        total = sum(_quantity(str((n.get("status") or {}).get("allocatable", {}).get(r, "0"))) for n in nodes)
        out[r] = f"{int(total * 1000)}m" if r == "cpu" else str(int(total))
    return out


class Kueue:
    """One Kueue controller serving the replay namespace ``namespace`` of ``cp``.

    ``k = Kueue(binary, cp, workdir, namespace); k.start(quota); ...; k.stop()``. Its log is
    ``<workdir>/logs/kueue.log`` next to the control plane's.
    """

    def __init__(self, binary: Path, cp: ControlPlane, workdir: Path, namespace: str, *, tas: bool = False,
                 node_labels: dict[str, str] | None = None) -> None:
        self.binary, self.cp, self.workdir, self.namespace = binary, cp, workdir, namespace
        self.tas, self.node_labels = tas, node_labels or {}
        self.config_dir = binary.parent / "config"
        self.component: Component | None = None
        self.ports = {"health": free_port(), "metrics": free_port(), "webhook": free_port()}
        self._token: str | None = None
        self._asked = 0.0
        self._admitted: set[str] = set()
        self.idle_answers = {True: 0, False: 0}
        self._topology: set[str] = set()
        self.quota: dict[str, str] = {}
        self._nodes: list[dict[str, Any]] | None = None
        # Times idle() said no only because a waiting workload could be admitted now (Kueue had not
        # yet retried it, e.g. within its requeue batch period after a release).
        self.waited_for_admissible = 0

    @property
    def _pki(self) -> Any:
        assert self.cp.pki is not None, "the control plane is not started"
        return self.cp.pki

    # ----- set-up --------------------------------------------------------------------------------
    def install_crds(self, timeout: float = 60.0) -> None:
        ext = ApiextensionsV1Api(self.cp.api)
        names = []
        for f in sorted((self.config_dir / "crd").glob("*.yaml")):
            crd = yaml.safe_load(f.read_text())
            names.append(crd["metadata"]["name"])
            create_or_keep(ext.create_custom_resource_definition, crd)

        def established() -> bool:
            for n in names:
                st = ext.read_custom_resource_definition(n).status
                conditions = (st.conditions if st is not None else None) or []
                if not any(c.type == "Established" and c.status == "True" for c in conditions):
                    return False
            return True

        wait_until(established, timeout, "Kueue's CRDs to be established", interval=0.2)

    def _config(self) -> dict[str, Any]:
        return {
            "apiVersion": f"config.{GROUP}/{VERSION}",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports['health']}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.ports['metrics']}"},
            "webhook": {"host": "127.0.0.1", "port": self.ports["webhook"], "certDir": str(self.workdir / "kueue-certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "managedJobsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
            "integrations": {"frameworks": ["pod"]},
            # As fast as the replay's clock: a 2-core machine and tens of workloads per second.
            "clientConnection": {"qps": 100, "burst": 200},
        }

    def _webhooks(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Kueue's own webhook configuration with every Service reference replaced by a URL on
        127.0.0.1, kept to the pod and Kueue-API webhooks, pods limited to the replay namespace."""
        docs = [d for d in yaml.safe_load_all((self.config_dir / "webhook.yaml").read_text()) if d]
        ca = base64.b64encode(self._pki.ca.cert.read_bytes()).decode()
        out = []
        for doc in docs:
            kept = []
            for hook in doc.get("webhooks") or []:
                path = hook["clientConfig"]["service"]["path"]
                if not (path.endswith("-v1-pod") or "-kueue-x-k8s-io-" in path):
                    continue
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.ports['webhook']}{path}", "caBundle": ca}
                if path.endswith("-v1-pod"):
                    hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}}
                kept.append(hook)
            doc["metadata"] = {"name": f"{WEBHOOK_PREFIX}-{doc['kind'].lower()}"}
            doc["webhooks"] = kept
            out.append(doc)
        mutating = next(d for d in out if d["kind"] == "MutatingWebhookConfiguration")
        validating = next(d for d in out if d["kind"] == "ValidatingWebhookConfiguration")
        return mutating, validating

    def start(self, quota: dict[str, str], timeout: float = KUEUE_READY_TIMEOUT) -> None:
        """Install the CRDs, start the controller, register its webhooks and create the queues."""
        self.quota = dict(quota)
        self.install_crds()
        core = self.cp.core
        from .controlplane import ensure_namespace

        ensure_namespace(core, "kueue-system")
        # The apiserver's serving certificate names 127.0.0.1, where the webhook and metrics servers
        # listen. Kueue reads its metrics certificate from a fixed path (its Deployment mounts a
        # Secret there) whenever its internal certificate management is off (sigs.k8s.io/kueue
        # v0.17.0, cmd/kueue/main.go, metricsCertPath).
        # That path is shared by every Kueue on the machine (a bench beside a test run): the pair is
        # replaced under a lock, each file atomically, so a running Kueue's certificate watcher only
        # ever settles on a matching certificate and key (whoever wrote them last); the metrics are
        # read without verifying whose CA signed it.
        for certs in (self.workdir / "kueue-certs", METRICS_CERT_DIR):
            try:
                certs.mkdir(parents=True, exist_ok=True)
                with (certs / ".lock").open("w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    for src, name in ((self._pki.apiserver.cert, "tls.crt"), (self._pki.apiserver.key, "tls.key")):
                        tmp = certs / f".{name}.{os.getpid()}"
                        shutil.copyfile(src, tmp)
                        os.replace(tmp, certs / name)
            except OSError as exc:
                raise KueueBuildError(f"Kueue needs its serving certificate in {certs}: {exc}") from exc
        cfg = self.workdir / "kueue.yaml"
        cfg.write_text(yaml.safe_dump(self._config(), sort_keys=False))
        argv = [str(self.binary), f"--config={cfg}", f"--kubeconfig={self.cp.admin_kubeconfig}",
                # The on-demand visibility API (an aggregated apiserver with its own certificate
                # path) is not used here.
                "--feature-gates=VisibilityOnDemand=false",
                # LLMP_KUEUE_LOG_LEVEL=3 logs each pod and workload decision, to read a run afterwards.
                "--zap-log-level=" + os.environ.get("LLMP_KUEUE_LOG_LEVEL", "info")]
        log = self.workdir / "logs" / "kueue.log"
        self.component = Component("kueue", argv, log, env={**os.environ, "KUBE_FEATURE_WatchListClient": "false"})
        self.component.start()
        comp = self.component

        def ready() -> bool:
            comp.check_alive()
            try:
                return httpx.get(f"http://127.0.0.1:{self.ports['health']}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout, "Kueue to be ready", interval=0.3, watch=[comp])
        adm = AdmissionregistrationV1Api(self.cp.api)
        mutating, validating = self._webhooks()
        _replace(adm.create_mutating_webhook_configuration, adm.delete_mutating_webhook_configuration, mutating)
        _replace(adm.create_validating_webhook_configuration, adm.delete_validating_webhook_configuration,
                 validating)
        self._queues(quota)

    def _queues(self, quota: dict[str, str]) -> None:
        co = CustomObjectsApi(self.cp.api)

        def make(plural: str, body: dict[str, Any], namespace: str | None = None) -> None:
            body = {"apiVersion": f"{GROUP}/{VERSION}", **body}
            # The webhooks were just registered; the apiserver may not route to them for a moment.
            def created() -> bool:
                try:
                    if namespace:
                        co.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
                    else:
                        co.create_cluster_custom_object(GROUP, VERSION, plural, body)
                except ApiException as exc:
                    if exc.status == 409:
                        return True
                    if exc.status >= 500:
                        return False
                    raise
                return True

            wait_until(created, 30, f"Kueue {plural} to be created", interval=0.5)

        flavor: dict[str, Any] = {}
        if self.tas:
            make("topologies", {"kind": "Topology", "metadata": {"name": TOPOLOGY},
                                "spec": {"levels": [{"nodeLabel": HOSTNAME}]}})
            flavor = {"nodeLabels": self.node_labels, "topologyName": TOPOLOGY}
        make("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": FLAVOR}, "spec": flavor})
        make("clusterqueues", {
            "kind": "ClusterQueue", "metadata": {"name": QUEUE},
            "spec": {
                "namespaceSelector": {},
                # Kueue's default: FIFO, but a group that does not fit steps aside for later ones
                # that do (under StrictFIFO the blocked head keeps every workload "active", and
                # nothing would tell the replay's clock that Kueue has tried them all).
                "queueingStrategy": "BestEffortFIFO",
                "resourceGroups": [{
                    "coveredResources": sorted(quota),
                    "flavors": [{"name": FLAVOR, "resources": [
                        {"name": r, "nominalQuota": q} for r, q in sorted(quota.items())]}],
                }],
            },
        })
        make("localqueues", {"kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": self.namespace},
                             "spec": {"clusterQueue": QUEUE}}, self.namespace)

        def active() -> bool:
            cq = json_object(co.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", QUEUE), "clusterqueue")
            return any(c.get("type") == "Active" and c.get("status") == "True"
                       for c in (cq.get("status") or {}).get("conditions") or [])

        wait_until(active, 30, "Kueue's ClusterQueue to be active", interval=0.3)

    # ----- while replaying -----------------------------------------------------------------------
    def _metrics_token(self) -> str:
        if self._token is None:
            from .tokens import metrics_reader_token

            self._token = metrics_reader_token(self.cp.api, "kueue-system", "bench-metrics")
        return self._token

    def pending_active(self) -> float | None:
        """Workloads Kueue still has to try (its ``kueue_pending_workloads{status="active"}``); None
        when its metrics cannot be read."""
        try:
            # Loopback, and the certificate may be another run's (METRICS_CERT_DIR is machine-wide).
            text = httpx.get(f"https://127.0.0.1:{self.ports['metrics']}/metrics", verify=False, timeout=2,
                             headers={"Authorization": f"Bearer {self._metrics_token()}"}).text
        except httpx.HTTPError:
            return None
        return metric_value(text, PENDING_METRIC, {"cluster_queue": QUEUE, "status": "active"})

    def _listed(self) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
        """The namespace's Workloads and pods (by name), as the API has them now."""
        co = CustomObjectsApi(self.cp.api)
        wls = items(co.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "workloads"), "workloads")
        self._note_admissions(wls)
        pods = {p["metadata"]["name"]: p
                for p in read_json(self.cp.core.list_namespaced_pod, self.namespace)["items"]}
        return wls, pods

    def in_flight(self, listed: tuple[list[dict[str, Any]], dict[str, dict[str, Any]]] | None = None) -> int:
        """Workloads Kueue or kube-scheduler has yet to act on: admitted with a pod still behind a
        scheduling gate Kueue is about to lift, or released but not yet tried by kube-scheduler, or
        still holding quota although every pod of theirs has ended (Kueue has not yet seen them
        finish, so a waiting group cannot have been tried against the freed quota); and gated pods
        of a complete group no Workload owns yet (``unclaimed``). While any is left the replay's
        clock must wait."""
        wls, pods = listed or self._listed()
        return in_flight(wls, pods)

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes (listed once: a replay's nodes do not change)."""
        if self._nodes is None:
            self._nodes = read_json(self.cp.core.list_node)["items"]
        return self._nodes

    def admissible(self, listed: tuple[list[dict[str, Any]], dict[str, dict[str, Any]]] | None = None
                   ) -> list[str]:
        """Waiting workloads that Kueue could admit now (``admissible_now``)."""
        wls, pods = listed or self._listed()
        return admissible_now(wls, pods, self.nodes(), self.quota, tas=self.tas, node_labels=self.node_labels)

    def idle(self, seen_bound: Collection[str] | None = None) -> bool:
        """True when Kueue has nothing it could admit now: every pending workload tried since the
        last change (its ``pending_workloads{status="active"}`` is 0), every admitted one released,
        and no waiting workload that fits the free quota (and, with TAS, the free nodes) now. The
        last is what makes the answer exact: after a release Kueue retries its inadmissible
        workloads only after a batch period (1 s in v0.17.0, pkg/cache/queue/
        inadmissible_workloads.go, requeueBatchPeriod), during which the first two hold although a
        group is about to be admitted. ``seen_bound``: the pods the caller has seen bound; a pod the
        API shows bound that is not among them is news the caller has yet to read (a decision made
        while it asked), so the answer is no. Asked at most every IDLE_POLL_S (it lists the
        namespace's pods and Workloads)."""
        now = time.monotonic()
        if now - self._asked < IDLE_POLL_S:
            return False
        self._asked = now
        idle = self.pending_active() == 0
        if idle:
            listed = self._listed()
            idle = in_flight(*listed) == 0
            if idle and self.admissible(listed):
                self.waited_for_admissible += 1
                idle = False
            if idle and seen_bound is not None:
                seen = set(seen_bound)
                idle = all(name in seen for name, p in listed[1].items() if p["spec"].get("nodeName"))
        self.idle_answers[idle] += 1
        return idle

    # ----- tear-down -----------------------------------------------------------------------------
    def release(self) -> None:
        """Drop Kueue's finalizer from every pod left in the namespace and delete its Workloads, so
        the namespace can be emptied once the controller is gone."""
        core: CoreV1Api = self.cp.core
        pods = read_json(core.list_namespaced_pod, self.namespace)["items"]
        for p in pods:
            fins = p["metadata"].get("finalizers") or []
            if MANAGED_FINALIZER in fins:
                try:
                    core.patch_namespaced_pod(p["metadata"]["name"], self.namespace, [
                        {"op": "test", "path": "/metadata/finalizers", "value": fins},
                        {"op": "replace", "path": "/metadata/finalizers",
                         "value": [f for f in fins if f != MANAGED_FINALIZER]}])
                except ApiException as exc:
                    if exc.status not in (404, 409, 422):
                        raise
        co = CustomObjectsApi(self.cp.api)
        for plural in ("workloads", "localqueues"):
            for w in items(co.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural), plural):
                _force_delete(co, plural, w, self.namespace)
        # The queues and flavor are cluster-wide: the next Kueue run (other nodes, another mode)
        # creates its own.
        for plural in ("clusterqueues", "resourceflavors", "topologies"):
            for w in items(co.list_cluster_custom_object(GROUP, VERSION, plural), plural):
                _force_delete(co, plural, w, None)

    def stop(self) -> None:
        """Unregister the webhooks (pods of later variants must not wait for a gone controller), stop
        the controller and release what it held."""
        adm = AdmissionregistrationV1Api(self.cp.api)
        for delete, kind in ((adm.delete_mutating_webhook_configuration, "mutatingwebhookconfiguration"),
                             (adm.delete_validating_webhook_configuration, "validatingwebhookconfiguration")):
            try:
                delete(f"{WEBHOOK_PREFIX}-{kind}")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        # For reading a run afterwards: every Workload's conditions as Kueue left them.
        co = CustomObjectsApi(self.cp.api)
        wls = items(co.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "workloads"), "workloads")
        self._note_admissions(wls)
        (self.workdir / "logs" / f"kueue-workloads-{self.namespace}.json").write_text(json.dumps(
            {w["metadata"]["name"]: [(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
                                     for c in (w.get("status") or {}).get("conditions") or []]
             for w in wls}, indent=1))
        if self.component is not None:
            self.component.stop()
        self.release()

    def _note_admissions(self, workloads: list[dict[str, Any]]) -> None:
        """Count the workloads seen admitted, and of those the ones Kueue placed on nodes itself (a
        topology assignment: the proof that TAS, not only quota, decided)."""
        for w in workloads:
            adm = (w.get("status") or {}).get("admission")
            if adm:
                self._admitted.add(w["metadata"]["uid"])
                if any(a.get("topologyAssignment") for a in adm.get("podSetAssignments") or []):
                    self._topology.add(w["metadata"]["uid"])

    @property
    def admitted(self) -> int:
        return len(self._admitted)

    @property
    def topology_assigned(self) -> int:
        return len(self._topology)

    def alive(self) -> bool:
        return self.component is not None and self.component.alive()

    def check_alive(self) -> None:
        if self.component is not None:
            self.component.check_alive()

    def tail(self, lines: int = 40) -> str:
        return self.component.tail(lines) if self.component else ""


def _force_delete(co: CustomObjectsApi, plural: str, obj: dict[str, Any], namespace: str | None) -> None:
    """Delete a Kueue object once its controller is gone: nobody is left to clear its finalizers."""
    name = obj["metadata"]["name"]
    try:
        if namespace:
            if obj["metadata"].get("finalizers"):
                co.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name,
                                                  {"metadata": {"finalizers": None}})
            co.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        else:
            if obj["metadata"].get("finalizers"):
                co.patch_cluster_custom_object(GROUP, VERSION, plural, name, {"metadata": {"finalizers": None}})
            co.delete_cluster_custom_object(GROUP, VERSION, plural, name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _replace(create: Any, delete: Any, body: dict[str, Any]) -> None:
    try:
        delete(body["metadata"]["name"])
    except ApiException as exc:
        if exc.status != 404:
            raise
    create(body)


# ----- what Kueue could admit now (pure, unit-tested) ---------------------------------------------
TERMINAL = ("Succeeded", "Failed")


def _conditions(w: dict[str, Any]) -> dict[str, str]:
    return {c.get("type"): c.get("status") for c in (w.get("status") or {}).get("conditions") or []}


def in_flight(workloads: list[dict[str, Any]], pods: dict[str, dict[str, Any]]) -> int:
    """Admitted workloads with a pod still behind one of Kueue's gates, or still holding quota
    although every pod of theirs has ended (``Kueue.in_flight``)."""
    busy = 0
    for w in workloads:
        conds = _conditions(w)
        if conds.get("QuotaReserved") != "True" or conds.get("Finished") == "True":
            continue
        members = [pods.get(o["name"]) for o in w["metadata"].get("ownerReferences") or []]
        gated = any(g.get("name") in KUEUE_GATES for p in members if p
                    for g in p["spec"].get("schedulingGates") or [])
        ended = all(p is None or (p.get("status") or {}).get("phase") in TERMINAL for p in members)
        busy += gated or ended or any(p is not None and _released_unseen(p) for p in members)
    return busy + len(unclaimed(workloads, pods))


def unclaimed(workloads: list[dict[str, Any]], pods: dict[str, dict[str, Any]]) -> list[str]:
    """Gated pods whose group is complete (or that stand alone) but that no Workload owns yet:
    Kueue has still to create their Workload, so it has something to act on although its queues
    show nothing pending."""
    owned = {o["name"] for w in workloads for o in w["metadata"].get("ownerReferences") or []}
    members: dict[str, int] = {}
    for p in pods.values():
        if (group := (p["metadata"].get("labels") or {}).get(GROUP_LABEL)) is not None:
            members[group] = members.get(group, 0) + 1
    out = []
    for name, p in pods.items():
        meta = p["metadata"]
        if name in owned or meta.get("deletionTimestamp") or (p.get("status") or {}).get("phase") in TERMINAL:
            continue
        if not any(g.get("name") in KUEUE_GATES for g in p["spec"].get("schedulingGates") or []):
            continue
        group = (meta.get("labels") or {}).get(GROUP_LABEL)
        total = int((meta.get("annotations") or {}).get(GROUP_COUNT, "1") or 1)
        if group is None or members.get(group, 0) >= total:
            out.append(name)
    return sorted(out)


def _released_unseen(pod: dict[str, Any]) -> bool:
    """A pod Kueue has released (no gate left) that kube-scheduler has not tried yet: unbound, not
    ended, its PodScheduled condition still the gate's (SchedulingGated) or absent. Such a pod looks
    unschedulable to a watcher of that condition while it is about to be bound."""
    if pod["spec"].get("nodeName") or (pod.get("status") or {}).get("phase") in TERMINAL:
        return False
    if any(g.get("name") in KUEUE_GATES for g in pod["spec"].get("schedulingGates") or []):
        return False
    cond = next((c for c in (pod.get("status") or {}).get("conditions") or []
                 if c.get("type") == "PodScheduled"), None)
    return cond is None or cond.get("reason") == "SchedulingGated"


def _requests(pod_spec: dict[str, Any]) -> dict[str, float]:
    """A pod's effective requests: its containers' sum, or an init container's if larger."""
    out: dict[str, float] = {}
    for c in pod_spec.get("containers") or []:
        for r, q in ((c.get("resources") or {}).get("requests") or {}).items():
            out[r] = out.get(r, 0.0) + _quantity(str(q))
    for c in pod_spec.get("initContainers") or []:
        for r, q in ((c.get("resources") or {}).get("requests") or {}).items():
            out[r] = max(out.get(r, 0.0), _quantity(str(q)))
    return out


def _pod_sets(w: dict[str, Any]) -> list[tuple[int, dict[str, float]]]:
    """(count, requests of one pod) per pod set of a Workload."""
    return [(int(ps.get("count") or 0), _requests(((ps.get("template") or {}).get("spec")) or {}))
            for ps in (w.get("spec") or {}).get("podSets") or []]


def admissible_now(workloads: list[dict[str, Any]], pods: dict[str, dict[str, Any]],
                   nodes: list[dict[str, Any]], quota: dict[str, str], *, tas: bool,
                   node_labels: dict[str, str] | None = None) -> list[str]:
    """Names of waiting workloads (no quota reserved, not finished) that fit now, each on its own:
    within the ClusterQueue's quota less what admitted, unfinished workloads reserve, and with
    ``tas`` also on the nodes of the flavor (``node_labels``) with room for every pod, counting as
    used what the namespace's running or pinned pods request (Kueue pins each pod of an admitted
    workload to its node). What Kueue would admit at its next try, whatever its queues say."""
    limit = {r: _quantity(q) for r, q in quota.items()}
    reserved: dict[str, float] = {}
    waiting = []
    for w in workloads:
        conds = _conditions(w)
        if conds.get("Finished") == "True":
            continue
        if conds.get("QuotaReserved") == "True":
            for count, req in _pod_sets(w):
                for r, v in req.items():
                    reserved[r] = reserved.get(r, 0.0) + count * v
        else:
            waiting.append(w)
    free: dict[str, dict[str, float]] = {}
    if tas:
        want = node_labels or {}
        for n in nodes:
            labels = n["metadata"].get("labels") or {}
            if all(labels.get(k) == v for k, v in want.items()) and not (n.get("spec") or {}).get("unschedulable"):
                alloc = (n.get("status") or {}).get("allocatable") or {}
                free[n["metadata"]["name"]] = {r: _quantity(str(q)) for r, q in alloc.items()}
        for p in pods.values():
            if (p.get("status") or {}).get("phase") in TERMINAL or p["metadata"].get("deletionTimestamp"):
                continue
            spec = p["spec"]
            if any(g.get("name") in KUEUE_GATES for g in spec.get("schedulingGates") or []):
                continue
            node = spec.get("nodeName") or (spec.get("nodeSelector") or {}).get(HOSTNAME)
            if node in free:
                for r, v in _requests(spec).items():
                    free[node][r] = free[node].get(r, 0.0) - v
    out = []
    for w in waiting:
        sets = _pod_sets(w)
        need: dict[str, float] = {}
        for count, req in sets:
            for r, v in req.items():
                need[r] = need.get(r, 0.0) + count * v
        if any(r not in limit or reserved.get(r, 0.0) + v > limit[r] + 1e-9 for r, v in need.items() if v > 0):
            continue
        if tas and not _fits_nodes(sets, free):
            continue
        out.append(w["metadata"]["name"])
    return out


def _fits_nodes(sets: list[tuple[int, dict[str, float]]], free: dict[str, dict[str, float]]) -> bool:
    """Every pod of ``sets`` on some node of ``free`` (a copy is consumed, largest pod sets first)."""
    room = {n: dict(f) for n, f in free.items()}
    for count, req in sorted(sets, key=lambda s: -sum(s[1].values())):
        placed = 0
        for f in room.values():
            while placed < count and all(f.get(r, 0.0) + 1e-9 >= v for r, v in req.items() if v > 0):
                for r, v in req.items():
                    f[r] = f.get(r, 0.0) - v
                placed += 1
            if placed == count:
                break
        if placed < count:
            return False
    return True
