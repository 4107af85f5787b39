"""kube-scheduler's extender wire format (k8s.io/kube-scheduler/extender/v1).

The Go structs have no json tags, so the scheduler sends Go field names (PascalCase) and decodes
case-insensitively; older extenders sent lowercase. We therefore match *top-level* keys in any case
and always answer in exact PascalCase. Absent fields arrive as ``null``. Bodies are parsed with
orjson straight from bytes: on a 5,000-name request this is the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.base.reasons import EVENT_MESSAGE_CHARS, one_line

MAX_NAME = 1024  # longer than any Kubernetes name: refused rather than carried into logs and events


class WireError(ValueError):
    """The request is not a valid extender message; the text goes into the response's Error."""


@dataclass(slots=True)
class ExtenderArgs:
    pod: dict[str, Any]
    nodes: list[dict[str, Any]] | None  # nodeCacheCapable: false
    node_names: list[str] | None  # nodeCacheCapable: true

    @property
    def cache_mode(self) -> bool:
        return self.node_names is not None

    def names(self) -> list[str]:
        if self.node_names is not None:
            return self.node_names
        return [str((n.get("metadata") or {}).get("name") or "") for n in self.nodes or []]


@dataclass(slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


@dataclass(slots=True)
class PreemptionArgs:
    pod: dict[str, Any]
    # node -> victim pod UIDs (full pods are reduced to their UIDs on the way in)
    victims: dict[str, list[str]]
    pdb_violations: dict[str, int]


def _object(body: bytes, verb: str) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"malformed {verb} request: invalid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise WireError(f"malformed {verb} request: expected a JSON object")
    # Case-insensitive at the top level only: Pod/Node bodies keep Kubernetes' own casing.
    return {str(k).lower(): v for k, v in data.items()}


def _check_object(obj: dict[str, Any], what: str, verb: str) -> None:
    """The parts of a Pod or Node every verb reads must have their Kubernetes types (docs/
    extender-protocol.md): a string where an object belongs is answered as malformed, not a 500."""
    for part in ("metadata", "spec", "status"):
        if obj.get(part) is not None and not isinstance(obj[part], dict):
            raise WireError(f"malformed {verb} request: {what}.{part} must be an object")
    meta = obj.get("metadata") or {}
    for key in ("name", "namespace", "uid", "resourceVersion"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise WireError(f"malformed {verb} request: {what}.metadata.{key} must be a string")
    for key in ("labels", "annotations"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise WireError(f"malformed {verb} request: {what}.metadata.{key} must be an object")


def parse_extender_args(body: bytes, verb: str = "filter") -> ExtenderArgs:
    data = _object(body, verb)
    pod = data.get("pod")
    if not isinstance(pod, dict):
        raise WireError(f"malformed {verb} request: Pod is missing or not an object")
    _check_object(pod, "Pod", verb)
    names = data.get("nodenames")
    nodes_obj = data.get("nodes")
    node_list: list[dict[str, Any]] | None = None
    if names is not None:
        # map(type) runs in C: on 5,000 names a generator of isinstance calls cost ~0.3 ms.
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise WireError(f"malformed {verb} request: NodeNames must be a list of strings")
    elif nodes_obj is not None:
        items = nodes_obj.get("items") if isinstance(nodes_obj, dict) else None
        if items is None and isinstance(nodes_obj, dict):
            items = []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise WireError(f"malformed {verb} request: Nodes.items must be a list of Node objects")
        for item in items:
            _check_object(item, "Nodes.items[]", verb)
        node_list = items
    return ExtenderArgs(pod=pod, nodes=node_list, node_names=names)


def parse_binding_args(body: bytes) -> BindingArgs:
    data = _object(body, "bind")
    fields = {}
    for key in ("podname", "podnamespace", "poduid", "node"):
        v = data.get(key)
        if key != "poduid" and (not isinstance(v, str) or not v):
            raise WireError(f"malformed bind request: {key} is missing or not a string")
        if key == "poduid" and v is not None and not isinstance(v, str):
            raise WireError("malformed bind request: poduid must be a string")
        if isinstance(v, str) and len(v) > MAX_NAME:
            raise WireError(f"malformed bind request: {key} longer than {MAX_NAME} characters")
        fields[key] = str(v or "")
    return BindingArgs(fields["podname"], fields["podnamespace"], fields["poduid"], fields["node"])


def parse_preemption_args(body: bytes) -> PreemptionArgs:
    data = _object(body, "preempt")
    pod = data.get("pod")
    if not isinstance(pod, dict):
        raise WireError("malformed preempt request: Pod is missing or not an object")
    _check_object(pod, "Pod", "preempt")
    victims: dict[str, list[str]] = {}
    pdb: dict[str, int] = {}
    raw = data.get("nodenametometavictims") or data.get("nodenametovictims") or {}
    if not isinstance(raw, dict):
        raise WireError("malformed preempt request: victims must be a map of node to victims")
    for node, v in raw.items():
        v = v or {}
        if not isinstance(v, dict):
            raise WireError("malformed preempt request: victims of a node must be an object")
        pods = v.get("Pods") or v.get("pods") or []
        if not isinstance(pods, list):
            raise WireError("malformed preempt request: victims' Pods must be a list")
        uids: list[str] = []
        for p in pods:
            if not isinstance(p, dict):
                continue
            meta = p.get("metadata")
            uid = p.get("UID") or p.get("uid") or (meta.get("uid") if isinstance(meta, dict) else None)
            if isinstance(uid, str) and uid:
                uids.append(uid)
        victims[str(node)] = uids
        n = v.get("NumPDBViolations") or v.get("numPDBViolations") or 0
        pdb[str(node)] = n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 else 0
    return PreemptionArgs(pod=pod, victims=victims, pdb_violations=pdb)


def filter_result(
    args: ExtenderArgs | None,
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> bytes:
    """Echo a subset in the mode the scheduler used: NodeNames (cache) or full Node objects."""
    result: dict[str, Any] = {
        "NodeNames": None,
        "Nodes": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": one_line(error, EVENT_MESSAGE_CHARS) if error else "",
    }
    if args is None or args.cache_mode:
        result["NodeNames"] = passed
    else:
        keep = set(passed)
        items = [n for n in args.nodes or [] if (n.get("metadata") or {}).get("name") in keep]
        result["Nodes"] = {"metadata": {}, "items": items}
    return orjson.dumps(result)


def priority_pairs(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """The HostPriorityList from two columns (scores computed as columns make no objects for it)."""
    return orjson.dumps([{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)])


def binding_result(error: str = "") -> bytes:
    # kube-scheduler writes this error into a FailedScheduling event: one escaped, bounded line.
    return orjson.dumps({"Error": one_line(error, EVENT_MESSAGE_CHARS) if error else ""})


def preemption_result(victims: dict[str, list[str]], pdb: dict[str, int]) -> bytes:
    return orjson.dumps(
        {
            "NodeNameToMetaVictims": {
                node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb.get(node, 0)}
                for node, uids in victims.items()
            }
        }
    )
