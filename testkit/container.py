"""A rendered pod's container turned into `docker run` flags, so a test runs the image the way the
chart runs it: same command, env, user, read-only root, capabilities, config mounts and credentials.

Only what the chart uses is translated; anything else raises :class:`UnsupportedSpec` naming the field,
so a chart change that this function cannot honour fails the container tests instead of being dropped.
Kubernetes semantics kept (docs/install.md, "Running the image"):

* ``command`` replaces the image's ENTRYPOINT and ``args`` its CMD;
* ``runAsUser``/``runAsGroup`` of the container win over the pod's; ``fsGroup`` becomes a
  supplementary group; ``runAsNonRoot`` with UID 0 is refused, as the kubelet refuses it;
* a configMap volume becomes a read-only bind mount of its rendered keys; an emptyDir a tmpfs of its
  ``sizeLimit`` owned by the pod's user; the ServiceAccount token (automountServiceAccountToken) a
  read-only mount at the in-cluster path with KUBERNETES_SERVICE_HOST/PORT set, as the kubelet does;
* a secret volume becomes a read-only bind mount of the Secret's data files (``items`` and their
  ``path``/``mode`` honoured, else every key), each with ``mode``/``defaultMode`` (default 0644) and
  owned as the kubelet leaves them: root, group ``fsGroup`` with group read added (so a 0440 file is
  readable by the pod's non-root user through its fsGroup, and by nobody else);
* an ``httpGet`` probe keeps its ``scheme`` (HTTPS: TLS without certificate checks, as the kubelet);
* ``restartPolicy`` Always (a Deployment's) becomes ``--restart always``.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|k|M|G)?$")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


class UnsupportedSpec(ValueError):
    """A pod-spec field this translation does not (or cannot) honour under Docker."""


@dataclass
class PodContext:
    """What the kubelet and the API server would supply: the pod's identity, the ConfigMaps and
    Secrets it references, the ServiceAccount token and the API server's address."""

    name: str
    namespace: str
    workdir: Path
    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)
    # Secret name -> key -> decoded value (env ``secretKeyRef`` and secret volumes).
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    service_account: dict[str, str] | None = None  # token, ca.crt, namespace
    api_host: str = "127.0.0.1"
    api_port: int = 443


def quantity_bytes(q: str) -> int:
    """A Kubernetes memory quantity (``256Mi``, ``1G``, ``512``) in bytes."""
    m = _QUANTITY.match(str(q).strip())
    if not m:
        raise UnsupportedSpec(f"memory quantity {q!r}: only integers with k/M/G/Ki/Mi/Gi are translated")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _find(items: list[dict[str, Any]], name: str, what: str) -> dict[str, Any]:
    for it in items:
        if it.get("name") == name:
            return it
    raise UnsupportedSpec(f"{what} {name!r} not found (have {[i.get('name') for i in items]})")


def _field_ref(path: str, pod: PodContext) -> str:
    values = {"metadata.name": pod.name, "metadata.namespace": pod.namespace}
    if path not in values:
        raise UnsupportedSpec(f"env fieldRef {path!r}: only {sorted(values)} are translated")
    return values[path]


def _env(container: dict[str, Any], pod: PodContext) -> list[str]:
    flags: list[str] = []
    for e in container.get("env") or []:
        name = e["name"]
        if "value" in e:
            flags += ["-e", f"{name}={e['value']}"]
            continue
        src = e.get("valueFrom") or {}
        if "fieldRef" in src:
            flags += ["-e", f"{name}={_field_ref(src['fieldRef']['fieldPath'], pod)}"]
        elif "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            value = pod.secrets.get(ref["name"], {}).get(ref["key"])
            if value is not None:
                flags += ["-e", f"{name}={value}"]
            elif not ref.get("optional"):
                raise UnsupportedSpec(
                    f"env {name}: Secret {ref['name']}/{ref['key']} is required but not given")
        else:
            raise UnsupportedSpec(f"env {name}: valueFrom {sorted(src)} is not translated")
    if container.get("envFrom"):
        raise UnsupportedSpec("envFrom is not translated")
    return flags


def _security(pod_sc: dict[str, Any], sc: dict[str, Any]) -> list[str]:
    merged = {**pod_sc, **sc}
    if merged.get("privileged"):
        raise UnsupportedSpec("privileged containers are not run (and are refused by this machine's Docker)")
    uid, gid = merged.get("runAsUser"), merged.get("runAsGroup")
    if merged.get("runAsNonRoot") and (uid is None or int(uid) == 0):
        # The kubelet refuses such a container; so do we (an image USER is not consulted here).
        raise UnsupportedSpec(f"runAsNonRoot with runAsUser {uid!r}: the kubelet would not start it")
    flags: list[str] = []
    if uid is not None:
        flags += ["--user", f"{int(uid)}:{int(gid if gid is not None else uid)}"]
    if pod_sc.get("fsGroup") is not None:
        flags += ["--group-add", str(int(pod_sc["fsGroup"]))]
    if merged.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if merged.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    caps = merged.get("capabilities") or {}
    flags += [f"--cap-drop={c}" for c in caps.get("drop") or []]
    flags += [f"--cap-add={c}" for c in caps.get("add") or []]
    seccomp = (merged.get("seccompProfile") or {}).get("type")
    if seccomp == "Unconfined":
        flags += ["--security-opt", "seccomp=unconfined"]
    elif seccomp not in (None, "RuntimeDefault"):
        raise UnsupportedSpec(f"seccompProfile {seccomp!r} is not translated")
    return flags


