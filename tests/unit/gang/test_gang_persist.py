"""Plans persisted on member pods survive a restart: no double allocation, bound members fixed."""

from __future__ import annotations

import copy
import json
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from app.base.objects import pod_object
from app.base.workload import parse_workload
from app.config.settings import Settings
from app.gang.kube import load_plan_records, min_members
from app.gang.ledger import GangPlan, Ledger, MemberPlan
from app.gang.persist import (
    ANNOTATION,
    BackgroundWriter,
    PlanSigner,
    decode,
    encode,
    load_key,
    records_from_pods,
)
from tests.unit.gang.test_gang_coordinator import Cluster

GPU = ("nvidia.com/gpu",)


def test_annotation_round_trip_and_junk() -> None:
    value = encode("ml/g", "n-3", 1767000000.1234, 4)
    assert decode(value) == {"gang": "ml/g", "node": "n-3", "planned_at": 1767000000.123, "epoch": 4}
    for junk in ("", "{", "[]", '{"gang": "ml/g"}', '{"gang": "g", "node": "n", "epoch": "x"}'):
        assert decode(junk) is None


def _pod(c: Cluster, name: str) -> dict[str, Any]:
    pod = copy.deepcopy(c.pods[name])
    pod["metadata"]["annotations"].update(c.binder.annotations.get(f"ml/{name}", {}))
    return pod


def test_records_come_only_from_pending_members_with_a_plan() -> None:
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 4)
    c.filter(pods[0])
    c.flush()
    listed = [_pod(c, f"g-{i}") for i in range(4)]
    listed[1]["spec"]["nodeName"] = "n-1"  # bound: a fact, not a plan
    listed[2]["status"]["phase"] = "Failed"
    listed[3]["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "other"  # changed gangs
    other = c.gang("h", 1, create=1)[0]  # no annotation
    records = records_from_pods([*listed, other], GPU)
    assert [r.pod for r in records] == ["ml/g-0"]
    r = records[0]
    assert r.gang == "ml/g" and r.gpus == 8 and r.uid == pods[0]["metadata"]["uid"]
    assert r.node == c.gangs.ledger.plans["ml/g"].members[r.uid].node


def restart(c: Cluster, bound: dict[str, str]) -> Cluster:
    """A fresh extender: the watch delivers nodes and pods, plans come from the annotations."""
    fresh = Cluster()
    for facts in c.service.snapshot.nodes.values():
        fresh.service.snapshot.upsert_node(facts)
    listed = []
    for name in c.pods:
        pod = _pod(c, name)
        if name in bound:
            pod["spec"]["nodeName"] = bound[name]
        listed.append(pod)
    restored = fresh.gangs.restore(records_from_pods(listed, GPU))
    assert restored == 1
    for pod in listed:
        fresh.add(pod)
        node = pod["spec"].get("nodeName")
        if node:
            fresh.service.snapshot.assume(parse_workload(pod), node)
    return fresh


def test_restart_mid_gang_resumes_without_double_allocation() -> None:
    c = Cluster()
    c.nodes("n", 6, "leaf-1")
    pods = c.gang("g", 4)
    plan = {p["metadata"]["name"]: c.filter(p).passed[0] for p in pods}
    c.flush()
    # The extender dies after binding two members; the other two were planned but not bound.
    bound = {"g-0": plan["g-0"], "g-1": plan["g-1"]}
    fresh = restart(c, bound)
    ledger = fresh.gangs.ledger
    assert ledger.total_reserved() == 16
    assert {ledger.reserved_gpus(plan[n], None) for n in ("g-2", "g-3")} == {8}
    # Another pod cannot take the reserved GPUs ...
    loner = pod_object("loner", namespace="ml", stage="pretraining", gpus=8)
    fresh.add(loner)
    free_for_loner = set(fresh.filter(loner).passed)
    assert not free_for_loner & set(plan.values())
    # ... and the remaining members get exactly their persisted nodes.
    for name in ("g-2", "g-3"):
        assert fresh.filter(fresh.pods[name]).passed == [plan[name]]
    # No GPU is over-committed once they bind.
    for name in ("g-2", "g-3"):
        fresh.place(fresh.pods[name])
    for n, u in fresh.service.snapshot.usage.items():
        assert u.gpus + fresh.gangs.reserved_gpus(n, None) <= 8
    assert fresh.gangs.ledger.total_reserved() == 0


def test_expired_and_half_written_plans_on_restart() -> None:
    ledger_ttl = Settings().gang_reservation_ttl_seconds
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 2)
    c.filter(pods[0])
    c.flush()
    records = records_from_pods([_pod(c, "g-0"), _pod(c, "g-1")], GPU)
    late = Cluster()
    assert late.gangs.restore(records, now=time.time() + ledger_ttl + 1) == 0
    assert late.gangs.ledger.total_reserved() == 0
    # A crash between two epochs' writes: both reservations are kept, the plan replans at once.
    mixed = [records[0], replace(records[1], epoch=7)]
    again = Cluster()
    assert again.gangs.restore(mixed) == 1
    assert again.gangs.ledger.plans["ml/g"].stale and again.gangs.ledger.total_reserved() == 16


