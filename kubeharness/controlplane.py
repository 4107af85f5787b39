"""A real control plane on loopback: etcd, kube-apiserver, kube-scheduler, and our extender.

Facts this relies on (measured, see docs/control-plane.md):
* no kubelets and no kube-controller-manager: the test creates Node objects with status, removes the
  ``node.kubernetes.io/not-ready`` taint the TaintNodesByCondition admission plugin adds, and creates
  the ``default`` ServiceAccount in every namespace it uses;
* an apiserver must be fully gone before another binds the same port, so every stop waits for the PID;
* ``--endpoint-reconciler-type=none`` silences the loopback-advertise-address error loop.
"""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import kubernetes
from kubernetes.client import ApiClient, CoreV1Api, RbacAuthorizationV1Api
from kubernetes.client.rest import ApiException

from .pki import PKI, kubeconfig, make_pki
from .procs import Component, ComponentError, free_port, port_is_free, run_build_script, tail, wait_until
from .rawapi import call
from .schedconfig import (
    CHART_EXTENDER_RBAC_RULES,
    CHART_SCHEDULER_CONFIG,
    REPO_ROOT,
    extender_url_path,
    load_chart_scheduler_config,
    load_extender_rbac_rules,
    local_scheduler_config,
    write_yaml,
)

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-controlplane.sh"
ETCD_BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-etcd.sh"
EXTENDER_USER = "llm-placement-extender"
EXTENDER_ROLE = "llm-placement-extender"
SCHEDULER_NAME = "llm-placement"
# Generous enough for a loaded 2-core CI machine; the notes measured 2.2-2.4 s for /readyz.
APISERVER_READY_TIMEOUT = 90.0
ETCD_READY_TIMEOUT = 30.0
SCHEDULER_READY_TIMEOUT = 60.0
EXTENDER_READY_TIMEOUT = 90.0


