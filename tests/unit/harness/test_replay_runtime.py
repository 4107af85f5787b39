"""Run times of replayed pods and the judge of serving, from measurements (kubeharness/runtime.py)."""

from __future__ import annotations

import pytest
import yaml

from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.calibration.corpus import Measurement, load_file
from kubeharness.runtime import (
    Inputs,
    Judged,
    PodRuntime,
    ServingJudge,
    ServingSpeed,
    TrainingSpeed,
    node_gpus,
)

SEVEN_B = "6.658859008B"  # the measured MPT-7B's parameter count (the rows' NumParams)


def train(params: str | None = SEVEN_B, stage: str = "pretraining") -> dict[str, object]:
    ann = {"llm-placement.io/model-params": params} if params else {}
    return pod_object("t", stage=stage, gpus=8, annotations=ann)


def test_a_training_pod_runs_longer_on_a_slower_gpu_by_the_measured_ratio() -> None:
    speed = TrainingSpeed.load()
    # 7B at 2048 tokens on 8 GPUs: 10,643 tokens/s/GPU on H100 80GB, 4,641 on A100 80GB (the rows).
    assert speed.seconds(train(), 1000.0, "H100-SXM-80GB") == pytest.approx(1000.0)
    assert speed.seconds(train(), 1000.0, "A100-SXM4-80GB") == pytest.approx(1000.0 * 10643 / 4641)
    # Between measured sizes: log-log interpolation, between the two neighbours' ratios.
    mid = speed.seconds(train("10B"), 1000.0, "A100-SXM4-80GB")
    assert 1000.0 * 10643 / 4641 < mid < 1000.0 * 4792 / 2262 or \
        1000.0 * 4792 / 2262 < mid < 1000.0 * 10643 / 4641


def test_serving_and_gpu_less_pods_keep_their_trace_duration() -> None:
    speed = TrainingSpeed.load()
    serve = pod_object("s", stage="serving", gpus=1, annotations={"llm-placement.io/model-params": "7B"})
    assert speed.seconds(serve, 500.0, "A100-SXM4-80GB") == 500.0
    assert speed.seconds(train(), 500.0, None) == 500.0


def test_an_unmeasured_gpu_is_scaled_by_its_datasheet_peak_and_reported() -> None:
    speed = TrainingSpeed.load()
    t = speed.seconds(train(), 1000.0, "L40S")
    assert t > 1000.0 and "L40S" in speed.scaled


def test_node_gpus_reads_the_product_label() -> None:
    nodes = [node_object("a", gpus=8, product="NVIDIA-A100-SXM4-80GB"), node_object("c")]
    assert node_gpus(nodes) == {"a": "A100-SXM4-80GB", "c": None}


# ----- serving -----------------------------------------------------------------------------------

def serve(params: str = "7B", precision: str = "int8", latency: str = "batch", gpus: int = 1) -> dict[str, object]:
    return pod_object("s", stage="serving", gpus=gpus, annotations={
        "llm-placement.io/model-params": params, "llm-placement.io/precision": precision,
        "llm-placement.io/latency-class": latency})


def measurement(gpu: str, tpot: float, concurrency: int = 8, params: str = "7B", source: str = "s1",
                precision: str = "int8") -> Measurement:
    text = yaml.safe_dump({"source": {"id": source, "title": "t", "url": "https://example.org/t",
                                      "publisher": "p", "kind": "paper"},
                           "points": [{"locator": "row", "engine": "vllm", "engine_version": "0.6.0",
                                       "model": "llama-2-7b", "model_params": params, "precision": precision,
                                       "gpu": gpu, "gpus": 1, "tp": 1, "pp": 1, "concurrency": concurrency,
                                       "load": "closed-loop", "input_tokens": 128, "output_tokens": 128,
                                       "tpot_ms": tpot, "tpot_stat": "mean"}]})
    return load_file(f"{source}-{gpu}-{concurrency}.yaml", text=text)[0]