class SlowTarget:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.events: list[str] = []
        self.gate = threading.Event()

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.gate.wait(5)
        self.calls.append((namespace, name, dict(annotations)))

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None:
        if reason == "Boom":
            raise RuntimeError("API down")
        self.events.append(reason)


def test_background_writer_coalesces_per_pod_and_survives_errors() -> None:
    target = SlowTarget()
    w = BackgroundWriter(target, workers=1)
    w.annotate("ml", "a", {ANNOTATION: "1"})  # taken by the worker, blocked on the gate
    time.sleep(0.05)
    w.annotate("ml", "b", {ANNOTATION: "1"})
    w.annotate("ml", "b", {ANNOTATION: "2"})  # coalesced with the queued write
    w.event("ml", "b", "u", "Boom", "x")
    w.event("ml", "b", "u", "GangPlanned", "x")
    target.gate.set()
    assert w.drain(5)
    assert target.calls == [("ml", "a", {ANNOTATION: "1"}), ("ml", "b", {ANNOTATION: "2"})]
    assert target.events == ["GangPlanned"]
    w.stop()


def test_ledger_accounting() -> None:
    led = Ledger(ttl=10)
    plan = GangPlan("ml/g", {"u1": MemberPlan("u1", "ml/a", "n1", 8), "u2": MemberPlan("u2", "ml/b", "n1", 4),
                             "u3": MemberPlan("u3", "ml/c", "n2", 8)}, planned_at=0, expires_at=10)
    led.put(plan)
    assert led.reserved_gpus("n1", None) == 12 and led.reserved_gpus("n1", "ml/g") == 0
    assert led.reserved_gpus("n1", "ml/other") == 12
    assert led.mark_bound("ml/g", "u2") and not led.mark_bound("ml/g", "u2")
    assert led.reserved_gpus("n1", None) == 8 and led.total_reserved() == 16
    replacement = GangPlan("ml/g", {"u1": MemberPlan("u1", "ml/a", "n3", 8)}, planned_at=1, expires_at=11)
    assert led.put(replacement) is plan
    assert led.reserved_gpus("n1", None) == 0 and led.reserved_gpus("n3", None) == 8
    assert led.expired(10.5) == [] and led.expired(11) == [replacement]
    assert led.total_reserved() == 0 and not led.plans


@pytest.mark.parametrize(("items", "want"), [
    ([{"metadata": {"name": "pg", "namespace": "ml"}, "spec": {"minMember": 8}}], {"ml/pg": 8}),
    ([{"metadata": {"name": "pg"}, "spec": {"minMember": "x"}}], {}),
    ([{"metadata": {"name": "pg"}, "spec": {}}], {}),
])
def test_podgroup_min_member(items: list[dict[str, Any]], want: dict[str, int]) -> None:
    assert min_members(items) == want


# --- forged plans (docs/gangs.md, "Restored plans") -------------------------------------------------
KEY = b"k" * 32


def _forged(c: Cluster, name: str, value: str) -> dict[str, Any]:
    pod = copy.deepcopy(c.pods[name])
    pod["metadata"]["annotations"][ANNOTATION] = value
    return pod


def test_forged_plan_from_the_future_is_not_restored() -> None:
    # A tenant annotates its own gang's pods with a plan dated far ahead: before, it was restored
    # and held 8 GPUs per member long past the reservation TTL.
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    c.gang("g", 2, create=2)
    future = time.time() + 10 * 365 * 86400
    forged = [_forged(c, f"g-{i}", encode("ml/g", "n-0", future, 1, f"ml/g-{i}")) for i in range(2)]
    fresh = Cluster()
    assert fresh.gangs.restore(records_from_pods(forged, GPU)) == 0
    assert fresh.gangs.ledger.total_reserved() == 0
    assert records_from_pods(forged, GPU, now=time.time()) == []


