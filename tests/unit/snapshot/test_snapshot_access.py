"""Verbs decide on one view of the cluster snapshot and write it only through their assumptions.

Three ways to fail: a verb module that writes the snapshot directly (a static check over the verbs'
source), a write from a thread holding a view (the snapshot refuses it at run time), and a filter
whose verdict matches no single instant of the watch while a watcher applies a burst of node and
pod events (checked against a replay of the same events, one at a time).
"""

from __future__ import annotations

import ast
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import PREFIX, parse_workload
from app.cluster.cache import ClusterCache, apply_pod
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.snapshot.store import ReadOnlyView

ROOT = Path(__file__).resolve().parents[3]
# Every module a verb's request runs through (filter, prioritize, bind, preempt, explain): the verbs,
# the HTTP layer, the pure placement parts and the gang coordinator. Left out: the snapshot and its
# access (the writes themselves), the PodGroup watcher (app/gang/kube.py) and the wiring, which
# builds the watches and ages the snapshot between events (app/extender/wiring.py): no verb runs them.
WRITERS = {ROOT / "app" / p
           for p in ("snapshot/store.py", "snapshot/access.py", "gang/kube.py", "extender/wiring.py")}
VERB_FOLDERS = ("base", "serving", "dra", "snapshot", "placement", "bind", "extender", "api", "gang")
VERB_MODULES = sorted(
    [p for folder in VERB_FOLDERS for p in (ROOT / "app" / folder).glob("*.py") if p not in WRITERS]
    + [ROOT / "app" / "config" / "policy.py"]
)
MUTATORS = frozenset({"upsert_node", "remove_node", "place", "assume", "unassume", "finish", "refresh_dra",
                      "forget_finished_before", "track_spec", "untrack_spec"})
CONTAINER_WRITES = frozenset({"pop", "popitem", "update", "setdefault", "clear", "add", "discard",
                              "append", "remove", "set_node", "set_usage"})
SNAPSHOT_NAMES = frozenset({"snapshot", "snap"})


def _chain(node: ast.AST) -> list[str]:
    """The names along an attribute/subscript chain: ``self.snapshot.nodes[x]`` -> self, snapshot, nodes."""
    out: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Name):
            out.append(node.id)
            return out[::-1]
        else:
            return out[::-1]


def direct_writes(source: str) -> list[str]:
    """Writes to the snapshot in ``source`` that do not go through ``access`` (line: code)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            chain = _chain(node.func)
            receiver = chain[:-1]
            if "access" in receiver:
                continue
            if node.func.attr in MUTATORS | CONTAINER_WRITES and SNAPSHOT_NAMES & set(receiver):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        for t in targets:
            if (isinstance(t, (ast.Attribute, ast.Subscript))
                    and SNAPSHOT_NAMES & set(_chain(t)[:-1] if isinstance(t, ast.Attribute) else _chain(t))):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("code", [
    "self.snapshot.assume(spec, node)",
    "self.snapshot.unassume(uid)",
    "snap.upsert_node(facts)",
    "self.snapshot.node_inputs[name] = x",
    "self.snapshot.generation += 1",
    "snap.usage['n'].gpus = 3",
    "self.snapshot.specs.pop(uid)",
    "del self.snapshot.pods[uid]",
])
def test_the_check_catches_a_direct_write(code: str) -> None:
    assert direct_writes(code)


@pytest.mark.parametrize("code", [
    "self.access.assume(spec, node)",
    "self.access.forget(uid)",
    "x = self.snapshot.nodes.get(n)",
    "with self.access.view() as snap:\n    spec = snap.specs.get(uid)",
])
def test_the_check_lets_reads_and_assumptions_through(code: str) -> None:
    assert direct_writes(code) == []


@pytest.mark.parametrize("path", VERB_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_verb_module_writes_the_snapshot_directly(path: Path) -> None:
    assert direct_writes(path.read_text()) == []


# --- the guard at run time ---------------------------------------------------------------------
def _service(catalog: GpuCatalog, nodes: int = 4) -> ExtenderService:
    svc = ExtenderService(Settings(cluster_source="none", metrics_port=0), catalog)
    for i in range(nodes):
        svc.absorb_node(node_object(f"g{i}", gpus=8, product="NVIDIA-L4"))
    return svc


def test_a_write_inside_a_view_is_refused_but_an_assumption_goes_through(catalog: GpuCatalog,
                                                                         settings: Settings) -> None:
    svc = _service(catalog)
    spec = parse_workload(pod_object("a", gpus=2, uid="u-a"), settings.policies().placement.gpu_resources)
    with svc.access.view() as snap, pytest.raises(ReadOnlyView):
        snap.assume(spec, "g0")
    with svc.access.view() as snap:
        svc.access.assume(spec, "g0")
        assert snap.free_gpus("g0") == 6
        svc.access.forget("u-a")
        assert snap.free_gpus("g0") == 8
    svc.snapshot.assume(spec, "g1")  # outside a view (a watcher's thread): allowed
    assert svc.snapshot.free_gpus("g1") == 6


def test_another_thread_may_write_while_a_view_waits_without_the_lock(catalog: GpuCatalog,
                                                                      settings: Settings) -> None:
    """A gang filter waits for its solve with the lock released (docs/gangs.md): the watcher's
    writes meanwhile are not the verb's and must not be refused."""
    svc = _service(catalog)
    spec = parse_workload(pod_object("b", gpus=1, uid="u-b"), settings.policies().placement.gpu_resources)
    cond = threading.Condition(svc.lock)
    errors: list[BaseException] = []

    def watcher() -> None:
        try:
            with svc.lock:
                svc.snapshot.assume(spec, "g2")
                cond.notify_all()
        except BaseException as exc:  # reported below
            errors.append(exc)

    with svc.access.view() as snap:
        t = threading.Thread(target=watcher)
        t.start()
        cond.wait(timeout=10)
        t.join(timeout=10)
        assert errors == [] and snap.free_gpus("g2") == 7


