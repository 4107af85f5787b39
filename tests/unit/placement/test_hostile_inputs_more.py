"""Hostile and broken inputs: names that would forge event lines, requests no node could ever meet,
numbers in another script or with separators, and profiles files that contradict themselves."""

from __future__ import annotations

from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.reasons import Rejection
from app.base.workload import WorkloadError, parse_workload
from app.config.settings import Settings
from app.placement.feasibility import evaluate
from app.serving.profiles import ProfileBook, ProfileError
from app.snapshot.nodes import facts_for
from app.snapshot.store import NodeUsage

ANN = "llm-placement.io/"
CATALOG = GpuCatalog.load()


def problems_of(**ann: str) -> list[str]:
    pod = pod_object("p", stage="serving", gpus=1, annotations={ANN + k: v for k, v in ann.items()})
    with pytest.raises(WorkloadError) as err:
        parse_workload(pod)
    return list(err.value.problems)


@pytest.mark.parametrize("key, value", [
    ("max-ttft-ms", "1_000"), ("max-ms-per-token", "5_0"), ("model-params", "\uff170B"),
    ("max-ttft-ms", "\uff11\uff10\uff10"), ("context-tokens", "1_000"),
])
def test_one_number_grammar_for_every_annotation(key: str, value: str) -> None:
    got = problems_of(**{key: value, **({} if key == "model-params" else {"model-params": "7B"})})
    assert any(key in p for p in got), got


def test_more_gpus_than_the_node_has_is_unresolvable_fewer_free_is_not() -> None:
    settings = Settings(cluster_source="none", metrics_port=0)
    policy = settings.policies()
    node = facts_for(node_object("h", gpus=8, product="NVIDIA-H100-80GB-HBM3"), CATALOG, policy.node_facts)
    feas = policy.placement.feasibility
    big = parse_workload(pod_object("big", gpus=16))
    never = evaluate(big, node, NodeUsage(), 8, feas)
    assert isinstance(never, Rejection) and never.unresolvable, never
    busy = evaluate(parse_workload(pod_object("p", gpus=4)), node, NodeUsage(), 2, feas)
    assert isinstance(busy, Rejection) and not busy.unresolvable, busy


def entry(**kw: Any) -> dict[str, Any]:
    return {"model": "chat", "model_params": "7B", "gpu": "L4", "precision": "int8", "ms_per_token": 30.0,
            **kw}


def test_profiles_with_an_unknown_gpu_are_refused_naming_the_entry() -> None:
    with pytest.raises(ProfileError, match=r"entry #2 \(chat\): gpu 'Z9000' is not in the GPU catalog"):
        ProfileBook.from_data({"profiles": [entry(), entry(gpu="Z9000")]})


def test_contradicting_duplicates_are_refused_identical_ones_kept_once() -> None:
    with pytest.raises(ProfileError, match=r"entry #2 \(chat\): same GPU .* with other figures"):
        ProfileBook.from_data({"profiles": [entry(), entry(gpu="NVIDIA-L4", ms_per_token=45.0)]})
    book = ProfileBook.from_data({"profiles": [entry(), entry(gpu="nvidia-l4")]})
    spec = parse_workload(pod_object("p", stage="serving", gpus=1,
                                     annotations={ANN + "model-params": "7B", ANN + "precision": "int8"}))
    l4 = CATALOG.lookup("L4")
    assert l4 is not None
    got = book.match(spec, l4, spec.precision)
    assert got is not None and got.ms_per_token == 30.0


def test_a_large_profiles_file_is_indexed() -> None:
    # 20,000 entries (400 model sizes 3 % apart, on 1-50 GPUs): a lookup goes straight to its GPU,
    # count and precision, whatever the file's size.
    sizes = [round(1e9 * 1.03**i) for i in range(400)]
    rows = [entry(model=f"m{i}-{g}", model_params=size, gpus=g)
            for i, size in enumerate(sizes) for g in range(1, 51)]
    book = ProfileBook.from_data({"profiles": rows})
    l4 = CATALOG.lookup("L4")
    assert l4 is not None
    spec = parse_workload(pod_object("p", stage="serving", gpus=7, annotations={
        ANN + "model-params": f"{sizes[321] / 1e9:.6f}B", ANN + "precision": "int8"}))
    got = book.match(spec, l4, spec.precision)
    assert got is not None and got.model == "m321-7"
