"""MIG slices, device selectors and IMEX cliques read from DRA objects (docs/dra.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.reasons import ReasonCode
from app.base.workload import parse_workload
from app.cluster.cache import apply_node
from app.config.settings import Settings
from app.dra.index import DRIVER, DraIndex, product_matches, read_selectors
from app.extender.wiring import build_core
from app.snapshot.store import ClusterSnapshot
from tests.unit.dra.test_dra import GPU_CLASS, MIG_CLASS, gpu_device, rslice

H100 = "NVIDIA H100 80GB HBM3"
FULL, MIG1, MIG3 = "81559Mi", "9856Mi", "40192Mi"



def mig_device(gpu: int, profile: str, start: int, memory: str) -> dict[str, Any]:
    """A MIG device as NVIDIA's driver lists it: its own name, type mig, profile, parent UUID."""
    size = int(profile[0])
    return {"name": f"gpu-{gpu}-mig-{size}-{start}-{size}", "attributes": {
        "type": {"string": "mig"}, "uuid": {"string": f"MIG-{gpu}-{start}"},
        "parentUUID": {"string": f"GPU-{gpu}"}, "profile": {"string": profile},
        "productName": {"string": H100}, "architecture": {"string": "Hopper"}},
        "capacity": {"memory": {"value": memory}, "multiprocessors": {"value": str(16 * size)}}}


def partitioned(node: str, full: int = 0) -> dict[str, Any]:
    """GPU 0: one 3g.40gb + four 1g.10gb; GPU 1: two 3g.40gb; then ``full`` whole GPUs."""
    devices = [mig_device(0, "3g.40gb", 0, MIG3)] + [mig_device(0, "1g.10gb", 4 + i, MIG1) for i in range(4)]
    devices += [mig_device(1, "3g.40gb", s, MIG3) for s in (0, 4)]
    devices += [gpu_device(2 + i, H100, FULL) for i in range(full)]
    return rslice(node, devices)


def claim(name: str, cls: str = "mig.nvidia.com", count: int = 1, *exprs: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if exprs:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in exprs]
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}}}


def held(claim_obj: dict[str, Any], node: str, *devices: str) -> dict[str, Any]:
    return {**claim_obj, "status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": DRIVER, "pool": node, "device": d} for d in devices]}}}}


def claim_pod(name: str, claim_name: str, stage: str = "serving", **ann: str) -> dict[str, Any]:
    pod = pod_object(name, gpus=0, stage=stage, uid=f"u-{name}",
                     annotations={f"llm-placement.io/{k}": v for k, v in ann.items()})
    pod["spec"]["resourceClaims"] = [{"name": "r", "resourceClaimName": claim_name}]
    return pod


def test_mig_slices_are_node_facts_with_free_counts_from_allocated_claims(
        settings: Settings, catalog: GpuCatalog) -> None:
    snap = ClusterSnapshot()
    dra = snap.dra
    dra.put_slice(partitioned("m", full=1))
    apply_node(snap, catalog, settings, node_object("m"))
    f = snap.nodes["m"]
    by = {p: (round(gb, 1), n, free) for p, gb, n, free in f.mig}
    assert by == {"1g.10gb": (10.3, 4, 4), "3g.40gb": (42.1, 3, 3)}
    assert (f.gpu_count, f.mig_gpus, f.node_class.value) == (1, 2, "gpu")
    assert f.gpu is not None and f.hourly_cost == pytest.approx(3 * f.gpu.hourly_cost_usd)  # 3 physical GPUs

    # A claim allocated one 3g.40gb slice: the node's facts change, one fewer is free.
    dra.put_class(MIG_CLASS)
    changed = dra.put_claim(held(claim("a"), "m", "gpu-1-mig-3-0-3"))
    assert changed == {"m"}
    apply_node(snap, catalog, settings, node_object("m"))
    assert {p: free for p, _, _, free in snap.nodes["m"].mig} == {"1g.10gb": 4, "3g.40gb": 2}
    # A full GPU held by a claim changes the node too: it counts there as used (docs/dra.md).
    assert dra.put_claim(held(claim("b", "gpu.nvidia.com"), "m", "gpu-2")) == {"m"}
    assert dra.drop_claim("default/a") == {"m"}
    assert dra.mig_of("m")[1][3] == 3


def test_partitioned_node_refuses_full_gpu_and_cpu_pods(settings: Settings, catalog: GpuCatalog) -> None:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    svc.snapshot.dra.put_slice(partitioned("m"))
    apply_node(svc.snapshot, svc.catalog, svc.settings, node_object("m"))
    assert svc.snapshot.nodes["m"].gpu_count == 0 and svc.snapshot.nodes["m"].node_class.value == "gpu"
    full = svc.placer.filter(pod_object("w", gpus=1, stage="serving", uid="u-w"), ["m"])
    assert full.failed == {} and "partitioned into MIG" in full.unresolvable["m"]
    prep = svc.placer.filter(pod_object("p", stage="data-prep", cpu="4", uid="u-p"), ["m"])
    assert "stay off GPU nodes" in prep.unresolvable["m"]


