"""Run times of replayed training pods from measured throughput (tests/integration/harness/runtime.py)."""

from __future__ import annotations

import pytest

from app.objects import node_object, pod_object
from tests.integration.harness.runtime import TrainingSpeed, node_gpus

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
