"""The extender image run as the chart's rendered container, next to a harness control plane.

Shared by tests/integration/test_container.py and bench/image_facts.py: build the image (scripts/
build-image.sh, Debian-made base), render the chart for the control plane's ports, give the chart's
ServiceAccount the chart's extender rules and a token, and ``docker run`` the container with the flags
testkit.container derives from the rendered Deployment (``--network host``: the container's loopback
is the host's, where kube-scheduler calls it as it calls the chart's sidecar).

The chart serves the verbs over TLS by default (docs/security.md). Its helm-made Secrets
(``<fullname>-verbs-serving``/``-verbs-client``) are replaced by the harness's verbs PKI under the same
file names (tls.crt, tls.key, ca.crt), so the test holds kube-scheduler's client certificate and a
certificate of another CA; the secret volume is then mounted as the kubelet would (testkit.container).
"""

from __future__ import annotations

import os
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes.client import RbacAuthorizationV1Api

from testkit.container import PodContext, Probe, docker_run_args, probe

from .controlplane import EXTENDER_ROLE, ControlPlane, ensure_namespace
from .pki import KeyPair, VerbsPKI, make_verbs_pki
from .rawapi import call
from .schedconfig import with_verbs_tls
from .tokens import create_or_keep, token_of

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "llm-placement"
RELEASE_NS = "llm-placement"  # where the chart is installed (its ServiceAccount lives there)
READY_TIMEOUT = 90.0


class ScriptError(RuntimeError):
    """A scripts/ helper (dockerd, image or helm build) failed; the message carries its stderr."""


def run_script(name: str, *args: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run scripts/<name>; return the last line of its stdout (the scripts print their result last)."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / name), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise ScriptError(f"scripts/{name} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def docker(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])} ... failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


