"""A scheduler extender that does no placement work: the floor for bench/scheduler_throughput.py.

    python bench/null_extender.py --port 18080 --kubeconfig k.yaml [--no-event]

It speaks the same protocol on the same stack as ours (uvicorn with httptools and uvloop, orjson,
the same REST client for API writes in threads), but its filter answers the first candidate and its
bind writes the Binding and, unless ``--no-event``, one event per pod, the ``Placed`` event of
docs/extender-protocol.md. Run as kube-scheduler's extender it measures what the protocol and the
contract's API writes cost on this machine, so our extender's rate can be read against the rate of
an extender that decides nothing, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import uvicorn
from kubernetes import client, config

from app.cluster.rest import JsonRest

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class NullExtender:
    def __init__(self, rest: JsonRest, event: bool, prefix: str) -> None:
        self.rest = rest
        self.event = event
        self.prefix = prefix.rstrip("/")
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="null-api")

    def filter(self, body: dict[str, Any]) -> dict[str, Any]:
        names = body.get("nodenames") or []
        return {"nodenames": names[:1], "failedNodes": {}, "failedAndUnresolvableNodes": {}, "error": ""}

    def bind(self, body: dict[str, Any]) -> dict[str, Any]:
        ns, name, node, uid = body["podnamespace"], body["podname"], body["node"], body.get("poduid")
        try:
            self.rest.request("POST", f"/api/v1/namespaces/{ns}/pods/{name}/binding", {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        except Exception as exc:  # the answer carries the error, as ours does
            return {"error": f"bind failed: {exc}"}
        if self.event:
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            event = {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{name}.{uuid.uuid4().hex[:12]}", "namespace": ns},
                "involvedObject": {"kind": "Pod", "namespace": ns, "name": name, "uid": uid},
                "reason": "Placed", "message": f"placed on {node}", "type": "Normal",
                "source": {"component": "null-extender"}, "firstTimestamp": now, "lastTimestamp": now,
                "count": 1}
            with contextlib.suppress(Exception):  # an event is best effort, as ours is
                self.rest.request("POST", f"/api/v1/namespaces/{ns}/events", event)
        return {"error": ""}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        path = scope["path"]
        # kube-scheduler's extender types carry no JSON tags: keys are Go field names ("NodeNames"),
        # matched case-insensitively, as Go decodes them.
        def args() -> dict[str, Any]:
            return {str(k).lower(): v for k, v in orjson.loads(b"".join(chunks)).items()}

        status, out = 200, b"{}"
        if path.endswith("/readyz"):
            out = b"ok"
        elif path == f"{self.prefix}/filter":
            out = orjson.dumps(self.filter(args()))
        elif path == f"{self.prefix}/bind":
            loop = asyncio.get_running_loop()
            answer = await loop.run_in_executor(self.pool, self.bind, args())
            out = orjson.dumps(answer)
        else:
            status = 404
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--prefix", default="/scheduler", help="the path of the extender's urlPrefix")
    ap.add_argument("--no-event", action="store_true", help="bind only, no event per pod")
    args = ap.parse_args()
    config.load_kube_config(config_file=args.kubeconfig)
    api = client.ApiClient()
    app = NullExtender(JsonRest(api), not args.no_event, args.prefix)
    uvicorn.run(app, host="127.0.0.1", port=args.port, http="httptools", loop="uvloop", access_log=False,
                log_level="warning")


if __name__ == "__main__":
    main()
