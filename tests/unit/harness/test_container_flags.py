"""testkit.container: a rendered Deployment's container becomes the `docker run` flags that keep its
Kubernetes meaning (the container tests run the image through it, never with hand-written flags)."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testkit.container import (
    SA_DIR,
    PodContext,
    UnsupportedSpec,
    docker_run_args,
    probe,
    quantity_bytes,
)


def deployment(**container: Any) -> dict[str, Any]:
    """The shape the chart renders: pod securityContext, one container, configMap + emptyDir volumes."""
    c: dict[str, Any] = {
        "name": "extender",
        "image": "registry.example/llm-placement:0.1.0",
        "command": ["llm-placement", "serve", "--config", "/etc/llm-placement/config.yaml"],
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "k", "key": "key", "optional": True}}},
        ],
        "ports": [{"name": "http", "containerPort": 8888}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "resources": {"limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "cfg", "mountPath": "/etc/llm-placement", "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"exec": {"command": ["python", "-c", "pass"]}, "failureThreshold": 2},
    }
    c.update(container)
    return {"spec": {"template": {"spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532},
        "containers": [c],
        "volumes": [{"name": "cfg", "configMap": {"name": "rel-extender-config"}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
    }}}}


def ctx(tmp_path: Path, **kw: Any) -> PodContext:
    base: dict[str, Any] = {
        "name": "llmp-0", "namespace": "ns1", "workdir": tmp_path,
        "configmaps": {"rel-extender-config": {"config.yaml": "port: 8888\n"}},
        "service_account": {"token": "tok", "ca.crt": "CA", "namespace": "ns1"},
        "api_host": "127.0.0.1", "api_port": 6443,
    }
    base.update(kw)
    return PodContext(**base)


def run_args(dep: dict[str, Any], pod: PodContext) -> list[str]:
    return docker_run_args(dep, "extender", image="llm-placement:test", pod=pod, container_id="c1")


def pairs(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def test_command_replaces_entrypoint_and_the_image_is_the_local_tag(tmp_path: Path) -> None:
    args = run_args(deployment(), ctx(tmp_path))
    i = args.index("llm-placement:test")
    assert args[i + 1:] == ["serve", "--config", "/etc/llm-placement/config.yaml"]
    assert pairs(args, "--entrypoint") == ["llm-placement"]
    assert "registry.example/llm-placement:0.1.0" not in args
    assert pairs(args, "--restart") == ["always"] and pairs(args, "--network") == ["host"]
    assert "--no-healthcheck" in args  # the kubelet ignores HEALTHCHECK; the chart's probes count


@pytest.mark.parametrize(("command", "cargs", "tail", "entry"), [
    (["a", "b"], ["c"], ["b", "c"], ["a"]),
    (None, ["x", "y"], ["x", "y"], []),  # args alone keep the image's ENTRYPOINT, replace its CMD
    (None, None, [], []),
])
def test_command_and_args_follow_kubernetes(tmp_path: Path, command: Any, cargs: Any, tail: list[str],
                                           entry: list[str]) -> None:
    dep = deployment(command=command, args=cargs)
    args = run_args(dep, ctx(tmp_path))
    assert args[args.index("llm-placement:test") + 1:] == tail
    assert pairs(args, "--entrypoint") == entry


@pytest.mark.parametrize(("sc", "present", "absent"), [
    ({}, ["--read-only", "--cap-drop=ALL", "no-new-privileges", "65532:65532"], ["--privileged"]),
    ({"readOnlyRootFilesystem": False}, ["--cap-drop=ALL"], ["--read-only"]),
    ({"allowPrivilegeEscalation": True}, ["--read-only"], ["no-new-privileges"]),
    ({"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}, ["--cap-add=NET_BIND_SERVICE"], []),
    ({"runAsUser": 1000, "runAsGroup": 2000}, ["1000:2000"], ["65532:65532"]),
    ({"seccompProfile": {"type": "Unconfined"}}, ["seccomp=unconfined"], []),
])
def test_security_context_becomes_flags(tmp_path: Path, sc: dict[str, Any], present: list[str],
                                        absent: list[str]) -> None:
    dep = deployment()
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(sc)
    args = run_args(dep, ctx(tmp_path))
    for p in present:
        assert p in args, (p, args)
    for a in absent:
        assert a not in args, (a, args)
    assert pairs(args, "--group-add") == ["65532"]  # fsGroup


@pytest.mark.parametrize(("change", "complaint"), [
    ({"runAsUser": 0}, "runAsNonRoot"),
    ({"privileged": True}, "privileged"),
    ({"seccompProfile": {"type": "Localhost"}}, "seccompProfile"),
])
def test_what_the_kubelet_or_docker_would_refuse_is_refused(tmp_path: Path, change: dict[str, Any],
                                                             complaint: str) -> None:
    dep = deployment()
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(change)
    with pytest.raises(UnsupportedSpec, match=complaint):
        run_args(dep, ctx(tmp_path))


def test_env_resolves_field_refs_and_skips_an_absent_optional_secret(tmp_path: Path) -> None:
    args = run_args(deployment(), ctx(tmp_path))
    env = pairs(args, "-e")
    assert "HOME=/tmp" in env and "POD_NAME=llmp-0" in env and "POD_NAMESPACE=ns1" in env
    assert not any(e.startswith("KEY=") for e in env)
    given_secret = run_args(deployment(), ctx(tmp_path, secrets={"k": {"key": "s3cret"}}))
    assert "KEY=s3cret" in pairs(given_secret, "-e")


@pytest.mark.parametrize(("env", "complaint"), [
    ({"name": "K", "valueFrom": {"secretKeyRef": {"name": "k", "key": "key"}}}, "required"),
    ({"name": "K", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}, "status.podIP"),
    ({"name": "K", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}, "configMapKeyRef"),
])
def test_env_that_cannot_be_honoured_is_refused(tmp_path: Path, env: dict[str, Any], complaint: str) -> None:
    dep = deployment()
    dep["spec"]["template"]["spec"]["containers"][0]["env"].append(env)
    with pytest.raises(UnsupportedSpec, match=complaint):
        run_args(dep, ctx(tmp_path))


def test_configmap_is_written_and_mounted_read_only_where_the_chart_mounts_it(tmp_path: Path) -> None:
    args = run_args(deployment(), ctx(tmp_path))
    mounts = pairs(args, "-v")
    cfg = next(m for m in mounts if m.endswith(":/etc/llm-placement:ro"))
    assert (Path(cfg.split(":")[0]) / "config.yaml").read_text() == "port: 8888\n"
    sa = next(m for m in mounts if m.endswith(f":{SA_DIR}:ro"))
    assert (Path(sa.split(":")[0]) / "token").read_text() == "tok"
    env = pairs(args, "-e")
    assert "KUBERNETES_SERVICE_HOST=127.0.0.1" in env and "KUBERNETES_SERVICE_PORT=6443" in env


def test_empty_dir_is_a_sized_tmpfs_the_pod_user_owns(tmp_path: Path) -> None:
    (tmpfs,) = pairs(run_args(deployment(), ctx(tmp_path)), "--tmpfs")
    target, opts = tmpfs.split(":")
    assert target == "/tmp"
    assert set(opts.split(",")) >= {f"size={256 * 2**20}", "uid=65532", "gid=65532"}


def test_no_token_mount_without_automount(tmp_path: Path) -> None:
    dep = deployment()
    dep["spec"]["template"]["spec"]["automountServiceAccountToken"] = False
    args = run_args(dep, ctx(tmp_path, service_account=None))
    assert not any(SA_DIR in m for m in pairs(args, "-v"))
    with pytest.raises(UnsupportedSpec, match="token"):
        run_args(deployment(), ctx(tmp_path, service_account=None))


@pytest.mark.parametrize(("volume", "complaint"), [
    ({"name": "cfg", "configMap": {"name": "other"}}, "ConfigMap 'other'"),
    ({"name": "cfg", "hostPath": {"path": "/"}}, "only configMap, secret and emptyDir"),
])
def test_volumes_that_cannot_be_honoured_are_refused(tmp_path: Path, volume: dict[str, Any],
                                                     complaint: str) -> None:
    dep = deployment()
    dep["spec"]["template"]["spec"]["volumes"][0] = volume
    with pytest.raises(UnsupportedSpec, match=complaint):
        run_args(dep, ctx(tmp_path))


def test_memory_limit_and_missing_container(tmp_path: Path) -> None:
    args = run_args(deployment(), ctx(tmp_path))
    assert pairs(args, "--memory") == [str(2**30)]
    with pytest.raises(UnsupportedSpec, match="container 'nope'"):
        docker_run_args(deployment(), "nope", image="i", pod=ctx(tmp_path), container_id="c")


def test_probes_resolve_named_ports_and_keep_timing() -> None:
    c = deployment()["spec"]["template"]["spec"]["containers"][0]
    ready = probe(c, "readinessProbe")
    assert (ready.kind, ready.path, ready.port, ready.period) == ("http", "/readyz", 8888, 5.0)
    live = probe(c, "livenessProbe")
    assert (live.kind, live.command, live.failure_threshold) == ("exec", ("python", "-c", "pass"), 2)
    with pytest.raises(UnsupportedSpec, match="startupProbe"):
        probe(c, "startupProbe")
    bad = copy.deepcopy(c)
    bad["readinessProbe"]["httpGet"]["port"] = "metrics"
    with pytest.raises(UnsupportedSpec, match="port 'metrics'"):
        probe(bad, "readinessProbe")


# --- secret volumes ---------------------------------------------------------------------------------
TLS = {"tls.crt": "CERT", "tls.key": "KEY", "ca.crt": "CA"}
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="secret files are owned by root, as the kubelet owns them")


def with_secret(source: dict[str, Any], *, fs_group: int | None = 65532, read_only: bool = True) -> dict[str, Any]:
    """The base deployment plus a secret volume mounted where the chart mounts the serving Secret."""
    dep = deployment()
    spec = dep["spec"]["template"]["spec"]
    spec["volumes"].append({"name": "tls", "secret": source})
    spec["containers"][0]["volumeMounts"].append(
        {"name": "tls", "mountPath": "/etc/llm-placement-tls", "readOnly": read_only})
    if fs_group is None:
        del spec["securityContext"]["fsGroup"]
    return dep


def secret_mount(args: list[str]) -> Path:
    (m,) = [m for m in pairs(args, "-v") if ":/etc/llm-placement-tls" in m]
    src, target, mode = m.split(":")
    assert (target, mode) == ("/etc/llm-placement-tls", "ro")  # read-only, as every secret volume
    return Path(src)


def tree(root: Path) -> dict[str, tuple[str, int, int, int]]:
    """Relative path -> (content, permission bits, uid, gid) of every file under root."""
    return {str(f.relative_to(root)): (f.read_text(), stat.S_IMODE(f.stat().st_mode), f.stat().st_uid,
                                        f.stat().st_gid) for f in root.rglob("*") if f.is_file()}


@as_root
@pytest.mark.parametrize(("source", "fs_group", "expected"), [
    # The chart's serving Secret: every key, 0440, group fsGroup so the non-root user reads it.
    ({"secretName": "s", "defaultMode": 0o440}, 65532,
     {k: (v, 0o440, 0, 65532) for k, v in TLS.items()}),
    # No defaultMode: Kubernetes' 0644.
    ({"secretName": "s"}, 65532, {k: (v, 0o644, 0, 65532) for k, v in TLS.items()}),
    # With an fsGroup the kubelet adds group read: 0400 becomes 0440.
    ({"secretName": "s", "defaultMode": 0o400}, 65532, {k: (v, 0o440, 0, 65532) for k, v in TLS.items()}),
    # Without one, root:root and the mode as given (the pod's user cannot read it, as in a cluster).
    ({"secretName": "s", "defaultMode": 0o400}, None, {k: (v, 0o400, 0, 0) for k, v in TLS.items()}),
    # items: only those keys, at their path, with their own mode over defaultMode.
    ({"secretName": "s", "defaultMode": 0o440,
      "items": [{"key": "tls.key", "path": "keys/server.key", "mode": 0o600}, {"key": "ca.crt", "path": "ca.pem"}]},
     65532, {"keys/server.key": ("KEY", 0o640, 0, 65532), "ca.pem": ("CA", 0o440, 0, 65532)}),
    # optional: a missing key is left out, a missing Secret mounts an empty directory.
    ({"secretName": "s", "optional": True, "items": [{"key": "nope", "path": "n"}, {"key": "ca.crt", "path": "c"}]},
     65532, {"c": ("CA", 0o644, 0, 65532)}),
    ({"secretName": "absent", "optional": True}, 65532, {}),
])
def test_a_secret_volume_is_its_files_with_the_kubelets_modes_and_owner(
    tmp_path: Path, source: dict[str, Any], fs_group: int | None, expected: dict[str, Any]
) -> None:
    args = run_args(with_secret(source, fs_group=fs_group), ctx(tmp_path, secrets={"s": TLS}))
    root = secret_mount(args)
    assert tree(root) == expected
    assert (root.stat().st_uid, root.stat().st_gid) == (0, 0 if fs_group is None else fs_group)
    if fs_group is not None:
        assert root.stat().st_mode & stat.S_ISGID  # new files keep the group, as the kubelet's dir


@as_root
def test_a_secret_volume_is_read_only_whatever_the_mount_says_and_rewritten_exactly(tmp_path: Path) -> None:
    pod = ctx(tmp_path, secrets={"s": TLS})
    run_args(with_secret({"secretName": "s"}, read_only=False), pod)
    pod.secrets["s"] = {"ca.crt": "CA2"}
    root = secret_mount(run_args(with_secret({"secretName": "s"}, read_only=False), pod))
    assert tree(root) == {"ca.crt": ("CA2", 0o644, 0, 65532)}  # no file left from the first run


@pytest.mark.parametrize(("source", "complaint"), [
    ({"secretName": "absent"}, "Secret 'absent' not given"),
    ({"secretName": "s", "items": [{"key": "nope", "path": "n"}]}, "has no key 'nope'"),
    ({"secretName": "s", "items": [{"key": "ca.crt", "path": "../ca.crt"}]}, "must be relative"),
    ({"secretName": "s", "items": [{"key": "ca.crt", "path": "/ca.crt"}]}, "must be relative"),
    ({"secretName": "s", "defaultMode": "0440"}, "mode '0440'"),
    ({"secretName": "s", "defaultMode": 0o4755}, "mode 2541"),
    ({"secretName": "s", "items": [{"key": "ca.crt", "path": "c", "mode": -1}]}, "item ca.crt: mode -1"),
    ({}, "without secretName"),
])
def test_secret_volumes_that_cannot_be_honoured_are_refused(tmp_path: Path, source: dict[str, Any],
                                                            complaint: str) -> None:
    with pytest.raises(UnsupportedSpec, match=complaint):
        run_args(with_secret(source), ctx(tmp_path, secrets={"s": TLS}))


def test_secret_files_need_root_to_be_owned_as_the_kubelet_owns_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UnsupportedSpec, match="owned by root"):
        run_args(with_secret({"secretName": "s"}), ctx(tmp_path, secrets={"s": TLS}))


# --- probes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("get", "scheme"), [
    ({"path": "/healthz", "port": "http"}, "HTTP"),
    ({"path": "/healthz", "port": "http", "scheme": "HTTP"}, "HTTP"),
    ({"path": "/healthz", "port": "http", "scheme": "HTTPS"}, "HTTPS"),
    ({"path": "/healthz", "port": 8888, "scheme": "HTTPS"}, "HTTPS"),
])
def test_an_http_probe_keeps_its_scheme(get: dict[str, Any], scheme: str) -> None:
    c = deployment(startupProbe={"httpGet": get})["spec"]["template"]["spec"]["containers"][0]
    p = probe(c, "startupProbe")
    assert (p.kind, p.scheme, p.port, p.path) == ("http", scheme, 8888, "/healthz")


@pytest.mark.parametrize(("get", "complaint"), [
    ({"port": 8888, "scheme": "https"}, "scheme 'https'"),  # the API server takes HTTP or HTTPS only
    ({"port": 8888, "scheme": "FTP"}, "scheme 'FTP'"),
    ({"port": 8888, "httpHeaders": [{"name": "Host", "value": "x"}]}, "httpHeaders"),
    ({"port": 8888, "host": "10.0.0.1"}, "host"),
])
def test_http_probes_that_cannot_be_honoured_are_refused(get: dict[str, Any], complaint: str) -> None:
    c = deployment(startupProbe={"httpGet": get})["spec"]["template"]["spec"]["containers"][0]
    with pytest.raises(UnsupportedSpec, match=complaint):
        probe(c, "startupProbe")


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "k", "M", "G", "Ki", "Mi", "Gi"]))
def test_quantity_bytes(n: int, unit: str) -> None:
    scale = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}[unit]
    assert quantity_bytes(f"{n}{unit}") == n * scale


@pytest.mark.parametrize("bad", ["1.5Gi", "-1", "1Ti", "lots"])
def test_quantity_bytes_refuses_what_it_does_not_translate(bad: str) -> None:
    with pytest.raises(UnsupportedSpec, match="memory quantity"):
        quantity_bytes(bad)
