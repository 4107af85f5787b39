"""Slow down chosen writes through the real API server: a validating admission webhook that waits.

kube-scheduler's DynamicResources plugin writes a claim's ``status.allocation`` and
``status.reservedFor`` in PreBind, before it calls the extender's bind; a slow API server or etcd
makes that write, and so the pod's arrival at bind, late. Tests need that lateness on one chosen
pod, deterministically: this webhook answers every request at once and allows it, except updates
of the named objects' status subresource that set an allocation, which it holds for ``delay``
seconds first. Nothing is refused, so the objects written are exactly what kube-scheduler wrote.

The apiserver calls webhooks over TLS only; the harness's apiserver serving certificate names
127.0.0.1, and the CA that signed it is the one the apiserver already trusts.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes.client import AdmissionregistrationV1Api
from kubernetes.client.rest import ApiException

from .pki import PKI
from .rawapi import call


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        review: dict[str, Any] = json.loads(body or b"{}")
        req: dict[str, Any] = review.get("request") or {}
        obj: dict[str, Any] = req.get("object") or {}
        if (req.get("subResource") == "status" and req.get("name") in self.server.names
                and (obj.get("status") or {}).get("allocation")):
            self.server.held.append((req["name"], time.monotonic()))
            time.sleep(self.server.delay)
        _answer(self, {"uid": req.get("uid", ""), "allowed": True})

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, names: set[str], delay: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.names = names
        self.delay = delay
        self.held: list[tuple[str, float]] = []  # (name, when) of each write held


@contextmanager
def slow_status_writes(api_client: Any, pki: PKI, namespace: str, resource: str, names: set[str],
                       delay: float) -> Iterator[list[tuple[str, float]]]:
    """While inside: status updates that allocate the named ``resource`` objects (resource.k8s.io)
    in ``namespace`` take ``delay`` seconds longer. Yields the list of writes held so far."""
    server = _Server(names, delay)
    rules = [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["UPDATE"],
              "resources": [f"{resource}/status"], "scope": "Namespaced"}]
    with _webhook(api_client, pki, server, f"slow-{namespace}-{resource}", "slow.llm-placement.io",
                  namespace, rules, min(30, int(delay) + 10)):
        yield server.held


def _answer(handler: BaseHTTPRequestHandler, response: dict[str, Any]) -> None:
    """Write an AdmissionReview answering the request with ``response``."""
    out = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "response": response}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(out)))
    handler.end_headers()
    handler.wfile.write(out)


@contextmanager
def _webhook(api_client: Any, pki: PKI, server: ThreadingHTTPServer, name: str, hook: str, namespace: str,
             rules: list[dict[str, Any]], timeout: int) -> Iterator[None]:
    """Serve ``server`` over TLS (the apiserver's serving certificate, which names 127.0.0.1) and
    register it as the validating webhook ``name`` for ``rules`` in ``namespace``, while inside."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pki.apiserver.cert), str(pki.apiserver.key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    api = AdmissionregistrationV1Api(api_client)
    ca = base64.b64encode(pki.ca.cert.read_bytes()).decode()
    call(api.create_validating_webhook_configuration, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": hook,
            "clientConfig": {"url": f"https://127.0.0.1:{server.server_address[1]}/", "caBundle": ca},
            "rules": rules,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "timeoutSeconds": timeout, "failurePolicy": "Ignore",
        }],
    })
    try:
        yield
    finally:
        try:
            api.delete_validating_webhook_configuration(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        server.shutdown()
        server.server_close()


class _RefuseHandler(BaseHTTPRequestHandler):
    server: _RefuseServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        req = (json.loads(body or b"{}").get("request")) or {}

        def gates(obj: Any) -> set[str]:
            spec = (obj or {}).get("spec") or {}
            return {str(g.get("name")) for g in spec.get("schedulingGates") or () if isinstance(g, dict)}

        lifts = self.server.gate in gates(req.get("oldObject")) - gates(req.get("object"))
        refuse = lifts and time.monotonic() < self.server.until
        if refuse:
            self.server.refused.append((str(req.get("name")), time.monotonic()))
        response: dict[str, Any] = {"uid": req.get("uid", ""), "allowed": not refuse}
        if refuse:
            response["status"] = {"code": 403, "message": "gate removals refused for a while (test)"}
        _answer(self, response)

    def log_message(self, format: str, *args: Any) -> None:
        return


class _RefuseServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, gate: str, until: float) -> None:
        super().__init__(("127.0.0.1", 0), _RefuseHandler)
        self.gate = gate
        self.until = until
        self.refused: list[tuple[str, float]] = []  # (pod, when) of each removal refused


@contextmanager
def refused_gate_removals(api_client: Any, pki: PKI, namespace: str, gate: str,
                          seconds: float) -> Iterator[list[tuple[str, float]]]:
    """While inside, and for ``seconds`` from entering: every pod update in ``namespace`` that
    removes the scheduling gate ``gate`` is refused (403), as an admission webhook or a policy
    would. Yields the list of refusals so far."""
    server = _RefuseServer(gate, time.monotonic() + seconds)
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"],
              "scope": "Namespaced"}]
    with _webhook(api_client, pki, server, f"refuse-gates-{namespace}", "refuse-gates.llm-placement.io",
                  namespace, rules, 5):
        yield server.refused