def test_batch_serving_runs_longer_by_the_measured_per_token_ratio_of_paired_points() -> None:
    rows = [measurement("H100-SXM-80GB", 10.0), measurement("A100-SXM4-80GB", 16.0),
            measurement("H100-SXM-80GB", 20.0, source="s2"), measurement("A100-SXM4-80GB", 36.0, source="s2"),
            # unpaired (another source, or below batch concurrency): ignored
            measurement("A100-SXM4-80GB", 99.0, source="s3"),
            measurement("H100-SXM-80GB", 5.0, concurrency=1), measurement("A100-SXM4-80GB", 50.0, concurrency=1)]
    speed = ServingSpeed(rows)
    assert speed.ratio("A100-SXM4-80GB") == pytest.approx(1.7)  # median of 1.6 and 1.8
    assert speed.pairs == {"A100-SXM4-80GB": 2}
    assert speed.seconds(serve(), 100.0, "A100-SXM4-80GB") == pytest.approx(170.0)
    assert speed.seconds(serve(), 100.0, "H100-SXM-80GB") == pytest.approx(100.0)
    # Interactive serving runs its lifetime, training is TrainingSpeed's, no GPU keeps the trace.
    assert speed.seconds(serve(latency="interactive"), 100.0, "A100-SXM4-80GB") == 100.0
    assert speed.seconds(train(), 100.0, "A100-SXM4-80GB") == 100.0
    assert speed.seconds(serve(), 100.0, None) == 100.0


def test_a_gpu_without_pairs_is_scaled_by_datasheet_bandwidth_and_reported() -> None:
    speed = ServingSpeed([measurement("H100-SXM-80GB", 10.0)])
    assert speed.ratio("L4") == pytest.approx(3.35 / 0.3, rel=1e-3) and "L4" in speed.scaled


def test_the_packaged_corpus_pairs_a100_with_h100_and_finds_it_slower() -> None:
    speed = ServingSpeed.load()
    assert speed.pairs["A100-SXM4-80GB"] >= 10 and 1.2 < speed.ratio("A100-SXM4-80GB") < 2.5
    assert "A100-SXM4-80GB" not in speed.scaled


def test_interactive_serving_is_judged_by_the_measured_time_for_its_size() -> None:
    rows = [measurement("A100-SXM4-80GB", 8.0, concurrency=1, params="7B"),
            measurement("A100-SXM4-80GB", 20.0, concurrency=1, params="70B"),
            measurement("A100-SXM4-80GB", 99.0, concurrency=8, params="7B")]  # batched: not a judge
    judge = ServingJudge(rows)
    spec = parse_workload(serve("7B", latency="interactive"))
    assert judge.judge(spec, "A100-SXM4-80GB") == Judged(8.0, "measured")
    mid = judge.judge(parse_workload(serve("20B", latency="interactive")), "A100-SXM4-80GB")
    assert mid is not None and mid.how == "interpolated" and 8.0 < mid.ms_per_token < 20.0
    assert judge.judge(parse_workload(serve("1B")), "A100-SXM4-80GB") == Judged(8.0, "bounded")
    assert judge.judge(parse_workload(serve("140B")), "A100-SXM4-80GB") == Judged(40.0, "scaled")
    # Another GPU, another GPU count or another weight width: not judged.
    assert judge.judge(spec, "H100-SXM-80GB") is None
    assert judge.judge(parse_workload(serve("7B", gpus=2)), "A100-SXM4-80GB") is None
    assert judge.judge(parse_workload(serve("7B", precision="bf16")), "A100-SXM4-80GB") is None


# ----- inputs over the data path -----------------------------------------------------------------

def _node(name: str, leaf: str, zone: str) -> dict[str, object]:
    return node_object(name, gpus=8, product="NVIDIA-H100-80GB-HBM3", labels={
        "fabric.topograph.run/tier-0": leaf, "topology.kubernetes.io/zone": zone})


class _P:
    def __init__(self, manifest: dict[str, object], duration: float = 100.0) -> None:
        self.manifest, self.duration = manifest, duration


