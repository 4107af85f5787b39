"""The pod guard's never-fits rule (helm/llm-placement/files/pod-guard-policy.yaml) reads the pod as
the extender does, or not at all: whatever it reads, the extender reads the same, so it can only
refuse a pod the extender would refuse on every node (docs/gangs.md, "Refused at admission"). The
rule's behaviour on the real API server: tests/integration/test_pod_guard.py."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from app.base.catalog import GpuCatalog
from app.base.units import MAX_PARAMS, parse_param_count
from app.base.workload import CPU_STAGES, STAGE_ALIASES, Precision, WorkloadError, parse_workload
from app.serving.sizing import NF4_BYTES_PER_PARAM, size

CHART = Path(__file__).resolve().parents[3] / "helm" / "llm-placement"
POLICY: dict[str, Any] = yaml.safe_load((CHART / "files" / "pod-guard-policy.yaml").read_text())
VARIABLES = {v["name"]: v["expression"] for v in POLICY["variables"]}
PARAMS_RE = re.search(r"matches\('([^']+)'\)", VARIABLES["params"]).group(1)  # type: ignore[union-attr]
SCALE = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def largest_catalog_gb() -> float:
    """GB per GPU as the extender reads a catalog GPU (app/snapshot/nodes.py: driver MiB first)."""
    return max(g.memory_mib * 1.048576 / 1000.0 if g.memory_mib else g.memory_gb for g in GpuCatalog.load())


def test_the_largest_gpu_is_the_catalogs_in_the_policy_and_the_chart_values() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    default = values["podGuard"]["largestGpuMemoryGB"]
    assert default == math.ceil(largest_catalog_gb())
    assert VARIABLES["largestGpuGB"] == f"double({default})"


def test_the_gpu_stages_are_every_stage_name_but_the_cpu_stages() -> None:
    listed = set(re.findall(r"'([a-z-]*)'", VARIABLES["gpuStage"].split(" in ", 1)[1]))
    expected = {name for name, stage in STAGE_ALIASES.items() if stage not in CPU_STAGES} | {""}
    assert listed == expected


def test_bytes_per_parameter_are_the_extenders_or_fewer() -> None:
    table = dict(re.findall(r"'([a-z0-9]*)': ([0-9.]+)", VARIABLES["bytesPerParam"]))
    for precision in Precision:
        assert float(table[precision.value]) == precision.bytes_per_param
    assert float(table["int4"]) <= NF4_BYTES_PER_PARAM  # what QLoRA is read as
    # Every name the precision chain tests is a precision or the QLoRA method.
    named = set(re.findall(r"contains\('([a-z0-9]+)'\)", VARIABLES["smallest"]))
    assert named == {p.value for p in Precision} | {"qlora"}


def cel_params(text: str) -> float:
    """What the policy computes from model-params (0: not read)."""
    mp = text.strip()
    if not re.fullmatch(PARAMS_RE, mp):
        return 0.0
    number = re.search(r"[0-9]+([.][0-9]+)?", mp).group(0)  # type: ignore[union-attr]
    return float(number) * SCALE[mp[-1].lower()]


@pytest.mark.parametrize(("text", "value"), [
    ("405B", 405e9), ("405 b", 405e9), (" +1.5T ", 1.5e12), ("70.6B", 70.6e9), ("500M", 500e6),
    ("7k", 7e3), ("405", 0.0), ("4.05e2B", 0.0), ("-405B", 0.0), ("405GB", 0.0), ("405  B", 0.0),
    ("\uff11B", 0.0), ("1_000B", 0.0), ("", 0.0), ("1234567890123B", 0.0),
])
def test_model_params_read_by_the_policy(text: str, value: float) -> None:
    assert cel_params(text) == pytest.approx(value)


@given(st.one_of(st.from_regex(PARAMS_RE, fullmatch=True),
                 st.text(alphabet="0123456789.+-eE kKmMbBtTG_", max_size=20)))
def test_what_the_policy_reads_the_extender_reads_the_same(text: str) -> None:
    read = cel_params(text)
    if read == 0.0:
        return  # not read: the rule lets the pod through
    if read > MAX_PARAMS:  # the extender refuses it as no real model: it can never be placed either
        with pytest.raises(ValueError, match="is larger than"):
            parse_param_count(text)
        return
    assert parse_param_count(text) == pytest.approx(read, rel=1e-12)


# --- The whole rule against the extender's own sizing --------------------------------------------

def policy_refuses(ann: dict[str, str], gpus: int, largest_gb: float) -> bool:
    """The never-fits rule as the policy file states it, for a plain pod (no gang, no claims, not
    bound) with ``gpus`` nvidia.com/gpu: the same reading as the CEL above, step by step."""
    def get(key: str) -> str:
        return ann.get("llm-placement.io/" + key, "")
    precision = get("precision") if get("precision").strip() else "bf16"
    chain = f"{precision},{get('precision-fallback')},{get('finetune-method')}".lower()
    smallest = next((p for p, words in (("int4", ("int4", "qlora")), ("fp8", ("fp8",)), ("int8", ("int8",)),
                                        ("bf16", ("bf16",)), ("fp16", ("fp16",)), ("fp32", ("fp32",)))
                     if any(w in chain for w in words)), "")
    table = dict(re.findall(r"'([a-z0-9]*)': ([0-9.]+)", VARIABLES["bytesPerParam"]))
    stages = set(re.findall(r"'([a-z-]*)'", VARIABLES["gpuStage"].split(" in ", 1)[1]))
    if get("stage").strip().lower() not in stages or gpus <= 0:
        return False
    return cel_params(get("model-params")) * float(table[smallest]) / 1e9 > gpus * largest_gb


_PRECISION_WORDS = st.sampled_from([p.value for p in Precision] + ["FP8", "Int4", "BF16"])


# Correctness, not speed: a loaded machine must not fail it on hypothesis's 200 ms deadline.
@settings(deadline=None)
@given(
    params=st.one_of(st.from_regex(r"[1-9][0-9]{0,3}(\.[0-9])? ?[MBT]", fullmatch=True),
                     st.sampled_from(["405B", "1.5T", "70B", "671B", "96B", "100B"])),
    gpus=st.integers(1, 16),
    precision=st.none() | _PRECISION_WORDS,
    fallback=st.lists(_PRECISION_WORDS, max_size=3),
    stage=st.none() | st.sampled_from(sorted(STAGE_ALIASES)),
    method=st.none() | st.sampled_from(["full", "lora", "qlora"]),
)
def test_a_pod_the_rule_refuses_fits_no_gpu_of_the_catalog(
        params: str, gpus: int, precision: str | None, fallback: list[str], stage: str | None,
        method: str | None) -> None:
    """Widen, never narrow: whatever the rule refuses needs, at every precision the pod allows,
    more memory per GPU than the largest catalog GPU has, by the extender's own sizing (or the
    extender refuses the pod's annotations outright)."""
    ann = {"llm-placement.io/model-params": params}
    for key, value in (("precision", precision), ("stage", stage), ("finetune-method", method),
                       ("precision-fallback", ",".join(fallback) or None)):
        if value is not None:
            ann["llm-placement.io/" + key] = value
    largest = largest_catalog_gb()
    if not policy_refuses(ann, gpus, math.ceil(largest)):
        return
    pod = {"metadata": {"name": "p", "namespace": "t", "annotations": ann},
           "spec": {"containers": [{"name": "c", "resources": {
               "requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}}]}}
    try:
        spec = parse_workload(pod)
    except WorkloadError:
        return  # refused by the extender at every filter: never placed either
    for p in spec.precisions:
        need = size(spec, p, default_context=1, default_concurrency=1).per_gpu_gb
        assert need > largest, (ann, gpus, p, need)


def test_the_rule_refuses_what_it_should() -> None:
    # The property above is empty if the rule never refuses: the 405B bf16 pod on one GPU.
    assert policy_refuses({"llm-placement.io/model-params": "405B"}, 1, 193)
    assert not policy_refuses({"llm-placement.io/model-params": "405B"}, 5, 193)
    assert not policy_refuses({"llm-placement.io/model-params": "405B",
                               "llm-placement.io/stage": "deployment"}, 1, 193)
