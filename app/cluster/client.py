"""Build an official-client ApiClient, and make raw (non-deserialised) calls that return bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client, config

# Binds, events and reads run from several threads; each needs a pooled keep-alive connection, or
# it pays a fresh TLS handshake (~10 ms of CPU under the GIL) per API call.
POOL_SIZE = 32


def api_client(kubeconfig: str | None) -> client.ApiClient:
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)
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
