"""The annotation contract has one source: the parser's ANNOTATION_KEYS, checked against the parser
itself, docs/annotations.md and the README table (docs/annotations.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from app.base import workload
from app.base.workload import ANNOTATION_KEYS, PREFIX, WorkloadError, parse_workload

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs"

# A valid value per key, and the WorkloadSpec field it must change.
SAMPLES: dict[str, tuple[str, str]] = {
    "stage": ("serving", "stage"),
    "model-params": ("7B", "model_params"),
    "precision": ("fp8", "precision"),
    "precision-fallback": ("int8,int4", "precision_fallback"),
    "context-tokens": ("2048", "context_tokens"),
    "concurrency": ("3", "concurrency"),
    "kv-cache-gb": ("2.5", "kv_cache_gb"),
    "latency-class": ("batch", "latency_class"),
    "max-ms-per-token": ("20", "max_ms_per_token"),
    "gpu-preference": ("H100,A100", "gpu_preference"),
    "topology-required-placement": ("nvidia.com/gpu.clique", "topology_required"),
    "topology-preferred-placement": ("fabric.topograph.run/tier-0", "topology_preferred"),
    "depends-on": ("producer", "depends_on"),
    "input-data-gb": ("40", "input_data_gb"),
    "colocation": ("nvlink", "colocation_required"),
    "gang-name": ("g", "gang"),
    "gang-size": ("4", "gang"),
    "finetune-method": ("qlora", "finetune_method"),
    "trainable-params": ("40M", "trainable_params"),
    "active-params": ("1B", "active_params"),
    "serving-role": ("prefill", "serving_role"),
    "serving-engine": ("vllm/0.11.0", "serving_engine"),
    "prompt-tokens": ("2000", "prompt_tokens"),
    "max-ttft-ms": ("500", "max_ttft_ms"),
    "serving-group": ("chat-70b", "serving_group"),
    "model": ("llama-3.1-8b", "model"),
}


def _pod(annotations: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "labels": labels or {},
                         "annotations": {PREFIX + k: v for k, v in annotations.items()}},
            "spec": {"containers": [{"name": "c"}]}}


def test_every_listed_key_is_read_by_the_parser() -> None:
    assert set(SAMPLES) == set(ANNOTATION_KEYS), "add a sample for each key in ANNOTATION_KEYS"
    assert len(set(ANNOTATION_KEYS)) == len(ANNOTATION_KEYS)
    base = parse_workload(_pod({}))
    for key, (value, field) in SAMPLES.items():
        if key == "gang-name":
            # gang-name alone is an error (no size); with a size it names the gang.
            with pytest.raises(WorkloadError, match="gang-size is missing"):
                parse_workload(_pod({key: value}))
            spec = parse_workload(_pod({key: value, "gang-size": "4"}))
        elif key == "gang-size":
            # The size is read for any gang convention; here the scheduler-plugins label.
            spec = parse_workload(_pod({key: value}, {"scheduling.x-k8s.io/pod-group": "g"}))
            assert spec.gang is not None and spec.gang.size == 4
            continue
        elif key in ("trainable-params", "active-params"):
            # Parts of the model: meaningful only with the total it is a part of.
            with pytest.raises(WorkloadError, match="model-params is missing"):
                parse_workload(_pod({key: value}))
            spec = parse_workload(_pod({key: value, "model-params": "7B"}))
        else:
            spec = parse_workload(_pod({key: value}))
        assert getattr(spec, field) != getattr(base, field), f"{key} did not change {field}"


def test_the_parser_reads_no_key_outside_the_list() -> None:
    # Annotation keys appear in the parser as the ANNOTATIONS table, get("k") and PREFIX + "k"; every
    # one must be in ANNOTATION_KEYS, and every key there must be read.
    source = Path(workload.__file__).read_text()
    body = source.split("def gang_of", 1)[1]
    read = {a.key for a in workload.ANNOTATIONS}
    read |= set(re.findall(r'(?<![.\w])get\("([a-z][a-z-]+)"', body))
    read |= set(re.findall(r'PREFIX \+ "([a-z-]+)"', body))
    assert read, "the pattern no longer matches the parser; update this test"
    assert read == set(ANNOTATION_KEYS)


def _table_keys(markdown: str, heading: str) -> set[str]:
    """Backticked names in the first column of the first table under ``heading``."""
    section = markdown.split(heading, 1)[1]
    keys: set[str] = set()
    in_table = False
    for line in section.splitlines():
        if line.startswith("|"):
            in_table = True
            first = line.split("|")[1]
            if set(first.strip()) <= {"-", " "} or first.strip() == "key":
                continue
            keys |= set(re.findall(r"`([a-z-]+)`", first))
        elif in_table:
            break
    return keys


def test_docs_annotation_table_matches_the_parser() -> None:
    text = (DOCS / "annotations.md").read_text()
    assert _table_keys(text, "## Keys the extender reads") == set(ANNOTATION_KEYS)


def test_readme_annotation_table_matches_the_parser() -> None:
    text = (REPO / "README.md").read_text()
    assert _table_keys(text, "## Pod annotations") == set(ANNOTATION_KEYS)


def test_docs_cite_nothing_outside_the_repository() -> None:
    for page in DOCS.glob("*.md"):
        text = page.read_text()
        for bad in ("DESIGN", "../shared", "shared/", "§"):
            assert bad not in text, f"{page.name} refers to {bad!r}"
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if "://" not in target:
                assert (page.parent / target).exists() or target == "scoring.md", \
                    f"{page.name} links to missing {target}"
