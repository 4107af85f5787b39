"""A small trace replayed through the real kube-scheduler onto kwok nodes: ours vs the default profile.

Proves the replay path bench/replay.py uses at trace scale: kwok keeps the nodes Ready, runs every
bound pod and finishes it after its (time-compressed) duration, kube-scheduler frees its GPUs and
places later pods on them. The trace is generated (a fixed seed), demands more GPUs over its span
than the cluster has, and arrives faster than pods finish, so placement decides what stays whole.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from kubeharness import ControlPlane, delete_all_pods, ensure_namespace, gpu_node, llm_pod
from kubeharness.kueue import Kueue, KueueBuildError, build_kueue, cluster_quota, queued
from kubeharness.kwok import Kwok, KwokBuildError, build_kwok, kwok_node_labels
from kubeharness.replay import (
    NodeCap,
    PodState,
    ReplayPod,
    ReplayResult,
    _sample,
    _TimeWeighted,
    pod_gang,
    pod_gpus,
    replay,
    restart_scheduler_with,
    synthetic_trace,
    variant_config,
    with_retry_backoff,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

NODES = 24
GPUS_PER_NODE = 8
PODS = 100
VIRTUAL_NODES = 5
VIRTUAL_PODS = 40
SPEED = 100.0  # trace seconds per wall second: a 1,500 s trace in ~15 s


@pytest.fixture(scope="module")
def kwok(control_plane: ControlPlane) -> Iterator[Kwok]:
    try:
        binary = build_kwok()
    except KwokBuildError as exc:
        pytest.fail(f"kwok unavailable: {exc}", pytrace=False)
    k = Kwok(binary, control_plane.admin_kubeconfig, control_plane.workdir)
    k.start()
    try:
        yield k
    finally:
        k.stop()


def _pod(name: str, gpus: int) -> dict[str, Any]:
    # Every third pod is plain (no stage): much of a shared cluster looks like that. Of the rest,
    # 1-GPU pods serve a small model interactively and bigger ones fine-tune it, so training and
    # latency-bound serving share the cluster and the separation rule has something to keep apart.
    if int(name.rsplit("-", 1)[-1]) % 3 == 0:
        return llm_pod(name, gpus=gpus, cpu="2", memory="8Gi")
    stage = "serving" if gpus == 1 else "alignment"
    return llm_pod(name, stage=stage, model_params="1B", gpus=gpus, cpu="2", memory="8Gi")


@pytest.fixture(scope="module")
def results(control_plane: ControlPlane, cluster: ClusterScope, kwok: Kwok) -> Iterator[dict[str, ReplayResult]]:
    manifests = [
        gpu_node(cluster.node_name(f"k{i:02d}"), "H100", gpus=GPUS_PER_NODE, cpu="96",
                 labels=kwok_node_labels(), index=i)
        for i in range(NODES)
    ]
    cluster.add_nodes(manifests)
    trace = synthetic_trace(PODS, seed=7, make_pod=_pod)
    out: dict[str, ReplayResult] = {}
    try:
        for variant in ("ours", "default"):
            ns = f"{cluster.namespace}-{variant}"
            ensure_namespace(control_plane.core, ns)
            restart_scheduler_with(control_plane, variant_config(control_plane, variant), f"replay-{variant}")
            try:
                out[variant] = replay(control_plane, ns, manifests, trace, variant=variant, speed=SPEED,
                                      settle_s=1.0, timeout_s=240.0, drain=False)
            finally:
                delete_all_pods(control_plane.core, ns)
            kwok.check_alive()
        yield out
    finally:
        control_plane.restart_scheduler()


def _capacity() -> int:
    return NODES * GPUS_PER_NODE


def test_pods_run_finish_and_their_gpus_are_reused(results: dict[str, ReplayResult]) -> None:
    for variant, r in results.items():
        # Every pod of this trace fits on an empty node, so with departures each one is placed.
        assert r.placed == PODS, f"{variant}: {r.failed} pods never placed"
        # The replay ends once the last pod is bound; many have finished through kwok by then.
        assert r.completed >= PODS // 5, f"{variant}: only {r.completed} pods finished through kwok"
        # More GPUs were placed over the replay than the cluster has: capacity freed by finished
        # pods was used again, on nodes that ran several GPU pods one after another.
        assert r.gpus_placed > _capacity(), f"{variant}: {r.gpus_placed} GPUs placed"
        assert r.max_nodes_reused > 0
        peak = max(s.gpus_allocated for s in r.samples)
        assert 0 < peak <= _capacity()


def test_the_sampler_counts_training_beside_interactive_serving() -> None:
    """The measurement above, on hand-made pod states: it can see a mixed node when there is one."""
    pods = {p.name: p for p in (
        ReplayPod(llm_pod("chat", stage="serving", model_params="1B", gpus=1)),
        ReplayPod(llm_pod("batch", stage="serving", model_params="1B", gpus=1,
                          annotations={"llm-placement.io/latency-class": "batch"})),
        ReplayPod(llm_pod("sft", stage="sft", model_params="1B", gpus=2)),
        ReplayPod(llm_pod("done", stage="pretraining", model_params="1B", gpus=2)),
    )}
    caps = {n: NodeCap(8, 96_000) for n in ("a", "b", "c")}
    states = {"chat": PodState("a", "Running"), "sft": PodState("a", "Running"),
              "batch": PodState("b", "Running"), "done": PodState("b", "Succeeded")}
    sample, over = _sample(4, 0.0, 0.0, caps, pods, states)
    assert over == [] and sample.mixed_nodes == 1  # a: chat + sft; b: batch serving may share
    # Where the stranded GPUs sit: a runs 3 of 8, b 1 ("done" has finished), c is whole.
    assert sample.stranded_by_node == {"a": 5, "b": 7} and sample.gpus_stranded == 12
    states["sft"] = PodState("c", "Running")
    moved = _sample(4, 0.0, 0.0, caps, pods, states)[0]
    assert moved.mixed_nodes == 0 and moved.stranded_by_node == {"a": 7, "b": 7, "c": 6}


def test_nothing_over_committed(results: dict[str, ReplayResult]) -> None:
    for variant, r in results.items():
        assert r.overcommits == [] and r.unknown_nodes == [], f"{variant}: {r.overcommits[:5]} {r.unknown_nodes[:5]}"


def test_ours_leaves_no_fewer_whole_nodes_than_the_default_profile(results: dict[str, ReplayResult]) -> None:
    # Compared over the samples taken while the trace was arriving (the same created-pod counts).
    ours = statistics.mean(s.whole_free_nodes for s in results["ours"].samples)
    default = statistics.mean(s.whole_free_nodes for s in results["default"].samples)
    assert ours >= default, f"whole free nodes, mean over the replay: ours {ours:.1f}, default {default:.1f}"
    stranded_ours = statistics.mean(s.gpus_stranded for s in results["ours"].samples)
    stranded_default = statistics.mean(s.gpus_stranded for s in results["default"].samples)
    assert stranded_ours <= stranded_default, (
        f"stranded GPUs, mean over the replay: ours {stranded_ours:.1f}, default {stranded_default:.1f}"
    )



# ----- the virtual clock: every variant on the same load ------------------------------------------
@pytest.fixture(scope="module")
def virtual_results(control_plane: ControlPlane, cluster: ClusterScope,
                    kwok: Kwok) -> Iterator[tuple[list[ReplayPod], dict[str, ReplayResult]]]:
    # Only this replay's nodes: pods bound elsewhere would escape its figures.
    cluster.remove_nodes(list(cluster.nodes))
    manifests = [
        gpu_node(cluster.node_name(f"v{i:02d}"), "H100", gpus=GPUS_PER_NODE, cpu="96",
                 labels=kwok_node_labels(), index=100 + i)
        for i in range(VIRTUAL_NODES)
    ]
    cluster.add_nodes(manifests)
    # Longer lives than the cluster holds at once, so some pods wait for others to finish.
    trace = synthetic_trace(VIRTUAL_PODS, seed=11, span_s=600.0, mean_duration_s=900.0,
                            max_duration_s=2400.0, make_pod=_pod)
    out: dict[str, ReplayResult] = {}
    try:
        for variant in ("ours", "mostalloc"):
            ns = f"{cluster.namespace}-v-{variant}"
            ensure_namespace(control_plane.core, ns)
            config = with_retry_backoff(variant_config(control_plane, variant), 1)
            restart_scheduler_with(control_plane, config, f"replay-virtual-{variant}")
            try:
                out[variant] = replay(control_plane, ns, manifests, trace, variant=variant, speed=1.0,
                                      clock="virtual", settle_s=1.0, timeout_s=300.0)
            finally:
                delete_all_pods(control_plane.core, ns)
            kwok.check_alive()
        yield trace, out
    finally:
        control_plane.restart_scheduler()


def test_virtual_clock_runs_every_pod_for_exactly_its_duration(
        virtual_results: tuple[list[ReplayPod], dict[str, ReplayResult]]) -> None:
    trace, results = virtual_results
    # GPU-seconds the trace asks for: each pod holds its GPUs from bind to bind + duration.
    demand = sum(pod_gpus(p.manifest) * (p.duration or 0.0) for p in trace)
    for variant, r in results.items():
        assert r.clock == "virtual" and r.time_weighted is not None
        assert r.placed == VIRTUAL_PODS and r.completed == VIRTUAL_PODS, f"{variant}: {r.completed} finished"
        assert r.overcommits == [] and r.unknown_nodes == [], variant
        tw = r.time_weighted
        # The trace clock only moved between events, and every pod ran exactly its duration on it,
        # however long kube-scheduler, the extender or kwok took in wall time: the integral of
        # allocated GPUs over trace time is the trace's demand, the same load for every variant.
        assert tw["gpus_allocated"] * tw["span_s"] == pytest.approx(demand, rel=1e-6), variant
        # The cluster could not hold it all at once (checked below): some pods waited on the trace
        # clock for others to finish, and none was bound before it arrived.
        assert all(r.bound_at[p.name] >= p.arrive for p in trace)
        assert any(r.bound_at[p.name] > p.arrive for p in trace), f"{variant}: no pod waited"
        assert r.max_nodes_reused > 0
    # Precondition of the waiting check: with no waiting, the GPUs in use at some arrival would
    # exceed the cluster's.
    peak = max(sum(pod_gpus(q.manifest) for q in trace if q.arrive <= p.arrive < q.arrive + (q.duration or 0.0))
               for p in trace)
    assert peak > VIRTUAL_NODES * GPUS_PER_NODE


def test_time_weighted_figures_weigh_each_state_by_how_long_it_lasted() -> None:
    def state(alloc: int, stranded: dict[str, int], free: int, whole8: int) -> Any:
        return type("S", (), {"gpus_allocated": alloc, "gpus_stranded": sum(stranded.values()), "gpus_free": free,
                              "whole_free_8gpu_nodes": whole8, "stranded_by_node": stranded})()

    tw = _TimeWeighted({"a": (8, "H100"), "b": (8, "H100")})
    tw.add(state(8, {}, 8, 1), 3600.0)  # an hour with one node full, one whole
    tw.add(state(1, {"b": 7}, 15, 1), 10800.0)  # three hours with one GPU used: 7 stranded
    f = tw.figures()
    assert f["span_s"] == 14400.0
    assert f["gpus_allocated"] == pytest.approx((8 * 1 + 1 * 3) / 4)
    assert f["gpus_stranded"] == pytest.approx(7 * 3 / 4)
    assert f["stranded_share"] == pytest.approx(7 * 3 / (8 * 1 + 15 * 3))
    assert f["stranded_gpu_hours"] == pytest.approx(21.0)
    assert f["stranded_gpu_hours_by_node"] == {"b": pytest.approx(21.0)}
    # One GPU used on one node is as packed as it gets: nothing stranded beyond perfect packing.
    assert f["stranded_beyond_packing_gpu_hours"] == pytest.approx(0.0)


def test_a_clock_the_driver_does_not_know_is_refused(control_plane: ControlPlane) -> None:
    with pytest.raises(ValueError, match="clock must be one of"):
        replay(control_plane, "unused", [], [], variant="ours", speed=1.0, clock="sundial")


def test_retry_backoff_is_set_for_a_variant_without_touching_the_rest(control_plane: ControlPlane) -> None:
    base = variant_config(control_plane, "mostalloc")
    paced = with_retry_backoff(base, 1)
    assert paced["podInitialBackoffSeconds"] == 1 and paced["podMaxBackoffSeconds"] == 1
    assert "podMaxBackoffSeconds" not in base and paced["profiles"] == base["profiles"]


# ----- gangs run together: members start when the last binds, partial gangs hold their GPUs --------
GANG_NODES = 2
GANG_GPUS = 4


def _gang_trace() -> list[ReplayPod]:
    """Two gangs of three 2-GPU members, created interleaved, on 8 GPUs: one gang fits at a time."""
    out = []
    for i in range(3):
        for gang, duration in (("ga", 100.0), ("gb", 150.0)):
            pod = llm_pod(f"{gang}-{i}", stage="pretraining", model_params="1B", gpus=2, cpu="2",
                          memory="8Gi", annotations={"llm-placement.io/gang-name": gang,
                                                     "llm-placement.io/gang-size": "3"})
            out.append(ReplayPod(pod, arrive=0.0, duration=duration + 10.0 * i))
    return out


@pytest.fixture(scope="module")
def gang_results(control_plane: ControlPlane, cluster: ClusterScope,
                 kwok: Kwok) -> Iterator[dict[str, ReplayResult]]:
    try:
        kueue_binary = build_kueue()
    except KueueBuildError as exc:
        pytest.fail(f"Kueue unavailable: {exc}", pytrace=False)
    cluster.remove_nodes(list(cluster.nodes))
    # RDMA-capable: a gang that spans nodes needs it (docs/gangs.md).
    manifests = [gpu_node(cluster.node_name(f"g{i}"), "H100", gpus=GANG_GPUS, cpu="96", rdma=True,
                          labels=kwok_node_labels(), index=200 + i) for i in range(GANG_NODES)]
    cluster.add_nodes(manifests)
    out: dict[str, ReplayResult] = {}
    try:
        for variant in ("ours", "mostalloc", "kueue"):
            ns = f"{cluster.namespace}-g-{variant}"
            ensure_namespace(control_plane.core, ns)
            config = with_retry_backoff(variant_config(control_plane, variant), 1)
            restart_scheduler_with(control_plane, config, f"replay-gang-{variant}")
            trace, queue = _gang_trace(), None
            if variant == "kueue":
                trace = [replace(p, manifest=queued(p.manifest, pod_gang(p.manifest))) for p in trace]
                queue = Kueue(kueue_binary, control_plane, control_plane.workdir, ns)
                queue.start(cluster_quota(manifests, [p.manifest for p in trace]))
            try:
                # A gang is planned once all its members are pending: a few retries of its members
                # before it binds, so the replay must not end on the first quiet second.
                out[variant] = replay(control_plane, ns, manifests, trace, variant=variant, speed=1.0,
                                      clock="virtual", settle_s=15.0, retry_settle_s=5.0, timeout_s=300.0,
                                      admission_idle=queue.idle if queue else None)
            finally:
                if queue is not None:
                    queue.stop()
                delete_all_pods(control_plane.core, ns)
            kwok.check_alive()
        yield out
    finally:
        control_plane.restart_scheduler()


def test_gang_members_start_and_end_together_and_partial_gangs_deadlock(
        gang_results: dict[str, ReplayResult]) -> None:
    ours, packed = gang_results["ours"], gang_results["mostalloc"]
    # Ours binds a gang only whole: both run, one after the other, each member for its gang's
    # slowest member's time (lockstep), and nothing sat bound waiting for the rest.
    assert ours.gangs == 2 and ours.gangs_started == 2 and ours.gang_deadlocks == 0
    assert ours.completed == 6 and ours.overcommits == []
    for gang, slowest in (("ga", 120.0), ("gb", 170.0)):
        members = [f"{gang}-{i}" for i in range(3)]
        assert {ours.started_at[m] for m in members} == {ours.started_at[members[0]]}, gang
        assert all(ours.ran_s[m] == slowest for m in members), gang
    assert ours.idle_held_gpu_s == 0.0
    # MostAllocated binds members one by one as they come: two of each gang fill the 8 GPUs and the
    # third of each can never bind. No gang ever runs; four members hold their GPUs for nothing.
    assert packed.gangs == 2 and packed.gangs_started == 0 and packed.gang_deadlocks == 2
    assert packed.completed == 0 and packed.placed == 4


def test_kueue_admits_each_gang_whole_in_front_of_mostallocated(gang_results: dict[str, ReplayResult]) -> None:
    # The all-or-nothing baseline: the same MostAllocated kube-scheduler that deadlocked above, behind
    # real Kueue. Kueue holds the second gang at its admission gate until the first has ended and
    # its quota is back, so both run whole, one after the other, and none of their GPUs sat idle.
    queued_ = gang_results["kueue"]
    assert queued_.gangs == 2 and queued_.gangs_started == 2 and queued_.gang_deadlocks == 0
    assert queued_.completed == 6 and queued_.overcommits == [] and queued_.idle_held_gpu_s == 0.0
    starts = {g: {queued_.started_at[f"{g}-{i}"] for i in range(3)} for g in ("ga", "gb")}
    assert all(len(s) == 1 for s in starts.values()), starts
    first, second = sorted(starts, key=lambda g: min(starts[g]))
    # The second gang starts only when the first has ended: it was never admitted beside it.
    first_end = min(starts[first]) + max(queued_.ran_s[f"{first}-{i}"] for i in range(3))
    assert min(starts[second]) >= first_end


# ----- the virtual clock waits for Kueue: a group admissible between two trace events starts then --
def _admission_trace(tas: bool) -> list[ReplayPod]:
    """Gang ga (2 x 4 GPUs, 100 s) fills the 8 GPUs at 0; gang gb (the same) waits for it; gang gc
    arrives at 1,000 s, the next trace event after ga's end. gb becomes admissible at 100 s."""
    out = []
    for gang, arrive in (("ga", 0.0), ("gb", 0.0), ("gc", 1000.0)):
        for i in range(2):
            pod = llm_pod(f"{gang}-{i}", stage="pretraining", model_params="1B", gpus=4, cpu="2",
                          memory="8Gi", annotations={"llm-placement.io/gang-name": gang,
                                                     "llm-placement.io/gang-size": "2"})
            out.append(ReplayPod(queued(pod, pod_gang(pod), tas=tas), arrive=arrive, duration=100.0))
    return out