def test_a_filter_that_writes_the_snapshot_answers_an_error(catalog: GpuCatalog,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    svc = _service(catalog)
    real = svc.placer.filter

    def writing_filter(pod: dict[str, Any], names: list[str]) -> Any:
        svc.snapshot.remove_node("g3")
        return real(pod, names)

    monkeypatch.setattr(svc.placer, "filter", writing_filter)
    body = json.dumps({"Pod": pod_object("c", gpus=1, uid="u-c"), "NodeNames": ["g0", "g3"]}).encode()
    out = json.loads(svc.filter(body))
    assert "internal error in filter" in out["Error"] and "g3" in svc.snapshot.nodes


# --- one instant per filter under a burst of watch events --------------------------------------
SEVEN_B = {PREFIX + "model-params": "7B", PREFIX + "precision": "int8"}
PRODUCTS = ("NVIDIA-L4", "NVIDIA-H100-80GB-HBM3", "Tesla-T4", "NVIDIA-A100-SXM4-80GB")


class _NoEvents:
    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None:
        return None


def _watched(catalog: GpuCatalog) -> tuple[ExtenderService, ClusterCache]:
    settings = Settings(cluster_source="kubernetes", metrics_port=0)
    svc = ExtenderService(settings, catalog)
    svc.ready.set()
    cache = ClusterCache(client.ApiClient(), svc.snapshot, svc.lock, catalog, settings, svc.metrics,
                         events=_NoEvents())
    return svc, cache


def _burst(seed: int, nodes: int, events: int) -> tuple[list[tuple[str, str, dict[str, Any]]], list[str]]:
    """Node and pod events that each change what fits where: nodes come, go and change GPU model;
    pods are bound and finish. Every event moves the snapshot's generation."""
    rng = random.Random(seed)
    out: list[tuple[str, str, dict[str, Any]]] = []
    names = [f"n{i}" for i in range(nodes)]
    live = set(names[: nodes // 2])
    for n in sorted(live):
        out.append(("nodes", "ADDED", node_object(n, gpus=8, product=rng.choice(PRODUCTS))))
    bound: dict[str, str] = {}
    for i in range(events):
        roll = rng.random()
        if roll < 0.25:
            n = rng.choice(names)
            if n in live and rng.random() < 0.4:
                live.discard(n)
                out.append(("nodes", "DELETED", node_object(n)))
            else:
                live.add(n)
                out.append(("nodes", "MODIFIED", node_object(n, gpus=rng.choice((4, 8)),
                                                              product=rng.choice(PRODUCTS))))
        elif roll < 0.75 or not bound:
            if not live:
                continue
            p = pod_object(f"w{i}", gpus=rng.choice((1, 2, 4)), uid=f"w{i}", stage="serving",
                           annotations=SEVEN_B)
            node = rng.choice(sorted(live))
            p["spec"]["nodeName"] = node
            p["status"]["phase"] = "Running"
            bound[p["metadata"]["uid"]] = node
            out.append(("pods", "ADDED", p))
        else:
            uid = rng.choice(sorted(bound))
            del bound[uid]
            out.append(("pods", "DELETED", {"metadata": {"uid": uid, "name": uid, "namespace": "default"}}))
    return out, names


PENDING = [
    pod_object("want-1", gpus=1, uid="want-1", stage="serving", annotations=SEVEN_B),
    pod_object("want-4", gpus=4, uid="want-4", stage="serving",
               annotations={PREFIX + "model-params": "70B", PREFIX + "precision": "bf16"}),
    pod_object("want-8", gpus=8, uid="want-8", stage="training"),
]


def _verdict(svc: ExtenderService, pod: dict[str, Any], names: list[str]) -> tuple[Any, ...]:
    out = json.loads(svc.filter(json.dumps({"Pod": pod, "NodeNames": names}).encode()))
    return (tuple(out.get("NodeNames") or ()), tuple(sorted((out.get("FailedNodes") or {}).items())),
            tuple(sorted((out.get("FailedAndUnresolvableNodes") or {}).items())), out.get("Error") or "")


def test_each_filter_decides_on_one_instant_of_a_burst_of_watch_events(catalog: GpuCatalog) -> None:
    events, names = _burst(seed=7, nodes=40, events=400)
    svc, cache = _watched(catalog)
    seen: list[tuple[int, int, tuple[Any, ...]]] = []  # (generation decided on, pod, verdict)
    real = svc.placer.filter

    def stamped(pod: dict[str, Any], node_names: list[str]) -> Any:
        stamp[threading.get_ident()] = svc.snapshot.generation
        return real(pod, node_names)

    stamp: dict[int, int] = {}  # thread -> the generation its last filter decided on
    svc.placer.filter = stamped  # type: ignore[method-assign]
    done = threading.Event()

    def watcher() -> None:
        for i, (kind, etype, obj) in enumerate(events):
            cache._apply(kind, etype, json.loads(json.dumps(obj)))
            if i % 20 == 0:
                time.sleep(0.001)  # a burst, but one the filters overlap on any machine
        done.set()

    def filters() -> None:
        i = 0
        while not done.is_set():
            k = i % len(PENDING)
            verdict = _verdict(svc, PENDING[k], names)
            seen.append((stamp[threading.get_ident()], k, verdict))
            i += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # hand the GIL over often: a torn read gets its chance
    try:
        threads = [threading.Thread(target=watcher)] + [threading.Thread(target=filters) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(old)
    decided_mid_burst = [s for s in seen if 0 < s[0] < svc.snapshot.generation]
    assert len(decided_mid_burst) >= 20, "the filters did not overlap the burst; nothing was tested"

    # Replay the same events one at a time; at each instant, every filter the live run stamped with
    # that generation must get the same verdict.
    by_generation: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
    for gen, k, verdict in seen:
        by_generation.setdefault(gen, []).append((k, verdict))
    replay, replay_cache = _watched(catalog)
    checked = 0
    pending = dict(by_generation)
    for kind, etype, obj in [("", "", {}), *events]:
        if kind:
            replay_cache._apply(kind, etype, json.loads(json.dumps(obj)))
        for k, verdict in pending.pop(replay.snapshot.generation, ()):
            assert _verdict(replay, PENDING[k], names) == verdict, (
                f"filter of {PENDING[k]['metadata']['name']} at generation {replay.snapshot.generation} "
                "matches no single instant of the watch")
            checked += 1
    assert not pending, f"filters stamped with generations no instant of the watch had: {sorted(pending)[:5]}"
    assert checked == len(seen)


@pytest.mark.parametrize("before", ["nothing", "assumed", "watched", "elsewhere"])
def test_confirm_counts_the_pod_once_on_its_node(catalog: GpuCatalog, settings: Settings, before: str) -> None:
    svc = _service(catalog)
    pod = pod_object("d", gpus=2, uid="u-d")
    spec = parse_workload(pod, settings.policies().placement.gpu_resources)
    if before == "assumed":
        svc.access.assume(spec, "g0")
    elif before in ("watched", "elsewhere"):
        pod["spec"]["nodeName"] = "g0" if before == "watched" else "g1"
        with svc.lock:
            apply_pod(svc.snapshot, settings, pod)
    svc.access.confirm(spec, "g0")
    assert svc.snapshot.free_gpus("g0") == 6
    assert svc.snapshot.free_gpus("g1") == 8  # a pod the watch showed elsewhere moved (the watch wins later)
    assert svc.snapshot.pods["u-d"].assumed is (before != "watched")