class BuildError(RuntimeError):
    """The control-plane binaries could not be built or found."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path


def build_binaries(timeout: float = 3600.0) -> str:
    """Run scripts/build-controlplane.sh (a no-op when cached); return its output."""
    try:
        res = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO_ROOT,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"{BUILD_SCRIPT} did not finish within {timeout:.0f}s") from exc
    out = (res.stdout + res.stderr).strip()
    if res.returncode != 0:
        raise BuildError(f"{BUILD_SCRIPT} failed ({res.returncode}):\n" + "\n".join(out.splitlines()[-40:]))
    return out


def etcd_binary(build: bool = True, timeout: float = 3600.0) -> Path:
    """etcd built from its Go module by scripts/build-etcd.sh (a no-op when cached).

    The etcd 3.6 line Kubernetes 1.36 is tested with: kube-apiserver checks etcd's version before
    it serves watch-list streams and progress notifications, and with an older etcd kwok's pod
    watch fell back to relisting with a growing back-off (docs/control-plane.md).
    """
    return run_build_script(ETCD_BUILD_SCRIPT, [] if build else ["--print-path"], cwd=REPO_ROOT,
                            error=BuildError, timeout=timeout)


def find_binaries(build: bool = True) -> Binaries:
    """Locate (building first if asked) kube-apiserver, kube-scheduler and etcd."""
    if build:
        build_binaries()
    res = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-dir"], capture_output=True, text=True, timeout=30, check=True
    )
    cache = Path(res.stdout.strip())
    bins = Binaries(etcd_binary(build), cache / "kube-apiserver", cache / "kube-scheduler")
    for p in (bins.kube_apiserver, bins.kube_scheduler):
        if not os.access(p, os.X_OK):
            raise BuildError(f"{p} is missing; run scripts/build-controlplane.sh")
    return bins


def extender_command() -> list[str]:
    """How the extender is started: ``python -m app.cli`` from this tree (cwd and PYTHONPATH are
    the tree's, :meth:`ControlPlane.extender_env`). Not the venv's console script: that imports
    whatever ``app`` the venv's editable install points at, so a benchmark run from a git worktree
    of another commit would time this checkout's extender, not its own."""
    return [sys.executable, "-m", "app.cli", "serve"]


@dataclass
class Ports:
    etcd_client: int = field(default_factory=free_port)
    etcd_peer: int = field(default_factory=free_port)
    apiserver: int = field(default_factory=free_port)
    scheduler: int = field(default_factory=free_port)
    extender: int = field(default_factory=free_port)
    extender_metrics: int = field(default_factory=free_port)


class ControlPlane:
    """Owns every process of one test control plane and the files they use, all under ``workdir``.

    Typical use: ``cp = ControlPlane(workdir, find_binaries()); cp.start(); ...; cp.stop()``.
    """

    def __init__(
        self,
        workdir: Path,
        binaries: Binaries,
        *,
        scheduler_config_path: Path = CHART_SCHEDULER_CONFIG,
        rbac_rules_path: Path = CHART_EXTENDER_RBAC_RULES,
        extender_argv: list[str] | None = None,
        extender_extra_env: dict[str, str] | None = None,
        scheduler_verbosity: int = 2,
        scheduler_client_connection: dict[str, Any] | None = None,
        apiserver_extra_args: list[str] | None = None,
        scheduler_extra_args: list[str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.bins = binaries
        self.ports = Ports()
        self.logdir = workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        # Read the shared chart files first: if they are missing, fail before starting anything.
        self.chart_scheduler_config = load_chart_scheduler_config(scheduler_config_path)
        self.rbac_rules = load_extender_rbac_rules(rbac_rules_path)
        self.extender_path = extender_url_path(self.chart_scheduler_config)
        self.extender_argv = extender_argv or extender_command()
        self.extender_extra_env = extender_extra_env or {}
        self.scheduler_verbosity = scheduler_verbosity
        # Benchmark exploration only (e.g. {"qps": 200, "burst": 400}); the tests run the chart's values.
        self.scheduler_client_connection = scheduler_client_connection
        # Flags of one module's own control plane only (feature gates, --runtime-config): the
        # session's shared control plane runs the defaults.
        self.apiserver_extra_args = list(apiserver_extra_args or [])
        self.scheduler_extra_args = list(scheduler_extra_args or [])
        self.pki: PKI | None = None
        self.timings: dict[str, float] = {}
        self.etcd: Component | None = None
        self.apiserver: Component | None = None
        self.scheduler: Component | None = None
        self.extender: Component | None = None
        self.scheduler_config_file: Path | None = None
        self._api: ApiClient | None = None

    # ----- addresses and clients -------------------------------------------------------------
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def extender_url(self) -> str:
        """Base URL of the extender's verbs, e.g. ``http://127.0.0.1:PORT/scheduler``."""
        return f"{self.extender_base}{self.extender_path}"

    @property
    def extender_tls(self) -> bool:
        """The extender runs with a serving certificate (``extender_settings`` with LLMP_TLS_*)."""
        return bool(self.extender_extra_env.get("LLMP_TLS_CERT_FILE"))

    @property
    def extender_base(self) -> str:
        scheme = "https" if self.extender_tls else "http"
        return f"{scheme}://127.0.0.1:{self.ports.extender}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.extender_metrics}/metrics"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def extender_kubeconfig(self) -> Path:
        return self.workdir / "extender.kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        return self.workdir / "scheduler.kubeconfig"

    @property
    def api(self) -> ApiClient:
        """An admin (system:masters) client for the tests' own setup and assertions."""
        if self._api is None:
            cfg = kubernetes.client.Configuration()
            kubernetes.config.load_kube_config(
                config_file=str(self.admin_kubeconfig), client_configuration=cfg
            )
            # Tests and the benchmark create nodes and pods from a thread pool.
            cfg.connection_pool_maxsize = 32
            self._api = ApiClient(cfg)
        return self._api

    @property
    def core(self) -> CoreV1Api:
        return CoreV1Api(self.api)

    @property
    def rbac(self) -> RbacAuthorizationV1Api:
        return RbacAuthorizationV1Api(self.api)

    def components(self) -> list[Component]:
        return [c for c in (self.etcd, self.apiserver, self.scheduler, self.extender) if c is not None]

    def log_files(self) -> dict[str, Path]:
        return {c.name: c.log_path for c in self.components()}

    def _https(self, client: bool = True) -> ssl.SSLContext:
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        if client:
            ctx.load_cert_chain(str(self.pki.admin.cert), str(self.pki.admin.key))
        return ctx

    # ----- lifecycle ------------------------------------------------------------------------
    def start(self, *, extender: bool = True, scheduler: bool = True) -> None:
        """Start everything in dependency order; on any failure stop what was started and re-raise."""
        try:
            t0 = time.monotonic()
            self.pki = make_pki(self.workdir / "pki", EXTENDER_USER)
            self.timings["pki"] = time.monotonic() - t0
            self._write_kubeconfigs()
            self.start_etcd()
            self.start_apiserver()
            self.bootstrap()
            if extender:
                self.start_extender()
            if scheduler:
                self.start_scheduler()
            self.timings["total"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every component, consumers first, waiting for each PID to exit.

        Every component gets its stop even if an earlier one fails; the first failure is re-raised.
        """
        first: BaseException | None = None
        for c in (self.scheduler, self.extender, self.apiserver, self.etcd):
            if c is not None:
                try:
                    c.stop()
                except BaseException as exc:
                    first = first or exc
        if self._api is not None:
            self._api.close()
            self._api = None
        if first is not None:
            raise first

    def _write_kubeconfigs(self) -> None:
        assert self.pki is not None
        ca = self.pki.ca.cert
        kubeconfig(self.admin_kubeconfig, self.server, ca, self.pki.admin, "kubernetes-admin")
        kubeconfig(self.scheduler_kubeconfig, self.server, ca, self.pki.scheduler, "system:kube-scheduler")
        kubeconfig(self.extender_kubeconfig, self.server, ca, self.pki.extender, EXTENDER_USER)

    def start_etcd(self) -> None:
        p = self.ports
        data = self.workdir / "data" / "etcd"
        data.mkdir(parents=True, exist_ok=True)
        data.chmod(0o700)  # etcd warns about anything wider
        self.etcd = Component(
            "etcd",
            [
                str(self.bins.etcd),
                "--name",
                "default",
                "--data-dir",
                str(data),
                "--listen-client-urls",
                f"http://127.0.0.1:{p.etcd_client}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{p.etcd_client}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{p.etcd_peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{p.etcd_peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{p.etcd_peer}",
                "--listen-metrics-urls",
                "",
                "--log-level",
                "warn",
            ],
            self.logdir / "etcd.log",
        )
        t0 = time.monotonic()
        self.etcd.start()

        def healthy() -> bool:
            r = httpx.get(f"http://127.0.0.1:{p.etcd_client}/health", timeout=2)
            return r.status_code == 200 and r.json().get("health") == "true"

        wait_until(healthy, ETCD_READY_TIMEOUT, "etcd /health", watch=[self.etcd])
        self.timings["etcd"] = time.monotonic() - t0

    def start_apiserver(self) -> None:
        assert self.pki is not None
        pki, port = self.pki, self.ports.apiserver
        if not port_is_free(port):
            raise ComponentError(f"apiserver port {port} is taken")
        self.apiserver = Component(
            "kube-apiserver",
            [
                str(self.bins.kube_apiserver),
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                # The default reconciler rejects a loopback address every 10 s (notes, pitfall 2).
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=RBAC",
                f"--cert-dir={self.workdir / 'data' / 'apiserver-certs'}",
                "--profiling=false",
                *self.apiserver_extra_args,
            ],
            self.logdir / "kube-apiserver.log",
        )
        t0 = time.monotonic()
        self.apiserver.start()
        ctx = self._https()

        def ready() -> bool:
            return httpx.get(f"{self.server}/readyz", verify=ctx, timeout=5).status_code == 200

        wait_until(
            ready, APISERVER_READY_TIMEOUT, "kube-apiserver /readyz", interval=0.2, watch=[self.apiserver]
        )
        self.timings["kube-apiserver"] = time.monotonic() - t0

    def bootstrap(self) -> None:
        """Cluster objects nothing else creates here: the default ServiceAccount and the extender's RBAC."""
        t0 = time.monotonic()
        # The apiserver creates the "default" namespace itself, but asynchronously after /readyz.
        wait_until(lambda: self.core.read_namespace("default"), 30, "namespace default")
        ensure_namespace(self.core, "default")
        rbac = self.rbac
        call(
            rbac.create_cluster_role,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": EXTENDER_ROLE},
                "rules": self.rbac_rules,
            }
        )
        call(
            rbac.create_cluster_role_binding,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": EXTENDER_ROLE},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": EXTENDER_ROLE,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": EXTENDER_USER}
                ],
            }
        )
        self._wait_rbac_effective()
        self.timings["bootstrap"] = time.monotonic() - t0

    def _wait_rbac_effective(self) -> None:
        # The RBAC authorizer reads roles from an informer; wait until it grants the first rule so the
        # extender's first list does not race the binding (a 403 there would be a harness artefact).
        rule = next((r for r in self.rbac_rules if r.get("resources") and r.get("verbs")), None)
        if rule is None:
            return
        attrs = {
            "group": (rule.get("apiGroups") or [""])[0],
            "resource": rule["resources"][0].split("/")[0],
            "verb": rule["verbs"][0] if rule["verbs"][0] != "*" else "get",
        }
        authz = kubernetes.client.AuthorizationV1Api(self.api)

        def allowed() -> bool:
            review = call(
                authz.create_subject_access_review,
                {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SubjectAccessReview",
                    "spec": {"user": EXTENDER_USER, "resourceAttributes": attrs},
                }
            )
            # An answer without a status grants nothing yet: wait_until asks again.
            return review.status is not None and bool(review.status.allowed)

        wait_until(allowed, 30, f"RBAC to grant {EXTENDER_USER} {attrs}", interval=0.1)

    # ----- extender ---------------------------------------------------------------------------
    def extender_env(self) -> dict[str, str]:
        # Drop the caller's LLMP_* so a developer's shell cannot change what the tests run.
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMP_")}
        env.update(
            {
                "LLMP_KUBECONFIG": str(self.extender_kubeconfig),
                "LLMP_HOST": "127.0.0.1",
                "LLMP_PORT": str(self.ports.extender),
                "LLMP_METRICS_PORT": str(self.ports.extender_metrics),
                "LLMP_SCHEDULER_NAME": SCHEDULER_NAME,
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            }
        )
        env.update(self.extender_extra_env)
        return env

    def start_extender(self, timeout: float = EXTENDER_READY_TIMEOUT) -> None:
        """Start the extender (or start it again on the same ports) and wait for its /readyz."""
        if self.extender is None:
            self.extender = Component(
                "extender",
                self.extender_argv,
                self.logdir / "extender.log",
                env=self.extender_env(),
                cwd=REPO_ROOT,
            )
        # A restart must get the same port back: kube-scheduler's config points at it.
        wait_until(
            lambda: port_is_free(self.ports.extender), 30, f"extender port {self.ports.extender} to be free"
        )
        t0 = time.monotonic()
        self.extender.start()

        def ready() -> bool:
            # /readyz needs no client certificate; the serving certificate is the test's own.
            return httpx.get(f"{self.extender_base}/readyz", timeout=2, verify=False).status_code == 200

        wait_until(ready, timeout, "extender /readyz", interval=0.2, watch=[self.extender])
        self.timings.setdefault("extender", time.monotonic() - t0)

    def stop_extender(self, crash: bool = False) -> None:
        """Stop the extender; ``crash=True`` sends SIGKILL, as a crash or an OOM kill would."""
        if self.extender is not None:
            if crash:
                self.extender.kill()
            else:
                self.extender.stop()

    def restart_extender(self, crash: bool = False) -> None:
        self.stop_extender(crash=crash)
        self.start_extender()

    @contextmanager
    def extender_settings(self, env: dict[str, str]) -> Iterator[None]:
        """Run the extender with ``env`` (LLMP_* settings) added, then as before."""
        def restart(extra: dict[str, str]) -> None:
            self.extender_extra_env = extra
            assert self.extender is not None
            self.stop_extender()
            self.extender.env = self.extender_env()
            self.start_extender()

        before = dict(self.extender_extra_env)
        restart({**before, **env})
        try:
            yield
        finally:
            restart(before)

    # ----- scheduler --------------------------------------------------------------------------
    def scheduler_config(
        self, *, with_extender: bool = True, node_cache_capable: bool | None = None
    ) -> dict[str, Any]:
        return local_scheduler_config(
            self.chart_scheduler_config,
            kubeconfig=self.scheduler_kubeconfig,
            extender_port=self.ports.extender,
            node_cache_capable=node_cache_capable,
            with_extender=with_extender,
            client_connection=self.scheduler_client_connection,
        )

    def start_scheduler(self, *, with_extender: bool = True, node_cache_capable: bool | None = None,
                        overrides: dict[str, Any] | None = None) -> None:
        """Start kube-scheduler with the chart's config (plus local overrides) and wait for /readyz.

        ``overrides``: top-level KubeSchedulerConfiguration fields replaced for this run only (tests
        that show what a shipped setting prevents); the next plain start uses the chart's again.
        """
        tag = ("ext" if with_extender else "noext") + (
            "" if node_cache_capable is None else f"-ncc-{str(node_cache_capable).lower()}"
        ) + ("-custom" if overrides else "")
        config = self.scheduler_config(with_extender=with_extender, node_cache_capable=node_cache_capable)
        config.update(overrides or {})
        cfg = write_yaml(self.workdir / f"scheduler-config-{tag}.yaml", config)
        self.scheduler_config_file = cfg
        argv = [
            str(self.bins.kube_scheduler),
            f"--config={cfg}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports.scheduler}",
            # No authn/authz kubeconfigs (docs/control-plane.md, section 3), so only these paths are served; /metrics lets the
            # benchmark read kube-scheduler's own view of each scheduling cycle, /debug/pprof profile it.
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/debug/pprof/*",
            f"-v={self.scheduler_verbosity}",
            *self.scheduler_extra_args,
        ]
        if self.scheduler is None:
            self.scheduler = Component("kube-scheduler", argv, self.logdir / "kube-scheduler.log")
        self.scheduler.argv = argv
        wait_until(lambda: port_is_free(self.ports.scheduler), 30, "scheduler port to be free")
        t0 = time.monotonic()
        self.scheduler.start()

        def ready() -> bool:
            # Self-signed serving cert generated by the scheduler itself; loopback only.
            return (
                httpx.get(
                    f"https://127.0.0.1:{self.ports.scheduler}/readyz", verify=False, timeout=2
                ).status_code
                == 200
            )

        wait_until(
            ready, SCHEDULER_READY_TIMEOUT, "kube-scheduler /readyz", interval=0.1, watch=[self.scheduler]
        )
        self.timings.setdefault("kube-scheduler", time.monotonic() - t0)

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()

    def restart_scheduler(
        self, *, with_extender: bool = True, node_cache_capable: bool | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.stop_scheduler()
        self.start_scheduler(with_extender=with_extender, node_cache_capable=node_cache_capable,
                             overrides=overrides)

    def extender_metrics(self) -> str:
        return httpx.get(self.metrics_url, timeout=5).text

    def metric_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """One sample of the extender's Prometheus metrics (None when absent)."""
        return metric_value(self.extender_metrics(), name, labels)

    def wait_extender_cache_nodes(self, count: int, timeout: float = 30.0) -> None:
        """Wait until the extender's node cache (gauge ``llm_placement_cache_nodes``) holds ``count``."""

        def synced() -> bool:
            return self.metric_value("llm_placement_cache_nodes") == count

        watch = [self.extender] if self.extender else []
        wait_until(synced, timeout, f"the extender's node cache to hold {count} nodes", watch=watch)

    def check_alive(self) -> None:
        """Raise with the log of any component that died unexpectedly."""
        for c in self.components():
            c.check_alive()

    def log_report(self, lines: int = 40) -> str:
        return "\n".join(
            f"--- {c.name} ({c.log_path}), last {lines} lines:\n{tail(c.log_path, lines)}"
            for c in self.components()
        )


def ensure_namespace(core: CoreV1Api, name: str, labels: dict[str, str] | None = None) -> None:
    """Create a namespace (if absent) and its ``default`` ServiceAccount.

    Without kube-controller-manager nobody creates the ServiceAccount, and pod creation fails with
    'error looking up service account <ns>/default' (docs/control-plane.md, section 4).
    """
    try:
        call(
            core.create_namespace,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    try:
        call(
            core.create_namespaced_service_account,
            name,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
        )
    except ApiException as exc:
        if exc.status != 409:
            raise


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """Sum of the samples of ``name`` in Prometheus text exposition whose labels include ``labels``.

    None when no sample matches (the metric does not exist, or not with those labels).
    """
    total: float | None = None
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, lab = head.partition("{")
        if metric != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', lab))
        if all(found.get(k) == v for k, v in (labels or {}).items()):
            total = (total or 0.0) + float(value)
    return total