def test_with_a_key_only_plans_signed_for_that_pod_are_restored() -> None:
    signer = PlanSigner(KEY)
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    c.gang("g", 2, create=2)
    now = time.time()
    good = [_forged(c, f"g-{i}", encode("ml/g", "n-0", now, 1, f"ml/g-{i}", signer)) for i in range(2)]
    unsigned = [_forged(c, f"g-{i}", encode("ml/g", "n-0", now, 1, f"ml/g-{i}", PlanSigner(None)))
                for i in range(2)]
    other_key = [_forged(c, f"g-{i}", encode("ml/g", "n-0", now, 1, f"ml/g-{i}", PlanSigner(b"x" * 32)))
                 for i in range(2)]
    # A signed value copied onto another pod does not verify there (the pod is in the signature).
    copied = [_forged(c, "g-1", encode("ml/g", "n-0", now, 1, "ml/g-0", signer))]
    reasons: list[str] = []
    kw: dict[str, Any] = {"now": now, "ttl": 120.0, "signer": signer, "rejected": reasons.append}
    assert [r.pod for r in records_from_pods(good, GPU, **kw)] == ["ml/g-0", "ml/g-1"]
    assert records_from_pods(unsigned + other_key + copied, GPU, **kw) == []
    assert reasons == ["unsigned"] * 2 + ["bad_signature"] * 3
    # Tampering with a signed value (a later planned_at to outlive the TTL) breaks the signature.
    data = decode(good[0]["metadata"]["annotations"][ANNOTATION])
    assert data is not None
    data["planned_at"] = now + 3600
    tampered = _forged(c, "g-0", json.dumps(data))
    assert records_from_pods([tampered], GPU, **kw) == []


def test_key_from_the_environment() -> None:
    assert load_key({}) is None
    assert load_key({"LLMP_GANG_PLAN_KEY": "s" * 20}) == b"s" * 20
    with pytest.raises(RuntimeError, match="at least 16 bytes"):
        load_key({"LLMP_GANG_PLAN_KEY": "short"})
    with pytest.raises(RuntimeError, match="LLMP_GANG_PLAN_KEY_FILE"):
        load_key({"LLMP_GANG_PLAN_KEY_FILE": "/nonexistent/key"})


def test_restored_plan_on_a_node_that_does_not_exist_is_released() -> None:
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    c.gang("g", 2, create=2)
    now = time.time()
    forged = [_forged(c, f"g-{i}", encode("ml/g", "ghost-node", now, 1, f"ml/g-{i}")) for i in range(2)]
    fresh = restart_with(c, forged)
    assert fresh.gangs.ledger.total_reserved() == 0
    # Counted, once per plan released (the service's metrics, as wired in production).
    assert fresh.metric("llm_placement_rejected_gang_plans_total", reason="unknown_node") == 1


def test_poison_pod_in_the_restore_list_costs_only_itself() -> None:
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    c.gang("g", 2, create=2)
    now = time.time()
    good = [_forged(c, f"g-{i}", encode("ml/g", "n-0", now, 1, f"ml/g-{i}")) for i in range(2)]
    poison = copy.deepcopy(good[0])
    poison["metadata"]["name"] = "poison"
    poison["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1e400"}}
    weird = {"metadata": "x", "spec": []}
    got = records_from_pods([poison, weird, *good], GPU, now=now, skipped=lambda *_: None)
    assert [r.pod for r in got] == ["ml/g-0", "ml/g-1"]
    body = json.dumps({"items": [poison, weird, *good]}).encode()
    assert len(load_plan_records(lambda: body, GPU, attempts=1, delay=0)) == 2


def test_restore_listing_refuses_expired_plans_and_reports_every_refusal() -> None:
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    c.gang("g", 2, create=2)
    c.gang("h", 1, create=1)
    c.gang("k", 1, create=1)
    now = time.time()
    ttl = 120.0
    expired = [_forged(c, f"g-{i}", encode("ml/g", "n-0", now - 10 * ttl, 1, f"ml/g-{i}")) for i in range(2)]
    future = _forged(c, "h-0", encode("ml/h", "n-0", now + 3600, 1, "ml/h-0"))
    fresh = _forged(c, "k-0", encode("ml/k", "n-1", now - 1, 1, "ml/k-0"))
    junk = _forged(c, "k-0", "{not json")
    junk["metadata"]["name"] = "junk"
    # A broken pod without a plan is logged, not counted as a refused plan.
    body = json.dumps({"items": [*expired, future, fresh, junk, {"metadata": "x"}]}).encode()
    reasons: list[str] = []
    got = load_plan_records(lambda: body, GPU, attempts=1, delay=0, ttl=ttl, rejected=reasons.append)
    assert [r.pod for r in got] == ["ml/k-0"]
    assert sorted(reasons) == ["expired", "expired", "future", "unreadable"]
    # Without the TTL the listing keeps the expired plans (the coordinator would drop them silently).
    assert len(load_plan_records(lambda: body, GPU, attempts=1, delay=0)) == 3


def restart_with(c: Cluster, listed: list[dict[str, Any]]) -> Cluster:
    fresh = Cluster()
    for facts in c.service.snapshot.nodes.values():
        fresh.service.snapshot.upsert_node(facts)
    fresh.gangs.restore(records_from_pods(listed, GPU))
    for pod in listed:
        fresh.add(pod)
    fresh.gangs.lifecycle.maybe_sweep()
    fresh.gangs.lifecycle.locked_sweep(time.time(), force=True)
    return fresh
