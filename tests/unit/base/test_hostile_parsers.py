"""Hostile and careless values at the parsing edge: each is rejected with a clear message, never a crash.

Covers infinities and absurd magnitudes the API server stores verbatim ("1e400"), wrong JSON types in
a pod, unbounded lists in annotations, and typos in annotation keys (docs/annotations.md).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.base.units import (
    parse_bandwidth_tbs,
    parse_money,
    parse_param_count,
    parse_positive_int,
    parse_positive_number,
    parse_quantity,
)
from app.base.workload import (
    MAX_LIST_ITEMS,
    PREFIX,
    WorkloadError,
    parse_workload,
    pod_resources,
    unknown_keys,
)

GPU = ("nvidia.com/gpu",)


def gpu_pod(qty: Any, where: str = "requests", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "a", "uid": "u1", **meta},
        "spec": {"containers": [{"resources": {where: {"nvidia.com/gpu": qty}}}]},
    }


@pytest.mark.parametrize("text", ["1e400", "1e19", "9" * 400, "1e308Ei", "1e300k"])
def test_quantity_infinite_or_absurd_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="larger than 2\\^63"):
        parse_quantity(text)


@pytest.mark.parametrize("where", ["requests", "limits"])
def test_poison_gpu_quantity_is_a_problem_not_an_overflow(where: str) -> None:
    # round(inf) raised OverflowError, which no caller expected.
    with pytest.raises(ValueError):
        pod_resources(gpu_pod("1e400", where), GPU)
    with pytest.raises(WorkloadError) as exc:
        parse_workload(gpu_pod("1e400", where), GPU)
    assert any("1e400" in p for p in exc.value.problems)


@pytest.mark.parametrize(("fn", "text"), [
    (parse_param_count, "9" * 400 + "T"),
    (lambda t: parse_positive_number("kv-cache-gb", t), "9" * 400),
    (lambda t: parse_positive_number("kv-cache-gb", t), "inf"),
    (lambda t: parse_positive_number("kv-cache-gb", t), "1e300"),
    (lambda t: parse_positive_int("gang-size", t), "9" * 5000),
    (lambda t: parse_positive_int("gang-size", t), "1_000"),
    (parse_bandwidth_tbs, "9" * 400),
    (parse_money, "9" * 400),
])
def test_numbers_reject_infinity_and_absurd_magnitudes(fn: Any, text: str) -> None:
    with pytest.raises(ValueError) as exc:
        fn(text)
    # The bad value is quoted back, but cut short: an event must stay one readable line.
    assert len(str(exc.value)) < 200


def test_huge_model_params_is_rejected_not_inf() -> None:
    with pytest.raises(WorkloadError) as exc:
        parse_workload({"metadata": {"annotations": {PREFIX + "model-params": "9" * 400 + "B"}}})
    assert "infT" not in str(exc.value) and "model-params" in str(exc.value)


@pytest.mark.parametrize("pod", [
    {"metadata": {"annotations": "x"}},
    {"metadata": {"annotations": ["x"]}},
    {"metadata": {"labels": 7}},
    {"metadata": {"annotations": {PREFIX + "stage": {"nested": [1, 2]}}}},
    {"metadata": {"name": {"a": 1}}},
    {"spec": {"containers": "x"}},
    {"spec": {"containers": [7]}},
    {"spec": {"containers": [{"resources": "x"}]}},
    {"spec": {"containers": [{"resources": {"requests": [1]}}]}},
    {"spec": {"initContainers": {"a": 1}}},
    {"spec": {"priority": 1e30}},
    {"spec": {"priority": "high"}, "metadata": {"annotations": {PREFIX + "gang-size": 3}}},
])
def test_wrong_types_only_raise_workload_error(pod: dict[str, Any]) -> None:
    try:
        spec = parse_workload(pod, GPU)
    except WorkloadError as exc:
        assert exc.problems and all(len(p) < 300 for p in exc.problems)
    else:
        assert spec.priority == 0


def test_depends_on_is_bounded_with_a_clear_message() -> None:
    ok = ",".join(f"p{i}" for i in range(MAX_LIST_ITEMS))
    assert len(parse_workload({"metadata": {"annotations": {PREFIX + "depends-on": ok}}}).depends_on) == 256
    huge = ",".join(f"producer-{i}" for i in range(36_000))  # ~400 KB
    t0 = time.perf_counter()
    with pytest.raises(WorkloadError) as exc:
        parse_workload({"metadata": {"annotations": {PREFIX + "depends-on": huge}}})
    assert time.perf_counter() - t0 < 0.5
    assert f"more than {MAX_LIST_ITEMS}" in str(exc.value)
    with pytest.raises(WorkloadError, match="longer than"):
        parse_workload({"metadata": {"annotations": {PREFIX + "gpu-preference": "x" * 5000}}})


def test_unknown_keys_name_the_nearest_known_key() -> None:
    ann = {PREFIX + "model-param": "7B", PREFIX + "stage": "serving", PREFIX + "gang-plan": "",
           PREFIX + "zzzzzz": "1", "other.io/model-param": "x"}
    assert unknown_keys(ann) == [("model-param", "model-params"), ("zzzzzz", None)]
    assert unknown_keys("not a dict") == []


# Every annotation that holds a number, with a valid value of its shape (docs/annotations.md, "Numbers").
NUMERIC = {
    "model-params": "70B", "trainable-params": "1B", "active-params": "7B", "context-tokens": "4096",
    "concurrency": "8", "prompt-tokens": "512", "gang-size": "2", "kv-cache-gb": "1.5",
    "input-data-gb": "20", "max-ms-per-token": "25.5", "max-ttft-ms": "1000",
}
WHOLE = {"context-tokens", "concurrency", "prompt-tokens", "gang-size"}
PARAMS = {"model-params", "trainable-params", "active-params"}


def numeric_pod(**override: str) -> dict[str, Any]:
    ann = {PREFIX + k: v for k, v in {**NUMERIC, "gang-name": "g", "stage": "serving", **override}.items()}
    return {"metadata": {"name": "p", "namespace": "a", "annotations": ann}, "spec": {}}


def test_every_numeric_annotation_goes_through_the_one_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.base import units

    seen: list[str] = []
    real = units.parse_number

    def spy(key: str, text: object, **kw: Any) -> float:
        seen.append(key)
        return real(key, text, **kw)

    monkeypatch.setattr(units, "parse_number", spy)
    parse_workload(numeric_pod())
    assert sorted(set(seen)) == sorted(NUMERIC)


def shaped(key: str, digits: str) -> str:
    return digits + "B" if key in PARAMS else digits


# Python's int() and float() read all of these; users and kubectl do not mean them as numbers.
HOSTILE = ["1_000", "\uff17\uff10", "\u0667", "\u0967\u0966", "\u00bd", "\u2460", "0x10", "1,000", "1 000",
           "inf", "nan", "Infinity", ".5", "5.", "\u200b5", "5\u200b"]


@pytest.mark.parametrize("key", sorted(NUMERIC))
@pytest.mark.parametrize("digits", HOSTILE)
def test_numbers_are_ascii_digits_only_for_every_annotation(key: str, digits: str) -> None:
    with pytest.raises(WorkloadError) as exc:
        parse_workload(numeric_pod(**{key: shaped(key, digits)}))
    assert any(p.key == key for p in exc.value.problems), exc.value.problems


@pytest.mark.parametrize("key", sorted(NUMERIC))
def test_an_exponent_only_where_it_means_something(key: str) -> None:
    # A plain decimal may say 1.5e3; a whole count or a value with a unit suffix may not.
    text = shaped(key, "1e0")
    if key in WHOLE or key in PARAMS:
        with pytest.raises(WorkloadError):
            parse_workload(numeric_pod(**{key: text}))
    else:
        parse_workload(numeric_pod(**{key: text}))


def test_the_brief_examples() -> None:
    for key, value in (("max-ttft-ms", "1_000"), ("model-params", "\uff170B"), ("model-params", "\uff170")):
        with pytest.raises(WorkloadError, match=key):
            parse_workload(numeric_pod(**{key: value}))
    spec = parse_workload(numeric_pod(**{"max-ttft-ms": "1000", "model-params": "70 B"}))
    assert spec.max_ttft_ms == 1000 and spec.model_params == 70e9
