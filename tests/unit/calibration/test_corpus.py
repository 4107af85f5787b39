"""Measurement files: a bad one is refused naming the file, the row and the field."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from app.base.model_registry import ModelRegistry
from app.calibration.corpus import CorpusError, load, load_file

REGISTRY = ModelRegistry.from_data({"models": [{
    "name": "toy-7b", "params": "7B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
    "head_dim": 128, "source": "synthetic"}]})

GOOD_POINT = {
    "locator": "table 1, row 1", "engine": "vllm", "engine_version": "0.6.0", "model": "toy-7b",
    "precision": "bf16", "gpu": "H100-SXM-80GB", "gpus": 1, "tp": 1, "concurrency": 1,
    "input_tokens": 1000, "output_tokens": 100, "tpot_ms": 7.5, "tpot_stat": "mean", "ttft_ms": 40.0,
}
DROP = object()
SOURCE = {"id": "toy", "title": "Toy", "url": "https://example.org/toy", "publisher": "x", "kind": "paper"}


def text_of(*points: dict[str, object]) -> str:
    return yaml.safe_dump({"source": SOURCE, "points": list(points)})


def test_a_good_file_loads_with_its_model_facts() -> None:
    rows = load_file("toy.yaml", text=text_of(GOOD_POINT), registry=REGISTRY)
    assert len(rows) == 1 and rows[0].params == 7e9 and rows[0].arch is not None
    assert rows[0].gpu.name == "H100-SXM-80GB" and not rows[0].moe


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"gpus": DROP}, "gpus", "Field required"),
    ({"tpot_ms": "18 ms"}, "tpot_ms", "valid number"),
    ({"tpot_ms": -3}, "tpot_ms", "greater than 0"),
    ({"ttft_ms": float("nan")}, "ttft_ms", "finite"),
    ({"precision": "int3"}, "precision", "bf16"),
    ({"gpu": "RTX-9090"}, "gpu", "not in the GPU catalog"),
    ({"model": "toy-8b"}, "model", "nearest: toy-7b"),
    ({"tpot_ms": None, "ttft_ms": None}, "?", "give tpot_ms or ttft_ms"),
    ({"seconds_per_token": 0.01}, "seconds_per_token", "Extra inputs"),
    ({"arrival": "staggered"}, "?", "arrival: staggered needs requests"),
    ({"arrival": "staggered", "concurrency": 8, "requests": 4}, "?", "at least concurrency"),
    ({"arrival": "drifting"}, "arrival", "'together' or 'staggered'"),
])
def test_a_bad_row_is_refused_with_row_and_field(change: dict[str, object], field: str, words: str) -> None:
    bad = {k: v for k, v in {**GOOD_POINT, **change}.items() if v is not DROP}
    with pytest.raises(CorpusError) as err:
        load_file("toy.yaml", text=text_of(GOOD_POINT, bad), registry=REGISTRY)
    message = str(err.value)
    assert message.startswith("toy.yaml: point #2")
    if field != "?":
        assert f"'{field}'" in message
    assert words in message


def test_aliases_are_refused_so_a_small_file_cannot_expand() -> None:
    bomb = "source: &s {id: a, title: b, url: c}\npoints: [*s, *s]\n"
    with pytest.raises(CorpusError, match=r"aliases \(\*s\) are not accepted"):
        load_file("bomb.yaml", text=bomb, registry=REGISTRY)


def test_a_source_id_used_by_two_files_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text(text_of({**GOOD_POINT, "model_params": "7B", "model": "other"}))
    with pytest.raises(CorpusError, match="also used by"):
        load([tmp_path])


def test_calibrate_refuses_a_bad_file_with_exit_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from app.cli import cli

    bad = tmp_path / "bad.yaml"
    bad.write_text(text_of({**GOOD_POINT, "model_params": "7B", "model": "x", "gpu": "nope"}))
    result = CliRunner().invoke(cli, ["calibrate", str(bad)])
    assert result.exit_code == 2
    assert "point #1: field 'gpu'" in result.output


def test_staggered_arrival_is_the_first_rounds_share_of_the_measured_requests() -> None:
    point = {**GOOD_POINT, "concurrency": 8, "arrival": "staggered", "requests": 80}
    staggered = load_file("toy.yaml", text=text_of(point), registry=REGISTRY)[0].case()
    together = load_file("toy.yaml", text=text_of({**point, "arrival": "together"}), registry=REGISTRY)[0].case()
    assert staggered.together_share == pytest.approx(0.1) and together.together_share == 1.0


def test_the_static_batches_of_the_tensorrt_llm_table_fit_with_their_recorded_kv_cache() -> None:
    """A fixed-batch benchmark holds every sequence's whole KV cache, so each row's batch, at the KV
    precision the corpus records for it, plus the weights fit on its GPUs: the table's fp8 rows at
    batch 64 fit only with an 8-bit cache (their file's notes), which halves the KV read the model
    charges per decode step."""
    from app.calibration.corpus import packaged

    rows = [r for r in packaged() if r.source.id == "nvidia-dli-trtllm-0.9.0-benchmarks"]
    assert rows
    for r in rows:
        p = r.point
        assert r.arch is not None
        kv_bytes = r.arch.kv_bytes_per_token() * r.case().kv_bytes_per_value / 2.0
        need = (r.params * p.precision.bytes_per_param + p.concurrency * (p.input_tokens + p.output_tokens)
                * kv_bytes) / p.gpus / 1e9
        assert need <= r.gpu.memory_gb, (p.locator, round(need), r.gpu.memory_gb)
    assert any(r.point.kv_precision == "fp8" and r.point.concurrency == 64 for r in rows)
