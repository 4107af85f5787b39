"""JSON requests through the official client's connection pool and credentials, without its models.

kubernetes-client 37 validates every call with pydantic (``@validate_call``) and turns a dict body
into a model before serialising it again; for a Binding or an Event that is more CPU than the request
itself, spent under the GIL that also answers kube-scheduler's filter calls (a py-spy profile of the
extender under bench/scheduler_throughput.py showed the validation wrapper as the largest item of the
bind path). Here the official ``ApiClient`` still provides the configured urllib3 pool (TLS, client
certificates, keep-alive) and the auth headers (token refresh included); only the model layer is
skipped.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException


class RestLike(Protocol):
    def request(self, method: str, path: str, body: Any = None, *,
                query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
                timeout: float = 5.0) -> bytes: ...


class JsonRest:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        timeout: float = 5.0,
    ) -> bytes:
        """Send one request; return the body of a 2xx answer, raise ApiException otherwise."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, _, _ = self.api.param_serialize(
            method=method, resource_path=path, query_params=query, header_params=headers,
            auth_settings=["BearerToken"],
        )
        payload = None if body is None else body if isinstance(body, bytes) else orjson.dumps(body)
        resp = self.api.rest_client.pool_manager.request(
            method, url, body=payload, headers=headers,
            timeout=urllib3.Timeout(total=timeout), preload_content=True, retries=False,
        )
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=resp.reason)
        return bytes(resp.data)