def _write_files(root: Path, data: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for key, text in data.items():
        (root / key).write_text(text)
        (root / key).chmod(0o644)  # configMap volumes default to 0644 (defaultMode 420)
    root.chmod(0o755)
    return root


def _mode(value: Any, what: str) -> int:
    # Kubernetes modes are decimal in JSON (288) and octal in YAML (0440 parses to 288); only the
    # permission bits are allowed.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise UnsupportedSpec(f"{what}: mode {value!r} is not a permission value between 0 and 0777")
    return value


def _secret_files(vol_name: str, src: dict[str, Any], pod: PodContext) -> dict[str, tuple[str, int]]:
    """Relative path -> (content, mode) of a secret volume, as the kubelet projects it."""
    name = src.get("secretName")
    if not name:
        raise UnsupportedSpec(f"volume {vol_name}: secret without secretName")
    default = _mode(src.get("defaultMode", 0o644), f"volume {vol_name} defaultMode")
    data = pod.secrets.get(name)
    if data is None:
        if src.get("optional"):
            return {}  # an absent optional Secret mounts as an empty directory
        raise UnsupportedSpec(f"volume {vol_name}: Secret {name!r} not given (have {sorted(pod.secrets)})")
    items = src.get("items")
    if items is None:
        return {key: (value, default) for key, value in data.items()}
    files: dict[str, tuple[str, int]] = {}
    for it in items:
        key, path = it["key"], it["path"]
        parts = Path(path).parts
        if Path(path).is_absolute() or ".." in parts or not parts:
            raise UnsupportedSpec(f"volume {vol_name}: item path {path!r} must be relative, without '..'")
        if key not in data:
            if src.get("optional"):
                continue
            raise UnsupportedSpec(
                f"volume {vol_name}: Secret {name!r} has no key {key!r} (has {sorted(data)})")
        files[path] = (data[key], _mode(it.get("mode", default), f"volume {vol_name} item {key}"))
    return files


def _write_secret(root: Path, files: dict[str, tuple[str, int]], fs_group: int | None) -> Path:
    """Write the files owned root:fsGroup (root:root without one), as the kubelet's secret volume.

    With an fsGroup the kubelet adds group read to every file (and setgid to directories), so the
    pod's user reads them through its supplementary group whatever the mode said.
    """
    if os.geteuid() != 0:
        raise UnsupportedSpec("secret volumes are written owned by root, as the kubelet writes them: "
                              "run the container tests as root (as dockerd runs)")
    gid = 0 if fs_group is None else int(fs_group)
    if root.exists():
        shutil.rmtree(root)  # the Secret's files exactly, nothing left from an earlier run
    root.mkdir(parents=True)
    dirs = {root}
    for rel, (text, mode) in files.items():
        path = root / rel
        for parent in path.relative_to(root).parents:
            dirs.add(root / parent)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.chown(path, 0, gid)
        path.chmod(mode | (0o440 if fs_group is not None else 0))
    for d in dirs:
        os.chown(d, 0, gid)
        d.chmod(0o755 | (0o2000 if fs_group is not None else 0))
    return root


def _mounts(container: dict[str, Any], spec: dict[str, Any], pod: PodContext) -> list[str]:
    volumes = spec.get("volumes") or []
    pod_sc = spec.get("securityContext") or {}
    owner = pod_sc.get("runAsUser")
    group = pod_sc.get("fsGroup", pod_sc.get("runAsGroup"))
    flags: list[str] = []
    for m in container.get("volumeMounts") or []:
        vol = _find(volumes, m["name"], "volume")
        target = m["mountPath"]
        if m.get("subPath"):
            raise UnsupportedSpec(f"volumeMount {m['name']}: subPath is not translated")
        if "configMap" in vol:
            cm = vol["configMap"]["name"]
            if cm not in pod.configmaps:
                raise UnsupportedSpec(
                    f"volume {m['name']}: ConfigMap {cm!r} not given (have {sorted(pod.configmaps)})")
            src = _write_files(pod.workdir / "volumes" / m["name"], pod.configmaps[cm])
            # configMap volumes are always read-only in Kubernetes, whatever readOnly says.
            flags += ["-v", f"{src}:{target}:ro"]
        elif "emptyDir" in vol:
            opts = ["rw", "nosuid", "nodev"]
            limit = (vol["emptyDir"] or {}).get("sizeLimit")
            if limit:
                opts.append(f"size={quantity_bytes(limit)}")
            if owner is not None:
                opts.append(f"uid={int(owner)}")
            if group is not None:
                # fsGroup: group-owned and setgid, as the kubelet prepares the volume.
                opts += [f"gid={int(group)}", "mode=2775"]
            flags += ["--tmpfs", f"{target}:{','.join(opts)}"]
        elif "secret" in vol:
            files = _secret_files(m["name"], vol["secret"] or {}, pod)
            src = _write_secret(pod.workdir / "volumes" / m["name"], files, pod_sc.get("fsGroup"))
            # Secret volumes are always read-only in Kubernetes, whatever readOnly says.
            flags += ["-v", f"{src}:{target}:ro"]
        else:
            raise UnsupportedSpec(
                f"volume {m['name']}: only configMap, secret and emptyDir are translated, got {sorted(vol)}")
    if spec.get("automountServiceAccountToken", True):
        if pod.service_account is None:
            raise UnsupportedSpec("the pod mounts its ServiceAccount token but no token was given")
        src = _write_files(pod.workdir / "serviceaccount", pod.service_account)
        flags += ["-v", f"{src}:{SA_DIR}:ro", "-e", f"KUBERNETES_SERVICE_HOST={pod.api_host}",
                  "-e", f"KUBERNETES_SERVICE_PORT={pod.api_port}"]
    return flags


def _resources(container: dict[str, Any]) -> list[str]:
    limits = (container.get("resources") or {}).get("limits") or {}
    flags: list[str] = []
    if "memory" in limits:
        flags += ["--memory", str(quantity_bytes(limits["memory"]))]
    if "cpu" in limits:
        cpu = str(limits["cpu"])
        flags += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
    return flags


def docker_run_args(
    deployment: dict[str, Any], container_name: str, *, image: str, pod: PodContext,
    container_id: str, network: str = "host",
) -> list[str]:
    """``docker run`` arguments (after ``run``) for one container of a rendered Deployment.

    ``image`` replaces the rendered image reference (a local tag, not the chart's registry path);
    ``network`` is host by default so loopback reaches the test control plane, as a sidecar's
    loopback reaches its kube-scheduler.
    """
    spec = deployment["spec"]["template"]["spec"]
    container = _find(spec["containers"], container_name, "container")
    policy = spec.get("restartPolicy", "Always")
    restart = {"Always": "always", "OnFailure": "on-failure", "Never": "no"}[policy]
    # Kubernetes ignores the image's HEALTHCHECK (the chart's probes replace it); so does this run.
    flags = ["-d", "--name", container_id, "--network", network, "--restart", restart, "--no-healthcheck"]
    flags += _security(spec.get("securityContext") or {}, container.get("securityContext") or {})
    flags += _env(container, pod)
    flags += _mounts(container, spec, pod)
    flags += _resources(container)
    if container.get("workingDir"):
        flags += ["-w", container["workingDir"]]
    command, args = container.get("command"), container.get("args")
    tail: list[str] = []
    if command:
        flags += ["--entrypoint", command[0]]
        tail = [*command[1:], *(args or [])]
    elif args:
        tail = list(args)
    return [*flags, image, *tail]


@dataclass(frozen=True)
class Probe:
    """One of the container's probes, ready to run against the running container."""

    kind: str  # "exec" or "http"
    command: tuple[str, ...] = ()
    path: str = ""
    port: int = 0
    scheme: str = "HTTP"  # of an httpGet: HTTP or HTTPS (the kubelet does not verify the certificate)
    period: float = 10.0
    failure_threshold: int = 3
    timeout: float = 1.0


def probe(container: dict[str, Any], which: str) -> Probe:
    """The container's ``startupProbe``/``livenessProbe``/``readinessProbe`` (a named port resolved)."""
    p = container.get(which)
    if not p:
        raise UnsupportedSpec(f"container {container.get('name')!r} declares no {which}")
    period, failures = float(p.get("periodSeconds", 10)), int(p.get("failureThreshold", 3))
    timeout = float(p.get("timeoutSeconds", 1))
    if "exec" in p:
        return Probe("exec", command=tuple(p["exec"]["command"]), period=period,
                     failure_threshold=failures, timeout=timeout)
    if "httpGet" in p:
        get = p["httpGet"]
        port = get["port"]
        if isinstance(port, str):
            port = _find(container.get("ports") or [], port, "port")["containerPort"]
        scheme = get.get("scheme", "HTTP")
        if scheme not in ("HTTP", "HTTPS"):  # the API server accepts exactly these two
            raise UnsupportedSpec(f"{which}: httpGet scheme {scheme!r} is not HTTP or HTTPS")
        if get.get("httpHeaders") or get.get("host"):
            raise UnsupportedSpec(f"{which}: httpGet host/httpHeaders are not translated")
        return Probe("http", path=get.get("path", "/"), port=int(port), scheme=scheme, period=period,
                     failure_threshold=failures, timeout=timeout)
    raise UnsupportedSpec(f"{which}: only exec and httpGet probes are translated, got {sorted(p)}")