def _mig_core() -> Any:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    dra = svc.snapshot.dra
    dra.put_class(MIG_CLASS)
    dra.put_class(GPU_CLASS)
    dra.put_slice(partitioned("m"))
    dra.reads_claims = True
    return svc


def _absorb(svc: Any, node: str = "m") -> None:
    apply_node(svc.snapshot, svc.catalog, svc.settings, node_object(node))


def test_mig_demand_is_fitted_to_slice_memory() -> None:
    svc = _mig_core()
    dra = svc.snapshot.dra
    prof = 'device.attributes["gpu.nvidia.com"].profile == "{}"'
    dra.put_claim(claim("small", "mig.nvidia.com", 1, prof.format("1g.10gb")))
    dra.put_claim(claim("big", "mig.nvidia.com", 1, prof.format("3g.40gb")))
    dra.put_claim(claim("any"))
    _absorb(svc)
    seven_b = {"model-params": "7B", "latency-class": "batch"}
    spec = parse_workload(claim_pod("b", "big", **seven_b), claims=svc.snapshot.claim_reader())
    assert (spec.gpus, spec.mig_slices, spec.mig_profiles) == (0, 1, ("3g.40gb",))
    # A class of the driver that names no device type, and a profile in the request: MIG too.
    dra.put_class({"metadata": {"name": "any"}, "spec": {"selectors": [{"cel": {
        "expression": "device.driver == 'gpu.nvidia.com'"}}]}})
    dra.put_claim(claim("by-profile", "any", 1, prof.format("3g.40gb")))
    assert parse_workload(claim_pod("p", "by-profile"), claims=svc.snapshot.claim_reader()).mig_slices == 1

    # 7B bf16 (~16 GB with its KV cache) does not fit a 10 GB slice, fits a 40 GB one.
    small = svc.placer.filter(claim_pod("s", "small", **seven_b), ["m"])
    assert "per MIG slice" in small.unresolvable["m"] and "MIG slice memory too small" in small.unresolvable["m"]
    big = svc.placer.filter(claim_pod("b", "big", **seven_b), ["m"])
    assert big.passed == ["m"]
    fit = big.fits["m"]
    # Priced as its share: 3 of 8 memory slices' worth of one of two GPUs, not the CPU-node rate.
    assert 0 < fit.pod_hourly_cost < svc.snapshot.nodes["m"].hourly_cost / 2
    # "Any MIG slice": kube-scheduler may hand out a 1g.10gb one, so the smallest free slice decides.
    assert "MIG slice memory" in svc.placer.filter(claim_pod("a", "any", **seven_b), ["m"]).unresolvable["m"]
    for i in range(4):  # every 1g.10gb slice taken: now "any" can only be a 3g.40gb
        dra.put_claim(held(claim(f"h{i}"), "m", f"gpu-0-mig-1-{4 + i}-1"))
    _absorb(svc)
    assert svc.placer.filter(claim_pod("a", "any", **seven_b), ["m"]).passed == ["m"]


def test_mig_slices_are_never_over_committed() -> None:
    svc = _mig_core()
    dra = svc.snapshot.dra
    two = claim("two", "mig.nvidia.com", 2, 'device.attributes["gpu.nvidia.com"].profile in ["3g.40gb"]')
    dra.put_claim(two)
    _absorb(svc)
    assert svc.placer.filter(claim_pod("p", "two"), ["m"]).passed == ["m"]
    dra.put_claim(held(claim("x"), "m", "gpu-1-mig-3-0-3", "gpu-1-mig-3-4-3"))
    _absorb(svc)
    d = svc.placer.filter(claim_pod("p", "two"), ["m"])
    assert d.passed == [] and "not enough free MIG slices" in d.failed["m"]  # resolvable: preemption
    assert d.codes[d.failed["m"]] is ReasonCode.GPUS_BUSY
    dra.put_claim(claim("huge", "mig.nvidia.com", 1, 'device.attributes["gpu.nvidia.com"].profile == "7g.80gb"'))
    assert "no MIG slice of the claimed profile" in svc.placer.filter(
        claim_pod("q", "huge"), ["m"]).unresolvable["m"]


SEL = 'device.attributes["gpu.nvidia.com"].productName'
MEM = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{}")) >= 0'