def test_a_consumer_reads_its_input_over_the_path_to_where_its_producer_ran() -> None:
    nodes = [_node("a", "l1", "z1"), _node("b", "l1", "z1"), _node("c", "l2", "z2")]
    gang = [_P(pod_object(f"g-{i}", stage="pretraining", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "g"}))
            for i in range(2)]
    sft = _P(pod_object("sft", stage="alignment", gpus=8, annotations={
        "llm-placement.io/depends-on": "g", "llm-placement.io/input-data-gb": "100",
        "llm-placement.io/model-params": SEVEN_B}))
    inputs = Inputs(nodes, [*gang, sft])
    path = inputs.path
    local, leaf, cross = (path.seconds_per_gb(t) for t in ("same-node", "same-leaf", "cross-zone"))
    # The gang's two members ran on a and b: half the data is local to a, half one leaf hop away.
    where = {"g-0": "a", "g-1": "b"}
    reads = inputs.reads(sft.manifest, "a", where)
    assert {t: r.gb for t, r in reads.items()} == {"same-node": 50.0, "same-leaf": 50.0}
    assert inputs.seconds(sft.manifest, "a", where) == pytest.approx(50 * local + 50 * leaf)  # leaf: hop + local read
    # From another zone every share crosses zones: slower, by the stated bandwidths.
    assert inputs.seconds(sft.manifest, "c", where) == pytest.approx(100 * cross)
    assert inputs.seconds(sft.manifest, "c", where) > inputs.seconds(sft.manifest, "a", where)
    # A producer never placed costs nothing; a pod without inputs reads nothing.
    assert inputs.seconds(sft.manifest, "a", {}) == 0.0
    assert inputs.reads(gang[0].manifest, "a", where) == {}
    # The run time adds the read to the compute on the GPU the pod got.
    runtime = PodRuntime(nodes, [*gang, sft])
    assert runtime(sft, "c", where) == pytest.approx(100.0 + 100 * cross)
    assert PodRuntime(nodes)(sft, "c", where) == pytest.approx(100.0)  # without the trace: compute only


# ----- every GPU has a run time, and the result says which ran at a fallback speed ----------------

def test_the_speed_model_covers_every_catalogued_gpu() -> None:
    from app.base.catalog import default_catalog

    training, serving = TrainingSpeed.load(), ServingSpeed.load()
    nodes = [node_object(f"n{i}", gpus=8, product=g.aliases[0]) for i, g in enumerate(default_catalog())]
    facts = PodRuntime(nodes, training=training, serving=serving).facts()
    assert set(facts) == {g.name for g in default_catalog()}
    for gpu, f in facts.items():
        assert f["training_time_ratio"] > 0 and f["batch_serving_time_ratio"] > 0, gpu
        assert (f["training_from"] == "measured") == (gpu in training.curves), gpu


class _Run:
    def __init__(self, manifest: dict[str, object], duration: float) -> None:
        self.manifest, self.duration = manifest, duration


def test_an_uncatalogued_gpu_runs_at_its_declared_speed_and_is_named_as_a_fallback() -> None:
    fast = node_object("x", gpus=8, product="Anon-Accelerator-X",
                       annotations={"llm-placement.io/gpu-bf16-tflops": "1978"})  # 2 x the H100's 989
    rt = PodRuntime([fast, node_object("h", gpus=8, product="NVIDIA-H100-80GB-HBM3")])
    assert rt(_Run(train(), 1000.0), "x", {}) == pytest.approx(500.0)  # credited, not just charged
    assert rt.fallback_used == {"Anon-Accelerator-X": "declared"}
    assert rt(_Run(train(), 1000.0), "h", {}) == pytest.approx(1000.0)  # measured: not a fallback
    assert rt.fallback_used == {"Anon-Accelerator-X": "declared"}
    assert rt.facts()["Anon-Accelerator-X"]["training_time_ratio"] == pytest.approx(0.5)


def test_an_uncatalogued_gpu_with_nothing_declared_runs_at_the_reference_speed_and_says_so() -> None:
    rt = PodRuntime([node_object("x", gpus=8, product="Anon-Accelerator-X")])
    assert rt(_Run(train(), 1000.0), "x", {}) == 1000.0
    assert rt.fallback_used == {"Anon-Accelerator-X": "none"}
    assert "fallback" in rt.facts()["Anon-Accelerator-X"]["training_from"]


def test_a_datasheet_scaled_gpu_a_pod_ran_on_is_named_as_a_fallback() -> None:
    rt = PodRuntime([node_object("l", gpus=8, product="NVIDIA-L40S")])
    assert rt(_Run(train(), 1000.0), "l", {}) > 1000.0
    assert rt.fallback_used == {"L40S": "datasheet"}