@pytest.fixture(scope="module")
def admission_results(control_plane: ControlPlane, cluster: ClusterScope,
                      kwok: Kwok) -> Iterator[dict[str, tuple[ReplayResult, int]]]:
    try:
        kueue_binary = build_kueue()
    except KueueBuildError as exc:
        pytest.fail(f"Kueue unavailable: {exc}", pytrace=False)
    cluster.remove_nodes(list(cluster.nodes))
    manifests = [gpu_node(cluster.node_name(f"k{i}"), "H100", gpus=GANG_GPUS, cpu="96", rdma=True,
                          labels=kwok_node_labels(), index=300 + i) for i in range(GANG_NODES)]
    cluster.add_nodes(manifests)
    out: dict[str, tuple[ReplayResult, int]] = {}
    try:
        for variant in ("kueue", "kueue-tas"):
            tas = variant == "kueue-tas"
            ns = f"{cluster.namespace}-a-{variant}"
            ensure_namespace(control_plane.core, ns)
            restart_scheduler_with(control_plane, with_retry_backoff(variant_config(control_plane, "kueue"), 1),
                                   f"replay-admission-{variant}")
            trace = _admission_trace(tas)
            queue = Kueue(kueue_binary, control_plane, control_plane.workdir, ns, tas=tas,
                          node_labels=kwok_node_labels())
            queue.start(cluster_quota(manifests, [p.manifest for p in trace]))
            try:
                r = replay(control_plane, ns, manifests, trace, variant=variant, speed=1.0, clock="virtual",
                           settle_s=15.0, retry_settle_s=5.0, timeout_s=300.0, admission_idle=queue.idle)
                out[variant] = (r, queue.waited_for_admissible)
            finally:
                queue.stop()
                delete_all_pods(control_plane.core, ns)
            kwok.check_alive()
        yield out
    finally:
        control_plane.restart_scheduler()


@pytest.mark.parametrize("variant", ["kueue", "kueue-tas"])
def test_a_group_admissible_between_two_trace_events_starts_when_it_became_admissible(
        admission_results: dict[str, tuple[ReplayResult, int]], variant: str) -> None:
    r, waited = admission_results[variant]
    assert r.gangs_started == 3 and r.completed == 6 and r.overcommits == []
    start = {g: {r.started_at[f"{g}-{i}"] for i in range(2)} for g in ("ga", "gb", "gc")}
    assert start["ga"] == {0.0}
    # gb fits the moment ga ends (100 s); the clock must not move on to gc's arrival (1,000 s)
    # before Kueue has admitted it.
    assert start["gb"] == {100.0}, (start, r.admission_settle_timeouts, waited)
    assert start["gc"] == {1000.0}
    assert r.admission_settle_timeouts == 0