@pytest.mark.parametrize(("expr", "accepts", "rejects"), [
    (f'{SEL} == "NVIDIA L4"', "NVIDIA L4", H100),
    (f'{SEL} in ["NVIDIA L4", "NVIDIA H100 80GB HBM3"]', H100, "NVIDIA A100-SXM4-40GB"),
    (f"{SEL}.startsWith('NVIDIA H100')", H100, "NVIDIA H200"),
    (f'{SEL}.matches("H(100|200)")', "NVIDIA H200", "NVIDIA L4"),
    (f"device.driver == 'gpu.nvidia.com' && ({SEL} == 'NVIDIA L4')", "NVIDIA L4", H100),
])
def test_recognised_product_selectors(expr: str, accepts: str, rejects: str) -> None:
    sel = read_selectors([{"cel": {"expression": expr}}])
    assert sel.unread == ()
    assert product_matches(sel.products, accepts) and not product_matches(sel.products, rejects)


def test_memory_selectors_and_what_is_left_to_kube_scheduler() -> None:
    sel = read_selectors([{"cel": {"expression": MEM.format("40Gi")}}])
    assert sel.min_memory_mib == 40 * 1024 and sel.unread == ()
    for expr in (f'{SEL} == "NVIDIA L4" || {SEL} == "NVIDIA T4"',  # a disjunction: not a restriction
                 f'!({SEL} == "NVIDIA L4")',
                 'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("570.0.0"))',
                 f'{SEL} == "NVIDIA L4" && device.attributes["other.example.com"].productName == "x"'):
        got = read_selectors([{"cel": {"expression": expr}}])
        assert got.unread, expr
    # The readable half of a conjunction still restricts; the other half is named.
    half = read_selectors([{"cel": {"expression": f'{SEL} == "NVIDIA L4" && device.attributes'
                                                  '["example.com"].brand == "Nvidia"'}}])
    assert half.products == (("in", ("NVIDIA L4",)),) and len(half.unread) == 1


def test_selectors_restrict_feasible_gpus_and_explain_names_the_rest(
        settings: Settings, catalog: GpuCatalog) -> None:
    from app.extender.explain import explain_spec
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    dra = svc.snapshot.dra
    dra.put_class(GPU_CLASS)
    dra.put_slice(rslice("h", [gpu_device(i, H100, FULL) for i in range(8)]))
    dra.put_slice(rslice("l", [gpu_device(i, "NVIDIA L4", "23034Mi") for i in range(8)]))
    for n in ("h", "l"):
        _absorb(svc, n)
    dra.reads_claims = True
    dra.put_claim(claim("model", "gpu.nvidia.com", 1, f"{SEL}.startsWith('NVIDIA L')"))
    dra.put_claim(claim("mem", "gpu.nvidia.com", 1, MEM.format("40Gi")))
    dra.put_claim(claim("odd", "gpu.nvidia.com", 1, f'{SEL} == "NVIDIA L4" || {SEL} == "NVIDIA T4"'))
    batch = {"latency-class": "batch"}
    d = svc.placer.filter(claim_pod("a", "model", **batch), ["h", "l"])
    assert d.passed == ["l"] and d.codes[d.unresolvable["h"]] is ReasonCode.DEVICE_SELECTOR
    assert svc.placer.filter(claim_pod("b", "mem", **batch), ["h", "l"]).passed == ["h"]
    # Not read: both nodes stay ours to rank, kube-scheduler applies the selector, explain says so.
    assert svc.placer.filter(claim_pod("c", "odd", **batch), ["h", "l"]).passed == ["h", "l"]
    out = explain_spec(svc, parse_workload(claim_pod("c", "odd", **batch), claims=svc.snapshot.claim_reader()))
    assert out["claims"]["left_to_kube_scheduler"][0].startswith(
        "selector not interpreted, left to kube-scheduler: device.attributes")


def test_clique_from_slices_is_the_nvlink_domain_and_gfd_label_wins(
        settings: Settings, catalog: GpuCatalog) -> None:
    snap = ClusterSnapshot()
    devs = [gpu_device(i, H100, FULL) for i in range(4)]
    for d in devs:
        d["attributes"]["cliqueID"] = {"string": "nvl72-a.1"}
    snap.dra.put_slice(rslice("n", devs))
    apply_node(snap, catalog, settings, node_object("n"))
    assert snap.nodes["n"].nvlink_domain == "nvl72-a.1"
    apply_node(snap, catalog, settings, node_object("n", labels={"nvidia.com/gpu.clique": "gfd.7"}))
    assert snap.nodes["n"].nvlink_domain == "gfd.7"