def render_chart(values: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    """`helm template` of the chart with ``values``, as parsed documents (helm from scripts/build-helm.sh)."""
    helm = run_script("build-helm.sh", timeout=1800)
    vf = tmp / "container-values.yaml"
    vf.write_text(yaml.safe_dump(values))
    proc = subprocess.run([helm, "template", "llm-placement", str(CHART), "--namespace", RELEASE_NS,
                           "--values", str(vf)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise ScriptError(f"helm template failed: {proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def service_account_token(cp: ControlPlane, sa: str = "llm-placement") -> dict[str, str]:
    """The chart's ServiceAccount bound to the chart's extender rules (the harness's ClusterRole, read
    from the chart's file), and the files the kubelet would mount for it: token, ca.crt, namespace."""
    ensure_namespace(cp.core, RELEASE_NS)
    create_or_keep(cp.core.create_namespaced_service_account, RELEASE_NS, {"metadata": {"name": sa}})
    create_or_keep(RbacAuthorizationV1Api(cp.api).create_cluster_role_binding, {
        "metadata": {"name": f"{EXTENDER_ROLE}-sa"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": EXTENDER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": RELEASE_NS}],
    })
    token = token_of(call(cp.core.create_namespaced_service_account_token,
                          sa, RELEASE_NS, {"spec": {"expirationSeconds": 7200}}))
    assert cp.pki is not None
    return {"token": token, "ca.crt": cp.pki.ca.cert.read_text(), "namespace": RELEASE_NS}


def run_probe(container: str, p: Probe) -> bool:
    """Run a probe as the kubelet would: exec inside the container, or an HTTP GET on its port."""
    if p.kind == "exec":
        proc = subprocess.run(["docker", "exec", container, *p.command], capture_output=True,
                              timeout=p.timeout + 10)
        return proc.returncode == 0
    # HTTPS probes: TLS without verifying the certificate and without a client certificate, as the
    # kubelet probes.
    url = f"{p.scheme.lower()}://127.0.0.1:{p.port}{p.path}"
    try:
        return 200 <= httpx.get(url, timeout=p.timeout, verify=False).status_code < 400
    except httpx.HTTPError:
        return False


# The files of the chart's verbs Secrets (templates/verbs-tls.yaml), from the harness's verbs PKI.
def _verbs_files(pki: VerbsPKI, pair: KeyPair) -> dict[str, str]:
    return {"tls.crt": pair.cert.read_text(), "tls.key": pair.key.read_text(), "ca.crt": pki.ca.cert.read_text()}


def verbs_secrets(docs: list[dict[str, Any]], pki: VerbsPKI) -> dict[str, dict[str, str]]:
    """The rendered verbs Secrets' data, made by the harness PKI under the chart's own key names."""
    pairs = {"-verbs-serving": pki.serving, "-verbs-client": pki.scheduler}
    out: dict[str, dict[str, str]] = {}
    for d in docs:
        name = d["metadata"]["name"]
        pair = next((kp for suffix, kp in pairs.items() if name.endswith(suffix)), None)
        if d["kind"] != "Secret" or pair is None:
            continue
        out[name] = _verbs_files(pki, pair)
        if set(out[name]) != set(d.get("data") or {}):
            raise AssertionError(f"Secret {name}: the chart renders keys {sorted(d.get('data') or {})}, "
                                 f"the harness makes {sorted(out[name])}")
    return out


@dataclass
class Container:
    """The extender container of the chart's Deployment, run by Docker."""

    name: str
    argv: list[str]  # after `docker run`
    spec: dict[str, Any]  # the rendered container spec (its probes)
    base_url: str  # where the verbs, /healthz and /explain answer (https with the chart's TLS)
    verbs: VerbsPKI | None  # the serving and client certificates, when the chart serves TLS

    def client(self, *, certificate: bool = True) -> httpx.Client:
        """A client that trusts the container's serving certificate; with kube-scheduler's client
        certificate unless ``certificate=False``."""
        if self.verbs is None:
            return httpx.Client(timeout=20)
        ctx = ssl.create_default_context(cafile=str(self.verbs.ca.cert))
        if certificate:
            ctx.load_cert_chain(str(self.verbs.scheduler.cert), str(self.verbs.scheduler.key))
        return httpx.Client(verify=ctx, timeout=20)

    def scheduler_overrides(self, cp: ControlPlane) -> dict[str, Any]:
        """kube-scheduler's ``extenders`` for this container: the chart's stanza, over TLS with the
        client certificate when the chart serves TLS (the fields the chart renders)."""
        ext = cp.scheduler_config()["extenders"][0]
        if self.verbs is not None:
            v = self.verbs
            ext = with_verbs_tls(ext, v.scheduler.cert, v.scheduler.key, v.ca.cert)
        return {"extenders": [ext]}

    def start(self, timeout: float = READY_TIMEOUT) -> float:
        """``docker run`` it; return the seconds from the run to its readiness probe passing."""
        docker("rm", "-f", self.name, check=False)
        t0 = time.monotonic()
        docker("run", *self.argv)
        self.wait_ready(timeout)
        return time.monotonic() - t0

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Poll the readiness probe; a death before the first pass fails at once, with the logs."""
        restarts = int(self.inspect("{{.RestartCount}}"))
        deadline = time.monotonic() + timeout
        while not self.probe_passes("readinessProbe"):
            # With --restart always a crashing entrypoint shows as "restarting", never "exited":
            # a restart while waiting for the first readiness means the process died.
            state, count = self.inspect("{{.State.Status}} {{.RestartCount}}").split()
            if state in ("exited", "restarting", "dead") or int(count) > restarts:
                raise AssertionError(f"container {self.name} died before it was ready ({state}, "
                                     f"{count} restarts); its log:\n{self.logs(20)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"container {self.name} not ready within {timeout:.0f}s; its log:\n"
                                     f"{self.logs(20)}")
            time.sleep(0.25)

    def probe_passes(self, which: str) -> bool:
        return run_probe(self.name, probe(self.spec, which))

    def inspect(self, fmt: str) -> str:
        return docker("inspect", "-f", fmt, self.name).stdout.strip()

    def rss_bytes(self) -> int:
        """Resident memory of the container's main process (read on the host: same kernel)."""
        pid = int(self.inspect("{{.State.Pid}}"))
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmRSS for pid {pid}")

    def logs(self, lines: int = 60) -> str:
        proc = docker("logs", "--tail", str(lines), self.name, check=False)
        return proc.stdout + proc.stderr

    def remove(self) -> None:
        docker("rm", "-f", self.name, check=False)


def chart_values(cp: ControlPlane, **values: Any) -> dict[str, Any]:
    """Chart values for ``cp``'s extender ports (and ``values`` on top)."""
    return {**values, "extender": {"port": cp.ports.extender, "metricsPort": cp.ports.extender_metrics,
                                   **values.get("extender", {})}}


def chart_container(cp: ControlPlane, image: str, workdir: Path, name: str, **values: Any) -> Container:
    """The chart rendered for ``cp``'s extender ports (plus ``values``), turned into a Container (not
    started)."""
    docs = render_chart(chart_values(cp, **values), workdir)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    config = yaml.safe_load(next(data["config.yaml"] for cm, data in configmaps.items()
                                 if cm.endswith("-extender-config")))
    verbs = make_verbs_pki(workdir / "verbs-pki") if config.get("tls_cert_file") else None
    pod = PodContext(
        name=f"{name}-pod", namespace=RELEASE_NS, workdir=workdir / "pod", configmaps=configmaps,
        secrets=verbs_secrets(docs, verbs) if verbs is not None else {},
        service_account=service_account_token(cp), api_host="127.0.0.1", api_port=cp.ports.apiserver,
    )
    argv = docker_run_args(deployment, "extender", image=image, pod=pod, container_id=name)
    spec = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender")
    scheme = "https" if verbs is not None else "http"
    return Container(name, argv, spec, f"{scheme}://127.0.0.1:{cp.ports.extender}", verbs)
