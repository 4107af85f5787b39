"""Build an official-client ApiClient, and make raw (non-deserialised) calls that return bytes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, config

# Binds, events and reads run from several threads; each needs a pooled keep-alive connection, or
# it pays a fresh TLS handshake (~10 ms of CPU under the GIL) per API call.
POOL_SIZE = 32


class CredentialsError(RuntimeError):
    """No usable Kubernetes credentials; the message says what to do (one line)."""


HOW = ("pass --kubeconfig, set LLMP_KUBECONFIG or KUBECONFIG, create ~/.kube/config, or run in a pod "
       "with a service account")


def resolve_credentials(kubeconfig: str | None, env: Mapping[str, str] | None = None,
                        home: Path | None = None) -> tuple[str, str | None]:
    """Where credentials come from, in kubectl's order (README, Settings): the flag or
    LLMP_KUBECONFIG (``kubeconfig``), then KUBECONFIG (a path list), then ~/.kube/config, then the
    in-cluster service account. Returns (source, path); path None means in-cluster."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    if kubeconfig:
        if not Path(kubeconfig).expanduser().is_file():
            raise CredentialsError(f"kubeconfig {kubeconfig} (--kubeconfig or LLMP_KUBECONFIG) "
                                   "does not exist")
        return "--kubeconfig/LLMP_KUBECONFIG", str(Path(kubeconfig).expanduser())
    if paths := [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]:
        found = [p for p in paths if Path(p).expanduser().is_file()]
        if not found:
            raise CredentialsError(f"KUBECONFIG names no existing file ({env['KUBECONFIG']}); {HOW}")
        return "KUBECONFIG", env["KUBECONFIG"]
    default = home / ".kube" / "config"
    if default.is_file():
        return "~/.kube/config", str(default)
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"):
        return "in-cluster service account", None
    raise CredentialsError(f"no Kubernetes credentials found: {HOW}")


def api_client(kubeconfig: str | None) -> client.ApiClient:
    source, path = resolve_credentials(kubeconfig)
    cfg = client.Configuration()
    try:
        if path is None:
            config.load_incluster_config(client_configuration=cfg)
        elif source == "KUBECONFIG":
            # The client merges a KUBECONFIG path list the way kubectl does.
            config.load_kube_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=path, client_configuration=cfg)
    except Exception as exc:  # ConfigException, a YAML error, a missing token file...
        detail = " ".join(str(exc).split())[:300]
        raise CredentialsError(f"cannot use credentials from {source}"
                               f"{f' ({path})' if path else ''}: {detail}; {HOW}") from None
    cfg.connection_pool_maxsize = POOL_SIZE
    return client.ApiClient(configuration=cfg)


def raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
    """Call an API method without model deserialisation and hand its connection back to the pool.

    With ``_preload_content=False`` urllib3 keeps the connection checked out until the body is read
    and ``release_conn`` is called; forgetting that made every bind open a new TLS connection.
    """
    resp = call(*args, _preload_content=False, **kwargs)
    try:
        return bytes(resp.data)
    finally:
        resp.release_conn()


def list_all(call: Callable[..., Any], *args: Any) -> tuple[list[dict[str, Any]], str]:
    """Every item of a list call, 500 a page, and the list's resourceVersion to watch from.

    Paginated because 100k pods in one response would cost ~1 GB of transient JSON.
    """
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": 500, "_request_timeout": 60}
        if token:
            kwargs["_continue"] = token
        data = json.loads(raw(call, *args, **kwargs))
        items.extend(i for i in data.get("items") or [] if isinstance(i, dict))
        meta = data.get("metadata") or {}
        token = meta.get("continue")
        if not token:
            return items, str(meta.get("resourceVersion") or "")
