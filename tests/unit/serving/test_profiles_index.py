"""The profiles file at scale and under mistakes: unknown GPUs and conflicting duplicates are refused
at load naming the entry, and matching is an index lookup, not a scan (bench/profiles_index.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.base.catalog import default_catalog
from app.base.workload import Precision, WorkloadSpec
from app.serving import profiles
from app.serving.profiles import Profile, ProfileBook, ProfileError, same_slot

L4 = {"model": "chat-8b", "model_params": "8B", "gpu": "L4", "precision": "int8", "ms_per_token": 30.0}


def book(*items: dict[str, Any]) -> ProfileBook:
    return ProfileBook.from_data({"profiles": list(items)}, "p.yaml")


def test_an_unknown_gpu_is_refused_naming_the_entry() -> None:
    with pytest.raises(ProfileError) as exc:
        book(L4, {**L4, "model": "typo", "gpu": "H1OO"})
    assert "entry #2 (typo): gpu 'H1OO' is not in the GPU catalog" in str(exc.value)


@pytest.mark.parametrize("other", [
    {**L4, "model": "again", "ms_per_token": 31.0},  # same entry, other figure
    {**L4, "model": "again", "gpu": "NVIDIA-L4", "max_concurrency": 4},  # an alias is the same GPU
    {**L4, "model": "again", "model_params": "8.1B", "ms_per_token": 29.0},  # a pod at 8.05B matches both
])
def test_conflicting_duplicates_are_refused_naming_both(other: dict[str, Any]) -> None:
    with pytest.raises(ProfileError) as exc:
        book(L4, {**L4, "model": "other-gpu", "gpu": "T4"}, other)
    text = str(exc.value)
    assert "entry #3 (again)" in text and "entry #1 (chat-8b)" in text and "keep one" in text


def test_the_same_measurement_twice_and_distinct_entries_load() -> None:
    b = book(L4, {**L4, "model": "copy"}, {**L4, "precision": "fp8", "ms_per_token": 20.0},
             {**L4, "gpus": 2, "ms_per_token": 18.0}, {**L4, "model_params": "8.5B", "ms_per_token": 32.0},
             {**L4, "active_params": "1B", "ms_per_token": 9.0})
    l4 = default_catalog().lookup("L4")
    assert l4 is not None
    spec = WorkloadSpec(namespace="a", name="p", gpus=1, model_params=8.03e9)
    hit = b.match(spec, l4, Precision.INT8)
    assert hit is not None and hit.model == "chat-8b"  # the file's first of two equal entries


def test_match_reads_a_few_entries_not_the_whole_file(monkeypatch: pytest.MonkeyPatch) -> None:
    many = [{**L4, "model": f"m{i}", "model_params": f"{1.03 ** i:.6f}B"} for i in range(500)]
    b = book(*many)
    calls = 0
    real = profiles._close

    def counting(a: float | None, c: float | None) -> bool:
        nonlocal calls
        calls += 1
        return real(a, c)

    monkeypatch.setattr(profiles, "_close", counting)
    l4 = default_catalog().lookup("L4")
    assert l4 is not None
    spec = WorkloadSpec(namespace="a", name="p", gpus=1, model_params=1.03 ** 250 * 1e9)
    hit = b.match(spec, l4, Precision.INT8)
    assert hit is not None and hit.model == "m250"
    assert calls <= 10


GPUS = ["L4", "T4", "H100-SXM-80GB"]


def catalog_name(gpu: str) -> str | None:
    spec = default_catalog().lookup(gpu)
    return spec.name if spec is not None else None


def brute(entries: tuple[Profile, ...], spec: WorkloadSpec, gpu: str, prec: Precision) -> Profile | None:
    """The old linear matcher, as the reference."""
    for p in entries:
        if (p.precision is prec and p.gpus == spec.gpus and catalog_name(p.gpu) == catalog_name(gpu)
                and profiles._close(p.model_params, spec.model_params)
                and profiles._close(p.active_params, spec.active_params)):
            return p
    return None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(GPUS), st.integers(1, 2), st.sampled_from([Precision.INT8, Precision.FP8]),
                          st.floats(1, 100), st.booleans()), max_size=30),
       st.sampled_from(GPUS), st.integers(1, 2), st.sampled_from([Precision.INT8, Precision.FP8]),
       st.floats(1, 100), st.booleans())
def test_the_index_matches_what_a_scan_would(raw: list[Any], gpu: str, gpus: int, prec: Precision,
                                            size: float, moe: bool) -> None:
    items = [{"model": f"e{i}", "model_params": f"{s:.4f}B", "gpu": g, "gpus": n, "precision": p.value,
              "ms_per_token": 10.0, **({"active_params": f"{s / 8:.4f}B"} if m else {})}
             for i, (g, n, p, s, m) in enumerate(raw)]
    b = book(*items)  # equal figures everywhere: overlapping entries are allowed, the first wins
    spec = WorkloadSpec(namespace="a", name="p", gpus=gpus, model_params=size * 1e9,
                        active_params=size * 1e9 / 8 if moe else None)
    target = default_catalog().lookup(gpu)
    assert target is not None
    assert b.match(spec, target, prec) == brute(b.entries, spec, gpu, prec)


def test_same_slot_is_the_rule_import_replaces_by() -> None:
    a, b = Profile.model_validate(L4), Profile.model_validate({**L4, "gpu": "NVIDIA-L4", "model_params": "8.1B"})
    assert same_slot(a, b) and not same_slot(a, b.model_copy(update={"gpus": 2}))