def test_gang_lands_inside_one_clique_when_one_fits() -> None:
    """Three 4-GPU members; cliques a (a-0: 4 of 8 free, a-1: 8 of 8 free) and b (b-0: 2 of 8 free,
    b-1: 8 of 12 free), all under one leaf, every GPU known only from slices carrying a clique id.

    Clique a holds the gang. Without clique identity every node is its own NVLink domain and the
    best-fit plan is a-0 + b-1 (no whole node opened), across both cliques; with it, the plan stays
    in clique a (docs/gangs.md: the NVLink domain is the innermost multi-node tier).
    """
    from app.base.workload import Stage
    from app.snapshot.store import PlacedPod

    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    dra = svc.snapshot.dra
    layout = {"a-0": (8, 4), "a-1": (8, 0), "b-0": (8, 6), "b-1": (12, 4)}  # node -> (GPUs, used)
    for name, (gpus, used) in layout.items():
        devs = [gpu_device(g, "NVIDIA GB200", "189471Mi") for g in range(gpus)]
        for d in devs:
            d["attributes"]["cliqueID"] = {"string": f"cluster-x.{name[0]}"}
        dra.put_slice(rslice(name, devs))
        apply_node(svc.snapshot, svc.catalog, svc.settings, node_object(
            name, rdma=True, labels={"fabric.topograph.run/tier-0": "leaf"}))
        if used:
            svc.snapshot.place(PlacedPod(f"u-{name}", f"x/{name}", name, used, 0, 0, Stage.PRETRAINING,
                                         None, None))
    pods = [pod_object(f"g-{i}", namespace="ml", stage="pretraining", gpus=4, uid=f"u-g-{i}",
                       annotations={"llm-placement.io/gang-size": "3"},
                       labels={"scheduling.x-k8s.io/pod-group": "g"}) for i in range(3)]
    for p in pods:
        svc.snapshot.track_spec(parse_workload(p, claims=svc.snapshot.claim_reader()))
    names = sorted(svc.snapshot.nodes)
    chosen = []
    for p in pods:
        out = json.loads(svc.filter(json.dumps({"Pod": p, "NodeNames": names}).encode()))
        assert len(out["NodeNames"]) == 1, out
        chosen.append(out["NodeNames"][0])
    assert sorted(chosen) == ["a-0", "a-1", "a-1"]


def test_hostile_selectors_and_claims_cost_nothing() -> None:
    import time
    # Nested quantifiers would make Python's backtracking exponential on a product name: such a
    # pattern is left to kube-scheduler (RE2), as are over-long or broken ones.
    for pattern in ("(a*)*b", "(.+)+x", "a*b*c*d*e", "x" * 200, "(", "[z-a]"):
        sel = read_selectors([{"cel": {"expression": f'{SEL}.matches("{pattern}")'}}])
        assert sel.products == () and sel.unread, pattern
    t0 = time.monotonic()
    read_selectors([{"cel": {"expression": "(" * 2000 + "x" + ")" * 2000}}])
    read_selectors([{"cel": {"expression": " && ".join([f'{SEL} == "x"'] * 500)}}])
    assert time.monotonic() - t0 < 0.2
    dra = DraIndex()
    dra.put_class(MIG_CLASS)
    for spec in (None, {"devices": {"requests": [{"exactly": {"deviceClassName": "mig.nvidia.com",
                                                               "selectors": "x", "count": -3}}]}}):
        dra.put_claim({"metadata": {"name": "c", "namespace": "default"}, "spec": spec,
                       "status": {"allocation": {"devices": {"results": [None, {"driver": DRIVER}]}}}})
    assert dra.pod_devices({"spec": {"resourceClaims": "x"}}).model_dump(exclude_defaults=True) == {}
    pod = {"metadata": {"namespace": "default"}, "spec": {"resourceClaims": [{"name": "r", "resourceClaimName": "c"}]}}
    assert dra.pod_devices(pod).mig_slices == 0
    assert dra.drop_claim("default/c") == set() and dra.claim_book.held == {}


def test_placed_message_describes_a_mig_pod_whose_own_slice_is_held() -> None:
    # At bind the pod's claim is already allocated (PreBind), so its own slice is not free: the
    # Placed event's description must not take that for "no room".
    from app.placement.feasibility import UNCHECKED, NodeFit, evaluate
    svc = _mig_core()
    dra = svc.snapshot.dra
    dra.put_claim(held(claim("mine"), "m", "gpu-1-mig-3-0-3"))
    dra.put_claim(held(claim("other"), "m", "gpu-1-mig-3-4-3", "gpu-0-mig-3-0-3"))
    _absorb(svc)
    spec = parse_workload(claim_pod("p", "mine", **{"model-params": "7B", "latency-class": "batch"}), claims=svc.snapshot.claim_reader())
    assert spec.mig_profiles == ("3g.40gb",)
    facts, usage = svc.snapshot.nodes["m"], svc.snapshot.usage["m"]
    policy = svc.policies.placement.feasibility
    assert evaluate(spec, facts, usage, 0, policy).code is ReasonCode.GPUS_BUSY  # type: ignore[union-attr]
    assert isinstance(evaluate(spec, facts, usage, UNCHECKED, policy), NodeFit)
