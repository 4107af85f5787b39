"""Filter reuses the watch's parse of a pod only for the same version, with the DRA objects unchanged;
serving estimates are remembered by what they are computed from."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import pod_object
from app.base.workload import PREFIX, Precision, parse_workload
from app.cluster.cache import apply_pod
from app.config.settings import Settings
from app.dra.index import DraIndex
from app.placement.placer import Placer
from app.serving.model import Case, Shape, estimate, serving_estimate
from app.snapshot.store import ClusterSnapshot
from tests.unit.dra import dra_fixtures as fx

SEVEN_B = {PREFIX + "model-params": "7B", PREFIX + "precision": "int8"}


def _watched(settings: Settings, version: str = "5") -> tuple[ClusterSnapshot, Placer, dict[str, Any]]:
    snap = ClusterSnapshot()
    pod = pod_object("p", gpus=1, uid="u-p", stage="serving", annotations=dict(SEVEN_B))
    pod["metadata"]["resourceVersion"] = version
    apply_pod(snap, settings, copy.deepcopy(pod))
    return snap, Placer(settings.policies().placement, snap), pod


def test_the_same_version_is_not_parsed_again(settings: Settings) -> None:
    snap, placer, pod = _watched(settings)
    assert placer.parse(pod) is snap.specs["u-p"]


def test_another_version_is_parsed_from_the_request(settings: Settings) -> None:
    snap, placer, pod = _watched(settings)
    pod["metadata"]["resourceVersion"] = "6"
    pod["metadata"]["annotations"][PREFIX + "model-params"] = "13B"
    got = placer.parse(pod)
    assert got is not snap.specs["u-p"] and got.model_params == 13e9


def test_a_request_without_a_version_is_parsed(settings: Settings) -> None:
    snap, placer, pod = _watched(settings)
    del pod["metadata"]["resourceVersion"]
    assert placer.parse(pod) is not snap.specs["u-p"]


def test_a_pod_the_watch_saw_bound_is_not_reused_for_pending(settings: Settings) -> None:
    snap, placer, pod = _watched(settings)
    bound = copy.deepcopy(pod)
    bound["metadata"]["resourceVersion"] = "7"
    bound["spec"]["nodeName"] = "n"
    apply_pod(snap, settings, bound)  # a bound pod that is not a gang member keeps no spec
    assert "u-p" not in snap.spec_source and placer.parse(pod) is not None


DRA_CHANGES: dict[str, Callable[[DraIndex], object]] = {
    "claim": lambda d: d.put_claim(fx.claim("c1")),
    "claim gone": lambda d: d.drop_claim("default/c1"),
    "class": lambda d: d.put_class({"metadata": {"name": "gpu.example.com"}, "spec": {}}),
    "class gone": lambda d: d.drop_class("gpu.example.com"),
    "template": lambda d: d.put_template({"metadata": {"name": "t", "namespace": "default"}, "spec": {}}),
    "template gone": lambda d: d.drop_template("default/t"),
    "slice": lambda d: d.put_slice(fx.slice_("n", [fx.gpu(0)])),
    "claims read": lambda d: setattr(d, "reads_claims", True),
}


@pytest.mark.parametrize("change", sorted(DRA_CHANGES))
def test_a_dra_change_since_the_watch_parsed_means_parsing_again(settings: Settings, change: str) -> None:
    snap, placer, pod = _watched(settings)
    DRA_CHANGES[change](snap.dra)
    assert placer.parse(pod) is not snap.specs["u-p"]


# --- serving estimates ----------------------------------------------------------------------------
@pytest.mark.parametrize(("params", "precision", "gpus", "product", "clients"), [
    ("7B", Precision.INT8, 1, "NVIDIA-L4", None),
    ("7B", Precision.INT8, 1, "NVIDIA-L4", 3),
    ("70B", Precision.BF16, 4, "NVIDIA-H100-80GB-HBM3", None),
    ("70B", Precision.FP8, 2, "NVIDIA-H100-80GB-HBM3", 16),
    ("13B", Precision.BF16, 1, "Tesla-T4", 1),
])
def test_a_remembered_estimate_is_the_one_computed(settings: Settings, catalog: GpuCatalog, params: str,
                                                   precision: Precision, gpus: int, product: str,
                                                   clients: int | None) -> None:
    policy = settings.policies().placement.feasibility
    spec = parse_workload(pod_object("e", gpus=gpus, stage="serving",
                                     annotations={PREFIX + "model-params": params}))
    gpu = catalog.lookup(product)
    assert gpu is not None
    first = serving_estimate(spec, precision, gpu, 0.0, policy, clients)
    again = serving_estimate(spec, precision, gpu, 0.0, policy, clients)
    fresh = estimate(Case(Shape.of(spec.model_params or 0.0, spec.active_params, None), precision, gpu,
                          gpus, clients or spec.concurrency or policy.default_concurrency,
                          *_lengths(spec, policy)), policy.serving)
    assert again is first and first == fresh
    # Another calibration (a settings reload) is not answered from the first one's estimates.
    other = policy.serving.model_copy(update={"step_floor_ms": policy.serving.step_floor_ms + 5})
    moved = serving_estimate(spec, precision, gpu, 0.0, _Defaults(policy, other), clients)
    assert moved.ms_per_token > first.ms_per_token


def test_a_remembered_estimate_is_the_named_engines(settings: Settings, catalog: GpuCatalog) -> None:
    """The engine changes the first token (its own fixed cost and prefill budget): the same pod
    naming another engine, or none, is not answered from the first one's estimate."""
    policy = settings.policies().placement.feasibility
    gpu = catalog.lookup("NVIDIA-H100-80GB-HBM3")
    assert gpu is not None
    ttft = {}
    for engine in (None, "tgi", "trtllm"):
        ann = {PREFIX + "model-params": "8B", PREFIX + "concurrency": "16"}
        if engine:
            ann[PREFIX + "serving-engine"] = engine
        spec = parse_workload(pod_object("e", gpus=1, stage="serving", annotations=ann))
        got = serving_estimate(spec, Precision.BF16, gpu, 0.0, policy)
        fresh = estimate(Case(Shape.of(spec.model_params or 0.0, None, None), Precision.BF16, gpu, 1, 16,
                              *_lengths(spec, policy), engine=engine), policy.serving)
        assert got == fresh
        ttft[engine] = got.ttft_ms
    assert len(set(ttft.values())) == 3


def _lengths(spec: Any, policy: Any) -> tuple[int, int]:
    from app.serving.model import serving_lengths

    return serving_lengths(spec, policy)


class _Defaults:
    def __init__(self, policy: Any, serving: Any) -> None:
        self.default_context_tokens = policy.default_context_tokens
        self.default_concurrency = policy.default_concurrency
        self.serving = serving
