"""Annotation parsing: every value in docs/annotations.md, aliases, and specific errors for bad input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.base.objects import pod_object
from app.base.units import parse_bandwidth_tbs, parse_param_count, parse_quantity
from app.base.workload import LatencyClass, Precision, Stage, WorkloadError, parse_workload
from app.serving.sizing import decode_ms_per_token, kv_bytes_per_token, size, weights_gb


def pod(**ann: str) -> dict:
    return pod_object("p", namespace="ml", gpus=2, annotations={f"llm-placement.io/{k}": v for k, v in ann.items()})


@pytest.mark.parametrize(("raw", "stage"), [
    ("data-prep", Stage.DATA_PREP), ("pretrain", Stage.PRETRAINING), ("SFT", Stage.ALIGNMENT),
    ("rlhf", Stage.ALIGNMENT), ("dpo", Stage.ALIGNMENT), ("finetune", Stage.ALIGNMENT),
    ("quantize", Stage.DEPLOYMENT), ("package", Stage.DEPLOYMENT), ("inference", Stage.SERVING),
    ("serve", Stage.SERVING), ("eval", Stage.SERVING),
])
def test_stage_aliases(raw: str, stage: Stage) -> None:
    assert parse_workload(pod(stage=raw)).stage is stage


def test_full_spec() -> None:
    spec = parse_workload(pod(**{
        "stage": "serving", "model-params": "1.8T", "precision": "fp8", "precision-fallback": "int8, int4",
        "context-tokens": "8192", "concurrency": "16", "kv-cache-gb": "40", "latency-class": "batch",
        "max-ms-per-token": "25.5", "gpu-preference": "NVIDIA-H200,NVIDIA-H100-80GB-HBM3",
        "topology-required-placement": "nvidia.com/gpu.clique", "depends-on": "prep, other/ns-pod",
        "input-data-gb": "20",
    }))
    assert spec.model_params == 1.8e12 and spec.precision is Precision.FP8
    assert spec.precisions == (Precision.FP8, Precision.INT8, Precision.INT4)
    assert spec.context_tokens == 8192 and spec.concurrency == 16 and spec.kv_cache_gb == 40
    assert spec.latency_class is LatencyClass.BATCH and spec.max_ms_per_token == 25.5
    assert spec.gpu_preference == ("NVIDIA-H200", "NVIDIA-H100-80GB-HBM3")
    assert spec.depends_on == ("prep", "other/ns-pod") and spec.input_data_gb == 20
    assert spec.gpus == 2


def test_serving_defaults_to_interactive() -> None:
    assert parse_workload(pod(stage="serving")).effective_latency_class is LatencyClass.INTERACTIVE
    assert parse_workload(pod(stage="pretraining")).effective_latency_class is None


@pytest.mark.parametrize(("ann", "message"), [
    ({"model-params": "70Q"}, 'model-params "70Q" is not a parameter count like 7B or 1.5T'),
    ({"stage": "training"}, 'stage "training" is not one of'),
    ({"precision": "fp4"}, 'precision "fp4" is not one of'),
    ({"max-ms-per-token": "-5"}, 'max-ms-per-token "-5" must be greater than zero'),
    ({"max-ms-per-token": "nan"}, 'max-ms-per-token "nan" is not a number like 50 or 2.5'),
    ({"concurrency": "0"}, 'concurrency "0" must be greater than zero'),
    ({"context-tokens": "4k"}, 'context-tokens "4k" is not a whole number'),
    ({"latency-class": "realtime"}, 'latency-class "realtime" is not interactive or batch'),
    ({"gang-name": "g"}, "gang-name is set but gang-size is missing"),
])
def test_bad_values_give_specific_messages(ann: dict[str, str], message: str) -> None:
    with pytest.raises(WorkloadError) as exc:
        parse_workload(pod(**ann))
    assert any(message in p for p in exc.value.problems)


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(WorkloadError) as exc:
        parse_workload(pod(**{"model-params": "x", "precision": "y", "stage": "z"}))
    assert len(exc.value.problems) == 3


def test_bad_resource_quantity_is_a_problem_not_a_crash() -> None:
    p = pod_object("p", gpus=1)
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    with pytest.raises(WorkloadError, match="not a Kubernetes quantity"):
        parse_workload(p)


@pytest.mark.parametrize(("labels", "ann", "source", "size"), [
    ({"scheduling.x-k8s.io/pod-group": "g"}, {"llm-placement.io/gang-size": "8"}, "scheduling.x-k8s.io/pod-group", 8),
    ({}, {"scheduling.k8s.io/group-name": "g", "llm-placement.io/gang-size": "4"}, "scheduling.k8s.io/group-name", 4),
    ({"kueue.x-k8s.io/pod-group-name": "g"}, {"kueue.x-k8s.io/pod-group-total-count": "3"},
     "kueue.x-k8s.io/pod-group-name", 3),
    ({"leaderworkerset.sigs.k8s.io/group-key": "g"}, {"leaderworkerset.sigs.k8s.io/size": "2"},
     "leaderworkerset.sigs.k8s.io/group-key", 2),
    ({}, {"llm-placement.io/gang-name": "g", "llm-placement.io/gang-size": "5"}, "llm-placement.io/gang-name", 5),
])
def test_gang_identity_conventions(labels: dict, ann: dict, source: str, size: int) -> None:
    p = pod_object("m", namespace="ml", gpus=8, annotations=ann, labels=labels)
    gang = parse_workload(p).gang
    assert gang is not None and gang.key == "ml/g" and gang.source == source and gang.size == size


def test_native_key_wins_over_ours() -> None:
    p = pod_object("m", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "native"},
                   annotations={"llm-placement.io/gang-name": "ours", "llm-placement.io/gang-size": "2"})
    gang = parse_workload(p).gang
    assert gang is not None and gang.name == "native"


def test_init_container_resources_take_the_max() -> None:
    p = pod_object("p", gpus=1)
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]
    assert parse_workload(p).gpus == 4


def test_sizing_rules_of_thumb() -> None:
    assert weights_gb(70e9, Precision.BF16) == pytest.approx(140)
    assert weights_gb(7e9, Precision.INT4) == pytest.approx(3.5)
    # Llama-2-7B has 32 layers x 4096 hidden: KV per token ~0.5 MB at MHA; GQA/4 -> ~0.13 MB.
    assert 0.1e6 < kv_bytes_per_token(7e9) < 0.2e6
    spec = parse_workload(pod(**{"stage": "pretraining", "model-params": "70B", "gang-name": "g", "gang-size": "8"}))
    s = size(spec, Precision.BF16, default_context=4096, default_concurrency=8)
    # 70B x 16 bytes over 16 GPUs = 70 GB, +20% activations + 1 GB runtime.
    assert s.per_gpu_gb == pytest.approx(70 * 1.2 + 1)
    ms = decode_ms_per_token(size(parse_workload(pod(stage="serving", **{"model-params": "70B", "kv-cache-gb": "0"})),
                                  Precision.BF16, default_context=1, default_concurrency=1), 4, 3.35, 1.0)
    assert ms == pytest.approx(140 / (4 * 3.35))


@given(st.text(max_size=30))
def test_param_parser_never_raises_anything_but_valueerror(text: str) -> None:
    try:
        v = parse_param_count(text)
    except ValueError as exc:
        assert "model-params" in str(exc)
    else:
        assert v > 0


@given(st.floats(min_value=0.001, max_value=9999, allow_nan=False), st.sampled_from(["K", "M", "B", "T", "b"]))
def test_param_parser_roundtrip(value: float, suffix: str) -> None:
    text = f"{value:.3f}{suffix}"
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[suffix.lower()]
    assert parse_param_count(text) == pytest.approx(float(f"{value:.3f}") * scale)


@given(st.dictionaries(st.sampled_from([
    "stage", "model-params", "precision", "precision-fallback", "context-tokens", "concurrency", "kv-cache-gb",
    "latency-class", "max-ms-per-token", "gang-name", "gang-size", "depends-on", "input-data-gb", "colocation",
]), st.text(max_size=12)))
def test_parse_workload_only_raises_workload_error(ann: dict[str, str]) -> None:
    try:
        parse_workload(pod(**ann))
    except WorkloadError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)


def test_quantities_and_bandwidth() -> None:
    assert parse_quantity("500m") == 0.5 and parse_quantity("64Gi") == 64 * 2**30 and parse_quantity(8) == 8
    assert parse_bandwidth_tbs("4.1TB/s") == 4.1 and parse_bandwidth_tbs("900GB/s") == 0.9
    with pytest.raises(ValueError):
        parse_quantity("12 parsecs")


def test_node_selector_is_read_sorted_and_makes_members_distinct_shapes() -> None:
    # Kueue's topology-aware scheduling pins each gang member to its own node: the plan must see
    # each member's selector, and members pinned apart are no longer interchangeable.
    from app.gang.instance import shape_key

    a, b = pod(stage="pretraining"), pod(stage="pretraining")
    a["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "n1", "a/zone": "z", "bad": 3}
    b["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "n2"}
    sa, sb = parse_workload(a), parse_workload(b)
    assert sa.node_selector == (("a/zone", "z"), ("kubernetes.io/hostname", "n1"))
    assert sb.node_selector == (("kubernetes.io/hostname", "n2"),)
    assert parse_workload(pod(stage="pretraining")).node_selector == ()
    assert shape_key(sa) != shape_key(sb)
    b["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "n1", "a/zone": "z"}
    assert shape_key(sa) == shape_key(parse_workload(b))


@pytest.mark.parametrize(("ann", "refused"), [
    ({"prompt-tokens": "8192", "context-tokens": "4096"}, True),
    ({"prompt-tokens": "4097", "context-tokens": "4096"}, True),
    ({"prompt-tokens": "4096", "context-tokens": "4096"}, False),  # a prompt may fill the context
    ({"prompt-tokens": "1024", "context-tokens": "4096"}, False),
    ({"prompt-tokens": "100000"}, False),  # no context given: documented, not refused
])
def test_prompt_longer_than_the_context_is_refused(ann: dict[str, str], refused: bool) -> None:
    p = pod(**{"stage": "serving", "model-params": "7B", **ann})
    if not refused:
        assert parse_workload(p).prompt_tokens == int(ann["prompt-tokens"])
        return
    with pytest.raises(WorkloadError) as exc:
        parse_workload(p)
    assert any(f"prompt-tokens {ann['prompt-tokens']} is larger than context-tokens 4096" in str(problem)
               for problem in exc.value.problems), exc.value.problems


def test_prompt_longer_than_the_context_reaches_the_filter_answer() -> None:
    # The reason kube-scheduler quotes in the pod's FailedScheduling event.
    import orjson

    from app.base.catalog import GpuCatalog
    from app.base.objects import node_object
    from app.config.settings import Settings
    from app.extender.service import ExtenderService

    svc = ExtenderService(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    node = node_object("n", gpus=8, product="NVIDIA-H100-80GB-HBM3")
    p = pod(**{"stage": "serving", "model-params": "7B", "prompt-tokens": "9000", "context-tokens": "2048"})
    out = orjson.loads(svc.filter(orjson.dumps({"Pod": p, "Nodes": {"items": [node]}, "NodeNames": None})))
    reasons = {**out["FailedNodes"], **out["FailedAndUnresolvableNodes"]}
    assert "prompt-tokens 9000 is larger than context-tokens 2048" in reasons["n"]
